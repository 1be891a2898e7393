"""Overflow cases: which shapes make the one-pass grid smaller than the tile count.

A `CaseSpec` is what collection knows (labels only, so test ids are the same on every xdist
worker and collection needs neither torch nor a GPU). `resolve` turns it into a concrete
`GnCase` once the residency is known: from the occupancy API for the local device, from the
schedule model for an emulated profile, or from a residency cap. All shapes come from
`gn_module.schedule`; nothing here hard-codes a tile size.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from gn_module import schedule

DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
ACTS = {"silu": "silu", "none": None}
DEFAULT_RATIOS = ("x1", "x1p1", "x2p1", "x4p3")
DEFAULT_SHAPE = (128, 16)  # (channels, groups)
DEFAULT_CAP = 3  # the cheap variant's residency cap: small tensors, same overflow paths
FOREIGN_TILE_ROWS = 512  # foreign kernels: any tile of up to this many rows must overflow
VARIANTS = ("capped", "natural")
MARKER_KWARGS = {"dtypes", "acts", "directions", "shapes", "channels", "groups", "ratios", "variants", "cap"}


@dataclass(frozen=True)
class Ratio:
    """Tiles = mult x residency + plus; label ``x2p1`` means 2 x residency + 1."""

    mult: int
    plus: int = 0

    @classmethod
    def parse(cls, text: str | Ratio) -> Ratio:
        if isinstance(text, Ratio):
            return text
        m = re.fullmatch(r"x(\d+)(?:p(\d+))?", str(text).strip())
        if not m or int(m.group(1)) < 1:
            raise ValueError(
                f"overflow ratio must look like 'x1', 'x1p1' or 'x4p3' (m x residency + k), got {text!r}"
            )
        return cls(int(m.group(1)), int(m.group(2) or 0))

    @property
    def label(self) -> str:
        return f"x{self.mult}" + (f"p{self.plus}" if self.plus else "")

    def tiles(self, residency: int) -> int:
        return self.mult * residency + self.plus


@dataclass(frozen=True)
class CaseSpec:
    direction: str
    ratio: Ratio
    dtype: str  # fp16 / bf16 / fp32
    act: str | None
    channels: int = DEFAULT_SHAPE[0]
    groups: int = DEFAULT_SHAPE[1]
    variant: str = "natural"
    cap: int = DEFAULT_CAP  # used by the capped variant
    profile: str | None = None  # emulated GPU profile (arch sweep)
    schedule: str = "onepass"

    @property
    def id(self) -> str:
        parts = [self.profile] if self.profile else []
        parts += [self.direction, self.schedule]
        if self.variant == "capped":
            parts.append(f"cap{self.cap}")
        parts += [self.ratio.label, self.dtype, self.act or "noact"]
        if (self.channels, self.groups) != DEFAULT_SHAPE:
            parts.append(f"c{self.channels}g{self.groups}")
        return "-".join(parts)

    @property
    def torch_dtype(self) -> str:
        return DTYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        return schedule.ITEMSIZE[self.torch_dtype]

    def tiling(self, rows: int = 1 << 30) -> schedule.Tiling:
        return schedule.tiling(self.channels, self.groups, rows, self.itemsize, self.direction)

    @property
    def config(self) -> str:
        """Kernel configuration of the one-pass launch, named as `gn_module.resources` names it."""
        return onepass_config(self.direction, self.torch_dtype, self.tiling().vec)


def onepass_config(direction: str, dtype: str, vec: int) -> str:
    short = {v: k for k, v in DTYPES.items()}[dtype]
    return f"{direction}_onepass[{short},vec{vec}]"


def _as_tuple(value: Any) -> tuple:
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,)


def specs_from_marker(
    kwargs: dict[str, Any], profiles: tuple[str, ...] = (), foreign: bool = False
) -> list[CaseSpec]:
    """Cases of one ``@pytest.mark.overflow_grid(...)``; raises ValueError on a bad argument.

    Arguments: dtypes ("fp16", "bf16", "fp32"), acts ("silu", None), directions ("fwd", "bwd"),
    shapes [(channels, groups), ...] or channels=/groups=, ratios ("x1", "x1p1", "x2p1", "x4p3"),
    variants ("capped", "natural"), cap (the capped variant's residency, default 3).
    `profiles` adds the natural cases of each emulated profile (arch sweep).
    """
    unknown = set(kwargs) - MARKER_KWARGS
    if unknown:
        known = sorted(MARKER_KWARGS)
        raise ValueError(f"overflow_grid got unknown argument(s) {sorted(unknown)}; known: {known}")
    dtypes = _as_tuple(kwargs.get("dtypes", tuple(DTYPES)))
    acts = _as_tuple(kwargs.get("acts", ("silu", None)))
    directions = _as_tuple(kwargs.get("directions", schedule.DIRECTIONS))
    ratios = [Ratio.parse(r) for r in _as_tuple(kwargs.get("ratios", DEFAULT_RATIOS))]
    variants = _as_tuple(kwargs.get("variants", VARIANTS))
    cap = kwargs.get("cap", DEFAULT_CAP)
    if "shapes" in kwargs:
        shapes = [tuple(s) for s in kwargs["shapes"]]
    else:
        c = int(kwargs.get("channels", DEFAULT_SHAPE[0]))
        shapes = [(c, int(kwargs.get("groups", DEFAULT_SHAPE[1])))]
    for name, values, allowed in (("dtypes", dtypes, DTYPES), ("directions", directions, schedule.DIRECTIONS),
                                  ("variants", variants, VARIANTS)):  # fmt: skip
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ValueError(f"overflow_grid {name}={bad!r}: expected values among {list(allowed)}")
    acts = tuple(None if a in (None, "none") else a for a in acts)
    if any(a not in (None, "silu") for a in acts):
        raise ValueError(f"overflow_grid acts={acts!r}: expected 'silu' or None")
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"overflow_grid cap must be an int >= 1, got {cap!r}")
    for c, g in shapes:
        if c < 1 or g < 1 or c % g:
            raise ValueError(
                f"overflow_grid shape (channels={c}, groups={g}): channels must be divisible by groups"
            )
    specs = []
    for scope in (None, *(() if foreign else profiles)):  # local cases first, then each profile's
        for (c, g), direction, ratio, dtype, act in product(shapes, directions, ratios, dtypes, acts):
            if scope is not None:
                specs.append(CaseSpec(direction, ratio, dtype, act, c, g, profile=scope))
                continue
            for variant in variants:
                if variant == "capped" and foreign:
                    continue  # a foreign implementation cannot be capped: only natural shapes apply
                specs.append(CaseSpec(direction, ratio, dtype, act, c, g, variant, cap))
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        raise ValueError("overflow_grid arguments produce duplicate cases (repeated values?)")
    return specs


@dataclass(frozen=True)
class GnCase:
    """A concrete overflow case: the shape to run and the launch it should produce."""

    spec: CaseSpec
    shape: tuple[int, ...]  # (N, C, H, W), stored channels_last
    residency: int  # the residency the overflow is measured against
    tiles: int  # one-pass tiles of the shape (for foreign code: 512-row units)
    cap: int | None  # residency cap applied while the case runs
    expected_grid: int | None  # None when the launch is not ours to predict
    variant: str | None = None  # build variant ("compute_80") or None for the native build
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def num_groups(self) -> int:
        return self.spec.groups

    @property
    def dtype(self) -> str:
        return self.spec.torch_dtype

    @property
    def act(self) -> str | None:
        return self.spec.act

    @property
    def direction(self) -> str:
        return self.spec.direction

    @property
    def overflow_tiles(self) -> int:
        grid = self.expected_grid if self.expected_grid is not None else self.residency
        return max(0, self.tiles - grid)

    @property
    def numel(self) -> int:
        return schedule.elements(self.shape)

    def bytes_needed(self) -> int:
        """Device memory of a check: x, y, dy, dx in the dtype plus fp64 reference copies."""
        return self.numel * (4 * self.spec.itemsize + 6 * 8)

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id, "profile": self.spec.profile, "variant": self.spec.variant,
            "direction": self.direction, "shape": list(self.shape), "tiles": self.tiles,
            "residency": self.residency, "grid": self.expected_grid, "overflow": self.overflow_tiles,
            "build": self.variant or "native", "notes": list(self.notes),
        }  # fmt: skip


def shape_for_tiles(
    spec: CaseSpec, tiles: int, rows_per_tile: int
) -> tuple[tuple[int, ...], schedule.Tiling] | None:
    """(N, C, H, W) with exactly `tiles` one-pass tiles of `rows_per_tile` rows (H = tiles per
    slice, W = rows per tile) and the model's tiling of it; None when that tile height cannot
    give that many tiles."""
    found = schedule.batch_rows_for_tiles(
        spec.channels, spec.groups, spec.itemsize, spec.direction, tiles, rows_per_tile
    )
    if found is None:
        return None
    batch, rows = found
    t = schedule.tiling(spec.channels, spec.groups, rows, spec.itemsize, spec.direction, batch=batch)
    return (batch, spec.channels, t.tiles_per_slice, t.rows_per_tile), t


Residency = int | Callable[[schedule.Tiling], int]


def resolve(
    spec: CaseSpec,
    residency: Residency,
    *,
    cap: int | None = None,
    cap_at_residency: bool = False,
    device_residency: Residency | None = None,
    variant: str | None = None,
    notes: tuple[str, ...] = (),
) -> GnCase:
    """The concrete case for a one-pass residency (a number, or a function of the tiling).

    The tile size depends on the tensor (small tensors get smaller tiles, hence other shared
    memory and residency), so the residency is re-evaluated on the tiling of the generated shape
    until both agree. `cap` lowers it (a residency cap in force); `cap_at_residency` caps the
    grid at the residency itself (profile emulation). `device_residency` is what the GPU running
    the case really holds; when it is below the emulated residency the grid is the device's.
    """
    of = residency if callable(residency) else (lambda _t, r=residency: r)
    # The residency depends on the tile height (shared memory), and the tile height on the tile
    # count (small tensors get short tiles): fix the height first, then find a shape with it.
    for rows_per_tile in schedule.tile_row_choices(spec.channels, spec.itemsize, spec.direction):
        probe = schedule.tiling(
            spec.channels, spec.groups, rows_per_tile, spec.itemsize, spec.direction, batch=schedule.MIN_TILES
        )
        r = of(probe) if cap is None else min(of(probe), cap)
        if r < 1:
            raise ValueError(f"{spec.id}: one-pass residency is {r}: the one-pass kernel cannot run")
        tiles = spec.ratio.tiles(r)
        found = shape_for_tiles(spec, tiles, rows_per_tile)
        if found is not None:
            shape, t = found
            break
    else:
        raise RuntimeError(f"{spec.id}: no shape has {tiles} tiles of any tile height the model allows")
    grid = min(tiles, r)
    if device_residency is not None:
        dev = device_residency(t) if callable(device_residency) else device_residency
        if dev < grid:
            notes = (*notes, f"grid limited by the device ({dev} < emulated {r})")
            grid = dev
    cap_used = r if cap_at_residency else cap
    return GnCase(spec, shape, r, tiles, cap_used, grid, variant, tuple(notes))


def resolve_foreign(spec: CaseSpec, sm_count: int, max_blocks_per_sm: int) -> GnCase:
    """A shape whose row count overflows any grid of tiles up to 512 rows on the device.

    No kernel can hold more than sm_count x max_blocks_per_sm blocks, so with S rows per slice
    a tile of <= 512 rows gives at least S / 512 tiles; S = 512 x ratio(bound) overflows them all.
    """
    bound = sm_count * max_blocks_per_sm
    units = spec.ratio.tiles(bound)
    rows = FOREIGN_TILE_ROWS * units
    return GnCase(
        spec, (1, spec.channels, units, FOREIGN_TILE_ROWS), bound, units, None, None, None,
        (f"foreign implementation: {rows} rows overflow any grid of <= {bound} blocks with tiles of "
         f"<= {FOREIGN_TILE_ROWS} rows",),
    )  # fmt: skip
