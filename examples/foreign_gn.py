"""A small "foreign" GroupNorm to try pytest-gn's ``--gn-impl`` on: pure torch, shaped like a tiled
one-pass kernel, with a self-description and a planted overflow bug.

    PYTHONPATH=examples pytest --gn-impl foreign_gn:tiled_group_norm               # passes
    PYTHONPATH=examples pytest --gn-impl foreign_gn:tiled_group_norm_overflow_bug  # overflow cases fail

Both cut each sample's rows (positions, all C channels) into tiles of TILE_ROWS rows, sum every
tile separately (the per-tile partials of a one-pass kernel), then reduce the partials and
normalize. `tiled_group_norm_overflow_bug` behaves like a kernel whose grid holds
`resident_blocks(device)` blocks and which, when the tiles exceed them, loses the last tile's
partial (an overflow tile that never reaches the reduction) while still dividing by the full
count: on the H200, 19 of its 28 overflowing cases fail (every fp32 one; the fp16/bf16 cases
whose single lost tile moves the statistics by less than the half-precision tolerance pass),
and its x1 cases (tiles == resident blocks) pass.

What pytest-gn reads from them (README, "Validating your own GroupNorm"):

- the protocol ``fn(x, num_groups, weight, bias, eps, act) -> y``, differentiable;
- ``fn.gn_describe(shape=, num_groups=, dtype=, direction=, device=)``: the tile height and the
  resident-block count for a shape, so the overflow cases are sized for these tiles (a few
  thousand rows) instead of the conservative 512-row rule (hundreds of millions of elements);
- NotImplementedError, the "not supported" signal: channel counts that are not a multiple of 4
  are refused by the description (those cases are skipped before running), tensors over 2**31
  elements by the call itself (skipped when run).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

TILE_ROWS = 32
BLOCKS_PER_SM = 2


def resident_blocks(device: torch.device) -> int:
    """Blocks the emulated one-pass kernel holds on `device` (CPU: as if 2 SMs)."""
    if device.type == "cuda":
        return BLOCKS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
    return BLOCKS_PER_SM * 2


def _supported(channels: int) -> None:
    if channels % 4:
        raise NotImplementedError(f"foreign_gn needs a channel count that is a multiple of 4, not {channels}")


def _group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    act: str | None,
    drop_last_overflow_tile: bool,
) -> torch.Tensor:
    n, c = x.shape[0], x.shape[1]
    _supported(c)
    if x.numel() > 2**31:
        raise NotImplementedError("foreign_gn handles at most 2**31 elements (32-bit indexing)")
    rows = x.numel() // (n * c)
    xs = x.movedim(1, -1).reshape(n, rows, c).float()  # (N, rows, C): the channels-last view
    tiles = -(-rows // TILE_ROWS)
    tile_of_row = torch.arange(rows, device=x.device) // TILE_ROWS
    partial = xs.new_zeros(n, tiles, c).index_add(1, tile_of_row, xs)  # per-tile sums
    if drop_last_overflow_tile and n * tiles > resident_blocks(x.device):
        keep = torch.ones(n, tiles, 1, device=x.device)
        keep[-1, -1] = 0.0  # PLANTED: the last overflow tile's partial never reaches the reduction
        partial = partial * keep
    d = c // num_groups
    count = rows * d
    mean = partial.sum(1).view(n, num_groups, d).sum(-1) / count  # (N, G)
    centered = xs - mean.repeat_interleave(d, dim=1).unsqueeze(1)
    sq = xs.new_zeros(n, tiles, c).index_add(1, tile_of_row, centered * centered)
    var = sq.sum(1).view(n, num_groups, d).sum(-1) / count
    rstd = torch.rsqrt(var + eps).repeat_interleave(d, dim=1).unsqueeze(1)
    y = centered * rstd
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    if act == "silu":
        y = F.silu(y)
    return y.to(x.dtype).view(n, *x.shape[2:], c).movedim(-1, 1)  # back to x's layout


def tiled_group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    act: str | None = None,
) -> torch.Tensor:
    """GroupNorm (+ SiLU) from per-tile partial sums; correct."""
    return _group_norm(x, num_groups, weight, bias, eps, act, drop_last_overflow_tile=False)


def tiled_group_norm_overflow_bug(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    act: str | None = None,
) -> torch.Tensor:
    """The same with a planted bug: the last tile is lost when the tiles overflow the residency."""
    return _group_norm(x, num_groups, weight, bias, eps, act, drop_last_overflow_tile=True)


def describe(
    *, shape: tuple[int, ...], num_groups: int, dtype: torch.dtype, direction: str, device: torch.device
) -> dict[str, Any]:
    """pytest-gn's self-description: tiles of TILE_ROWS rows, `resident_blocks(device)` blocks
    (the same for every shape, dtype and direction here); refuses what the call refuses."""
    _supported(shape[1])
    return {"tile_rows": TILE_ROWS, "resident_blocks": resident_blocks(device)}


tiled_group_norm.gn_describe = describe  # type: ignore[attr-defined]
tiled_group_norm_overflow_bug.gn_describe = describe  # type: ignore[attr-defined]
