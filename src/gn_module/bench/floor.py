"""The floor of one benchmark row: a single launch that moves exactly a GroupNorm's minimum bytes.

Issues 12 and 13: where a measured physical limit shows a target cannot be reached, the target becomes 90 %
of that limit. SOL divides by the 1 GiB copy bandwidth, which a small or mid tensor cannot reach in one
launch (the launch itself is 3.7 us of event time on the H200, RESULTS.md session 16). So each row's limit is
measured at its own size, in the benchmark's timer (L2 flushed, GPU spin, CUDA-event median), with torch's
element-wise kernels:

- forward (read x, write y): ``y.copy_(x)`` and, where y has x's dtype, ``torch.neg(x, out=y)``;
- backward (read x and dy, write dx): ``torch.add(x, dy, out=dx)``.

In autocast rows y and dy are float32, as in `cases.bytes_moved`. A GroupNorm must also reduce before it
writes, so no GroupNorm moves those bytes faster in one launch; the faster kernel of a direction is its floor.
`limit_adjusted` says when the floor rules a target out, and what the target becomes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gn_module.bench.cases import AUTOCAST_DTYPES, Case

#: The share of a measured limit a target becomes where the limit rules the issue's target out.
LIMIT_SHARE = 0.9
#: The kernels timed per direction (the floor is the faster; an autocast row's forward has copy_ only).
KERNELS = {"fwd": ("copy_", "neg"), "bwd": ("add",)}


@dataclass(frozen=True)
class Floor:
    """Median microseconds of each kernel that moves one row's minimum bytes."""

    kernels_us: dict[str, float]

    @property
    def us(self) -> float:
        return min(self.kernels_us.values())


def floor_calls(case: Case, dtype: str, direction: str, device: Any) -> dict[str, Callable[[], object]]:
    """The zero-argument launches of `KERNELS[direction]` on fresh tensors of the row's shape and layout."""
    import torch

    from gn_module.bench.impls import torch_dtype

    if direction not in KERNELS:
        raise ValueError(f"direction must be one of {tuple(KERNELS)}, got {direction!r}")
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(len(case.shape), torch.contiguous_format)
    narrow = torch_dtype(dtype)
    wide = torch.float32 if dtype in AUTOCAST_DTYPES else narrow
    x = torch.randn(case.shape, device=device, dtype=narrow).to(memory_format=fmt)
    if direction == "fwd":
        y = torch.empty_like(x, dtype=wide)
        calls = {"copy_": lambda: y.copy_(x), "neg": lambda: torch.neg(x, out=y)}
        return calls if wide == narrow else {"copy_": calls["copy_"]}  # (neg's out must be x's dtype)
    dy = torch.randn_like(x, dtype=wide)
    dx = torch.empty_like(x)
    return {"add": lambda: torch.add(x, dy, out=dx)}


def measure_floor(
    case: Case, dtype: str, direction: str, timer: Any, *, reps: int = 50, max_seconds: float = 0.5
) -> Floor:
    """Time each kernel of `floor_calls` with `timer` (a `timing.EventTimer`)."""
    from gn_module.bench.timing import time_cuda

    times = {}
    for name, fn in floor_calls(case, dtype, direction, timer.device).items():
        timing = time_cuda(fn, reps=reps, warmup=3, min_reps=10, max_seconds=max_seconds, timer=timer)
        times[name] = timing.median_us
    return Floor(times)


#: What each kind of floor is, as a target's note names it.
FLOOR_KINDS = {
    "copy": "one launch moving these bytes",
    "chain": "the bare read-reduce-write chain (scripts/chain_floor.py)",
}


def limit_adjusted(
    threshold: float, floor_value: float, higher_is_better: bool, kind: str = "copy"
) -> tuple[float, str] | None:
    """Where the floor rules `threshold` out, the target it becomes (90 % of the floor) and a note saying why.

    `floor_value` is in the target's unit: a fraction of SOL (higher is better) or microseconds (lower is).
    `kind` names the floor (FLOOR_KINDS). None where the floor leaves the issue's target reachable.
    """
    what = FLOOR_KINDS[kind]
    if higher_is_better:
        if floor_value >= threshold:
            return None
        adjusted = LIMIT_SHARE * floor_value
        return adjusted, f"issue: {threshold:g}; {what} reaches {floor_value:.3f}"
    if floor_value <= threshold:
        return None
    adjusted = floor_value / LIMIT_SHARE
    return adjusted, f"issue: {threshold:g} us; {what} takes {floor_value:.2f} us"
