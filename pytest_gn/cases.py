"""Overflow cases: which shapes make the one-pass grid smaller than the tile count.

A `CaseSpec` is what collection knows (labels only, so test ids are the same on every xdist
worker and collection needs neither torch nor a GPU). `resolve` turns it into a concrete
`GnCase` once the residency is known: from the occupancy API for the local device, from the
schedule model for an emulated profile, or from a residency cap. All shapes come from
`gn_module.schedule`; nothing here hard-codes a tile size.

A case is a *cell* (direction, overflow ratio, dtype, act) in a *scope* (this GPU's capped
and natural cases, or one GPU profile) with a *kind*: a (channels, groups) pair and a
geometry. Geometries:

- ``even``: every slice is whole tiles (one or two samples);
- ``partial``: the last tile of every slice is partial (the slice is not a multiple of the
  tile height); one or two samples where the tiling allows, else more samples of a few tiles
  each, and where no shape has the ratio's count, the nearest count between the same whole
  waves (``x2p1`` -> 2 x residency + 2; said in the case's notes; see `_partial_shape`);
- ``batch``: two or more samples, and the first overflow tile falls inside a sample where
  the tile counts allow it, so the overflow tiles a block runs belong to other samples than
  its first tile;
- ``2_31``: more than 2**31 elements (one sample, natural residency only; its tile count is
  whatever that size gives, far above the residency).

Rotation (the default): every cell runs once per scope, with kind ``(i + s) mod K`` for cell
number ``i`` (cells in the order direction, ratio, dtype, act), scope number ``s`` (capped 0,
natural 1, profile number p of the full profile list 2 + p) and K kinds. So a scope has as many
cases as before the kinds existed, every scope meets every kind, and over K scopes every cell
meets every kind. ``rotate=False`` crosses every kind with every cell instead.

Activations: a marker's ``acts`` lists the activations of the cells (`CASE_ACTS`, None written
``noact`` in ids). The value ``"fused"`` (`ROTATING`; the default is ``("fused", None)``) is one cell
per (direction, ratio, dtype) whose activation rotates over the fused activations the marker does
not list itself (`FUSED_ACTS`: silu, relu, gelu, gelu_tanh; for a foreign implementation silu only,
its protocol's): the j-th such cell of the marker runs ``FUSED_ACTS[(j + s) mod A]`` in scope ``s``.
So the default suite keeps its size (half its cells have no activation, as before) while every scope
runs every activation (6 cells each of 24), silu first: the cells that keep silu are the same as
before and their cases are unchanged, the others differ only in their activation. ``rotate=False``
rotates nothing: a `ROTATING` cell then runs each of its activations (with every kind).

Architectures (``archs``, from ``--gn-arch``): ``tiles`` is the above; ``tasks`` adds the task
architecture's cases, with the same kinds, rotation and scopes and capped cells rotating over
``task_caps`` (1, 2, 3): forward cases (`pytest_gn.tasks`, ``GN_ARCH=tasks``: the ratio counts chunks
per member over the slots a block keeps) and backward cases (`pytest_gn.tasks_bwd`,
``GN_ARCH=tasks+bwd``: the ratio counts a task's tiles over its team's members), cells (direction,
ratio, dtype, act) numbered forward first; then the backward's one-launch kernel's cells (arch
``tasks1``, ids ``bwd-tasks1-...``, ``GN_ARCH=tasks+bwd1``: the ratio counts the busiest member's chunk
pairs over the slots a block keeps, as the forward's), numbered last so the others keep their numbers.
``wide`` (opt-in) adds the task kernels' wide launches (arch ``tasksw``, ids ``fwd-tasksw-...`` and
``bwd-tasksw-...``, ``GN_ARCH=tasks+bwd``): the same cases as ``tasks`` (forward and two-launch backward,
the same ratios), run under CUDA autocast with a float16/bfloat16 x, so y and dy are float32 as torch's
autocast GroupNorm gives them; their cells (fp16 and bf16 only, on the shapes whose windows take 16-byte
vectors: the only ones with a wide launch) are numbered after all others.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from gn_module import schedule
from gn_module._abi import ACT_CODES

DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
#: The activations a case can carry: gn_module's (`gn_module.functional.ACTS`, not imported here: it
#: imports torch). None is ``noact`` in case ids and may be written "none" in a marker.
CASE_ACTS: tuple[str | None, ...] = tuple(ACT_CODES)
#: The fused activations, in the order a `ROTATING` cell takes them.
FUSED_ACTS = ("silu", "relu", "gelu", "gelu_tanh")
#: A foreign implementation's protocol promises SiLU only: what its `ROTATING` cells run.
FOREIGN_FUSED_ACTS = ("silu",)
#: A marker's ``acts`` value for one cell per (direction, ratio, dtype) whose activation rotates.
ROTATING = "fused"
DEFAULT_ACTS = (ROTATING, None)
DEFAULT_RATIOS = ("x1", "x1p1", "x2p1", "x4p3")
DEFAULT_SHAPE = (128, 16)  # (channels, groups) whose ids carry no cCgG suffix
#: (channels, groups) of the task kernels' cases over 2**31 elements: eight 256-byte windows per sample in
#: bf16 (schedule.task_window) of 64 tiles each (schedule.MIN_TILES_PER_TASK), so eight teams share the
#: residency and the two-launch backward's members hold two of their task's tiles (with the 256 tiles a
#: sample of one or two windows has, over 264 blocks, none would).
BIG_TASK_SHAPE = (1024, 32)
#: Default (C, G) pairs: 16-byte vectors; the scalar path of 16-bit types with 5 (odd) channels
#: per group, and fp32 4-wide vectors that straddle groups; the scalar path of every dtype;
#: a single group; one channel per group (a vector spans 4 or 8 groups).
DEFAULT_SHAPES = ((128, 16), (100, 20), (30, 10), (64, 1), (32, 32))
GEOMETRIES = ("even", "partial", "batch")
#: The geometry of a NaN probe (`nan_probe`), which is no overflow case
NAN_GEOMETRY = "nan"
BIG = "2_31"  # geometry of the cases over 2**31 elements
BIG_ELEMENTS = 2**31
DEFAULT_CAP = 3  # the cheap variant's residency cap: small tensors, same overflow paths
FOREIGN_TILE_ROWS = 512  # foreign kernels without a description: any tile up to this many rows overflows
#: Rows cut from a conservative foreign slice for the partial geometry: odd, so the last tile is
#: partial for every power-of-two tile height up to FOREIGN_TILE_ROWS.
FOREIGN_PARTIAL_CUT = FOREIGN_TILE_ROWS // 2 - 1
VARIANTS = ("capped", "natural")
MARKER_KWARGS = {"dtypes", "acts", "directions", "shapes", "channels", "groups", "ratios", "variants", "cap",
                 "geometries", "rotate", "over_2_31", "task_caps"}  # fmt: skip
#: Kernel architectures the cases can validate (``--gn-arch``): the tile kernels, and the task kernels
#: (forward cases under GN_ARCH=tasks, backward cases under GN_ARCH=tasks+bwd and tasks+bwd1).
ARCHS = ("tiles", "tasks", "wide")
#: A task case's kernels (`CaseSpec.arch`): "tasks", the forward's one launch or the backward's two;
#: "tasks1", the backward's opt-in one-launch kernel (GN_ARCH=tasks+bwd1; backward cases only).
TASK_ARCHS = ("tasks", "tasks1", "tasksw")
#: The dtypes of the wide cases (arch "tasksw"): x in 16 bits, y and dy float32 under autocast.
WIDE_DTYPES = ("fp16", "bf16")
#: Caps the capped task cases rotate over (`pytest_gn.tasks`).
DEFAULT_TASK_CAPS = (1, 2, 3)


class CaseUnavailable(RuntimeError):
    """No shape of the wanted geometry exists for this case; the case is skipped with this reason."""


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
    geometry: str = "even"
    arch: str = "tiles"  # or one of TASK_ARCHS: the task architecture (`env_arch` says which GN_ARCH)

    def __post_init__(self) -> None:
        if self.arch == "tasks1" and self.direction != "bwd":
            raise ValueError(f"arch 'tasks1' (the one-launch task backward) has backward cases only, got "
                             f"direction {self.direction!r}")  # fmt: skip
        if self.arch == "tasksw" and self.dtype not in WIDE_DTYPES:
            raise ValueError(f"arch 'tasksw' (the wide launches under autocast) takes {WIDE_DTYPES} x, got "
                             f"{self.dtype!r}")  # fmt: skip

    @property
    def is_task(self) -> bool:
        """Whether the case is the task architecture's (forward, backward, or one-launch backward)."""
        return self.arch in TASK_ARCHS

    @property
    def wide(self) -> bool:
        """Whether the case runs under CUDA autocast on the wide launches (float32 y and dy)."""
        return self.arch == "tasksw"

    @property
    def wide_itemsize(self) -> int:
        """`schedule.TaskTiling.wide_itemsize` of the case: 4 (float32 y, dy) for a wide case, else 0."""
        return 4 if self.wide else 0

    @property
    def task_kind(self) -> str:
        """A task case's kind (`TASK_KERNELS`' keys): "fwd", "bwd" (two launches) or "bwd1" (one)."""
        return "bwd1" if self.arch == "tasks1" else self.direction

    @property
    def id(self) -> str:
        if self.geometry == NAN_GEOMETRY:
            return f"nan-{self.direction}-{self.dtype}-{self.act or 'noact'}"
        parts = [self.profile] if self.profile else []
        parts += [self.direction, self.arch if self.is_task else self.schedule]
        if self.variant == "capped":
            parts.append(f"cap{self.cap}")
        parts += [BIG if self.big else self.ratio.label, self.dtype, self.act or "noact"]
        if (self.channels, self.groups) != DEFAULT_SHAPE:
            parts.append(f"c{self.channels}g{self.groups}")
        if self.geometry in ("partial", "batch"):
            parts.append(self.geometry)
        return "-".join(parts)

    @property
    def env_arch(self) -> str:
        """The GN_ARCH value the case runs under: tiles, tasks (the task forward), tasks+bwd (a task
        case of the backward: the task forward, then the task backward) or tasks+bwd1 (the same with the
        backward's one-launch kernel where `passes` asks for one)."""
        if self.arch == "tasks1":
            return "tasks+bwd1"
        if self.arch == "tasksw":  # the wide backward is the two launches'
            return "tasks+bwd"
        return "tasks+bwd" if self.arch == "tasks" and self.direction == "bwd" else self.arch

    @property
    def big(self) -> bool:
        return self.geometry == BIG

    @property
    def scope(self) -> str:
        """Summary row of the case: the profile, or "local" (this GPU's own cases)."""
        return self.profile or "local"

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
        if self.is_task:
            t = schedule.task_tiling(self.channels, self.groups, 1 << 30, self.itemsize, self.direction)
            return task_config(self.torch_dtype, t.vec if t is not None else 1, self.task_kind, self.wide)
        return onepass_config(self.direction, self.torch_dtype, self.tiling().vec)

    def labels(self) -> dict[str, Any]:
        """What the summary needs to place the case before it is resolved (xdist-safe, JSON)."""
        return {"id": self.id, "profile": self.profile, "variant": self.variant, "geometry": self.geometry,
                "direction": self.direction, "c": self.channels, "g": self.groups,
                "arch": self.arch}  # fmt: skip


def onepass_config(direction: str, dtype: str, vec: int) -> str:
    short = {v: k for k, v in DTYPES.items()}[dtype]
    return f"{direction}_onepass[{short},vec{vec}]"


#: The task kernel whose registers and occupancy give a kind of task case its residency: the forward's
#: one-pass kernel, the backward's stats kernel (its two launches), the backward's one-launch kernel
#: (`bwd1`: at least the stats kernel's registers on every arch; the launcher takes the lower occupancy).
TASK_KERNELS = {"fwd": "fwd_task_onepass", "bwd": "bwd_task_stats", "bwd1": "bwd_task_onepass"}


def task_config(dtype: str, vec: int, kind: str = "fwd", wide: bool = False) -> str:
    """The task architecture's kernel configuration of a kind of case (`TASK_KERNELS`:
    ``fwd_task_onepass[fp16,vec8]``, ``bwd_task_stats[fp16,vec8]``, ``bwd_task_onepass[fp16,vec8]``; a
    wide case's ``fwd_task_onepass[bf16,vec8,wide]``, as `gn_module.resources` names it)."""
    short = {v: k for k, v in DTYPES.items()}[dtype]
    return f"{TASK_KERNELS[kind]}[{short},vec{vec}" + (",wide]" if wide else "]")


def has_wide_launch(channels: int, groups: int) -> bool:
    """Whether a 16-bit x of these channels has the wide launches (task windows of 16-byte vectors)."""
    t = schedule.task_tiling(channels, groups, 1 << 30, 2, "fwd")
    return t is not None and t.vec * 2 == schedule.VEC_BYTES


def _as_tuple(value: Any) -> tuple:
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return (value,)


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """``"128:16,100:20"`` -> ((128, 16), (100, 20)); raises ValueError naming the bad pair."""
    pairs = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = re.fullmatch(r"(\d+)\s*:\s*(\d+)", part)
        if not m:
            raise ValueError(f"expects C:G pairs like 128:16,100:20, got {part!r}")
        pairs.append(_check_shape(int(m.group(1)), int(m.group(2))))
    if not pairs:
        raise ValueError("expects at least one C:G pair, like 128:16")
    if len(set(pairs)) != len(pairs):
        raise ValueError(f"repeats a C:G pair: {text!r}")
    return tuple(pairs)


def _check_shape(c: int, g: int) -> tuple[int, int]:
    if c < 1 or g < 1 or c % g:
        raise ValueError(f"shape (channels={c}, groups={g}): channels must be divisible by groups")
    return c, g


def specs_from_marker(
    kwargs: dict[str, Any],
    profiles: Sequence[str] = (),
    foreign: bool = False,
    default_shapes: Sequence[tuple[int, int]] | None = None,
    profile_numbers: Mapping[str, int] | None = None,
    archs: Sequence[str] = ("tiles",),
) -> list[CaseSpec]:
    """Cases of one ``@pytest.mark.overflow_grid(...)``; raises ValueError on a bad argument.

    Arguments: dtypes ("fp16", "bf16", "fp32"), acts (`CASE_ACTS` and "fused", default ("fused",
    None): see the module docstring), directions ("fwd", "bwd"),
    shapes [(channels, groups), ...] or channels=/groups=, geometries ("even", "partial",
    "batch"), ratios ("x1", "x1p1", "x2p1", "x4p3"), variants ("capped", "natural"), cap (the
    capped variant's residency, default 3), rotate (default True: one kind per cell and scope,
    see the module docstring), over_2_31 (default False: add one case per direction over 2**31
    elements, natural only), task_caps (default (1, 2, 3): the caps the capped task cases rotate
    over). `profiles` adds each emulated profile's cases (arch sweep); `profile_numbers` gives each
    profile's number for the rotation (default: its position). `default_shapes` replaces
    DEFAULT_SHAPES when the marker names no shapes (--gn-shapes). `archs` (--gn-arch): "tiles" for
    the tile architecture's cases, "tasks" for the task architecture's cases of each direction asked
    (gn_module only: none for a foreign implementation).
    """
    unknown = set(kwargs) - MARKER_KWARGS
    if unknown:
        known = sorted(MARKER_KWARGS)
        raise ValueError(f"overflow_grid got unknown argument(s) {sorted(unknown)}; known: {known}")
    dtypes = _as_tuple(kwargs.get("dtypes", tuple(DTYPES)))
    acts = _as_tuple(kwargs.get("acts", DEFAULT_ACTS))
    directions = _as_tuple(kwargs.get("directions", schedule.DIRECTIONS))
    ratios = [Ratio.parse(r) for r in _as_tuple(kwargs.get("ratios", DEFAULT_RATIOS))]
    variants = _as_tuple(kwargs.get("variants", VARIANTS))
    geometries = _as_tuple(kwargs.get("geometries", GEOMETRIES))
    cap = kwargs.get("cap", DEFAULT_CAP)
    rotate = kwargs.get("rotate", True)
    big = kwargs.get("over_2_31", False)
    task_caps = _as_tuple(kwargs.get("task_caps", DEFAULT_TASK_CAPS))
    if "shapes" in kwargs:
        shapes = [tuple(s) for s in kwargs["shapes"]]
    elif "channels" in kwargs or "groups" in kwargs:
        shapes = [
            (int(kwargs.get("channels", DEFAULT_SHAPE[0])), int(kwargs.get("groups", DEFAULT_SHAPE[1])))
        ]
    else:
        shapes = [tuple(s) for s in (default_shapes or DEFAULT_SHAPES)]
    allowed_values = (("dtypes", dtypes, DTYPES), ("directions", directions, schedule.DIRECTIONS),
                      ("variants", variants, VARIANTS), ("geometries", geometries, GEOMETRIES))  # fmt: skip
    for name, values, allowed in allowed_values:
        bad = [v for v in values if v not in allowed]
        if bad:
            raise ValueError(f"overflow_grid {name}={bad!r}: expected values among {list(allowed)}")
    acts, rotation = _check_acts(acts, foreign)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise ValueError(f"overflow_grid cap must be an int >= 1, got {cap!r}")
    if not task_caps or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in task_caps):
        raise ValueError(f"overflow_grid task_caps must be ints >= 1, got {task_caps!r}")
    bad_archs = [a for a in archs if a not in ARCHS]
    if bad_archs or not archs:
        raise ValueError(f"architectures {list(archs)!r}: expected values among {list(ARCHS)}")
    for name, flag in (("rotate", rotate), ("over_2_31", big)):
        if not isinstance(flag, bool):
            raise ValueError(f"overflow_grid {name} must be True or False, got {flag!r}")
    for c, g in shapes:
        try:
            _check_shape(c, g)
        except ValueError as exc:
            raise ValueError(f"overflow_grid {exc}") from None
    cells = list(product(directions, ratios, dtypes, acts))
    acts_of = _act_rotation(cells, rotation, rotate)
    kinds = list(product(shapes, geometries))
    numbers = dict(profile_numbers or {name: i for i, name in enumerate(profiles)})
    scopes: list[tuple[str | None, str, int]] = []  # (profile, variant, scope number)
    if not foreign:  # a foreign implementation cannot be capped: only natural shapes apply
        scopes += [(None, "capped", 0)] if "capped" in variants else []
    scopes += [(None, "natural", 1)] if "natural" in variants else []
    if not foreign:  # profile emulation (caps, PTX builds) applies to gn_module only
        scopes += [(p, "natural", 2 + numbers.get(p, i)) for i, p in enumerate(profiles)]
    specs = []
    tiles = "tiles" in archs
    task_directions = [d for d in directions if "tasks" in archs and not foreign]
    # the one-launch backward's cells come last: the others keep their numbers (rotations, caps)
    task_kinds = [(d, "tasks") for d in task_directions] + [("bwd", "tasks1")] * ("bwd" in task_directions)
    task_cells = [(d, arch, r, dt, a) for d, arch in task_kinds for r, dt, a in product(ratios, dtypes, acts)]
    task_acts_of = _act_rotation(task_cells, rotation, rotate)
    # the wide launches' cells (--gn-arch wide), numbered after every other: on their own kinds
    wide_dtypes = [dt for dt in dtypes if dt in WIDE_DTYPES]
    wide_kinds = [k for k in kinds if has_wide_launch(*k[0])]
    wide_on = "wide" in archs and not foreign and wide_kinds
    wide_cells = [(d, "tasksw", r, dt, a) for d in (directions if wide_on else ())
                  for r, dt, a in product(ratios, wide_dtypes, acts)]  # fmt: skip
    wide_acts_of = _act_rotation(wide_cells, rotation, rotate)
    for profile, variant, number in scopes:
        for i, (direction, ratio, dtype, _) in enumerate(cells if tiles else []):
            chosen = [kinds[(i + number) % len(kinds)]] if rotate else kinds
            for act, ((c, g), geometry) in product(acts_of(i, number), chosen):
                specs.append(CaseSpec(direction, ratio, dtype, act, c, g, variant, cap, profile,
                                      geometry=geometry))  # fmt: skip
        for group, group_kinds, group_acts in ((task_cells, kinds, task_acts_of),
                                               (wide_cells, wide_kinds, wide_acts_of)):  # fmt: skip
            for i, (direction, arch, ratio, dtype, _) in enumerate(group):
                chosen = [group_kinds[(i + number) % len(group_kinds)]] if rotate else group_kinds
                k = task_caps[i % len(task_caps)] if variant == "capped" else cap
                for act, ((c, g), geometry) in product(group_acts(i, number), chosen):
                    specs.append(CaseSpec(direction, ratio, dtype, act, c, g, variant, k, profile,
                                          geometry=geometry, arch=arch))  # fmt: skip
    if big and "natural" in variants:
        dtype = "bf16" if "bf16" in dtypes else dtypes[0]  # the smallest dtype keeps it to seconds
        c, g = shapes[0]
        act = rotation[0] if acts[0] == ROTATING else acts[0]  # the default's: silu
        for direction in directions if tiles else ():
            specs.append(CaseSpec(direction, Ratio(1), dtype, act, c, g, "natural", cap, geometry=BIG))
        tc, tg = BIG_TASK_SHAPE
        for direction, arch in task_kinds:
            specs.append(CaseSpec(direction, Ratio(1), dtype, act, tc, tg, "natural", cap, geometry=BIG,
                                  arch=arch))  # fmt: skip
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        raise ValueError("overflow_grid arguments produce duplicate cases (repeated values?)")
    return specs


def _check_acts(acts: tuple, foreign: bool) -> tuple[tuple[str | None, ...], tuple[str, ...]]:
    """(acts with "none" as None, the activations a `ROTATING` cell rotates over); raises ValueError.
    The rotation leaves out the activations the marker lists itself (their own cells run them); when
    nothing is left the `ROTATING` value adds no cells."""
    acts = tuple(None if a in (None, "none") else a for a in acts)
    bad = [a for a in acts if a != ROTATING and a not in CASE_ACTS]
    if bad or not acts:
        allowed = [a for a in CASE_ACTS if a is not None]
        raise ValueError(
            f"overflow_grid acts={acts!r}: expected values among None, 'none', {allowed} or {ROTATING!r} "
            "(one cell whose fused activation rotates over cells and scopes)"
        )
    rotation = tuple(a for a in (FOREIGN_FUSED_ACTS if foreign else FUSED_ACTS) if a not in acts)
    if ROTATING in acts and not rotation:
        acts = tuple(a for a in acts if a != ROTATING)
    if not acts:
        raise ValueError(f"overflow_grid acts: {ROTATING!r} alone, with every fused activation listed too")
    return acts, rotation


def _act_rotation(
    cells: Sequence[tuple[Any, ...]], rotation: tuple[str, ...], rotate: bool = True
) -> Callable[[int, int], tuple[str | None, ...]]:
    """``acts(i, s)``: the activations cell ``i`` (its last item) runs in scope ``s``: its own, or for
    the j-th `ROTATING` cell ``rotation[(j + s) mod len(rotation)]`` (with ``rotate=False``, every one
    of the rotation: no rotation at all)."""
    rank = {}
    for i, cell in enumerate(cells):
        if cell[-1] == ROTATING:
            rank[i] = len(rank)

    def acts(i: int, scope: int) -> tuple[str | None, ...]:
        if i not in rank:
            return (cells[i][-1],)
        return (rotation[(rank[i] + scope) % len(rotation)],) if rotate else rotation

    return acts


@dataclass(frozen=True)
class TaskRun:
    """What the task kernels launch with for a task case on the GPU at hand, and its claim: the
    chunk slots per block and co-resident blocks there (under the case's build; the one-pass forward's,
    or the backward's stats kernel's), and the scope's plan: the busiest member's chunks per task over
    the scope's `model_slots` (a profile's slots for a profile case, else the same as `slots`: the
    forward's ratio), its team size and the busiest member's tiles per task (the backward's ratio)."""

    slots: int
    residency: int
    chunks: int
    model_slots: int
    team: int = 0
    member_tiles: int = 0


@dataclass(frozen=True)
class GnCase:
    """A concrete overflow case: the shape to run and the launch it should produce."""

    spec: CaseSpec
    shape: tuple[int, ...]  # (N, C, H, W), stored channels_last
    residency: int  # the residency the overflow is measured against
    tiles: int  # one-pass tiles of the shape (for foreign code: its own or 512-row tiles)
    cap: int | None  # residency cap applied while the case runs
    expected_grid: int | None  # None when the launch is not ours to predict
    variant: str | None = None  # build variant ("compute_80") or None for the native build
    notes: tuple[str, ...] = field(default_factory=tuple)
    tile_rows: int | None = None  # rows per tile the tile count is in
    task: TaskRun | None = None  # task architecture cases: what the launch holds (pytest_gn.tasks)
    nan_at: tuple[int, ...] | None = None  # a NaN probe (`nan_probe`): x's element made NaN before the run

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

    def bytes_needed(self, foreign: bool = False) -> int:
        """Device memory one check of this case allocates at its peak (see `memory_estimate`)."""
        return memory_estimate(self, foreign)

    def summary(self) -> dict[str, Any]:
        out = {
            **self.spec.labels(), "shape": list(self.shape), "tiles": self.tiles,
            "residency": self.residency, "grid": self.expected_grid, "overflow": self.overflow_tiles,
            "build": self.variant or "native", "notes": list(self.notes),
        }  # fmt: skip
        if self.task is not None:
            out.update(slots=self.task.model_slots, chunks=self.task.chunks, team=self.task.team,
                       member_tiles=self.task.member_tiles,
                       over=max(0, self.task.chunks - self.task.model_slots))  # fmt: skip
        return out


# ------------------------------------------------------------------ memory
#: The fp64 reference runs on whole (sample, group) blocks of about this many elements at a time.
REF_CHUNK_ELEMENTS = 1 << 24
#: Peak bytes per element of one reference chunk: the fp64 copies of the chunk's inputs, torch's
#: GroupNorm (+ SiLU) in fp64 and, backward, its autograd graph and gradients, then the fp64
#: temporaries of the comparison. Measured on the CPU with torch 2.13 (peak RSS): 36 forward,
#: 46 backward; about 1.5x and 2x that here, for CUDA's own kernels and the caching allocator
#: (the GPU summary prints measured peaks against these estimates). Forward was 56 until the
#: H200 run of 2026-11-30: the 2**31-element forward (one 2**27-element group per chunk) peaked
#: at 16.13 GiB against 15.13 estimated, i.e. about 64 bytes per reference element; 72 keeps a
#: margin (that case's estimate is now 17.1 GiB).
REF_BYTES_PER_ELEMENT = {"fwd": 72, "bwd": 96}
#: On top for a ReLU backward: the allowances at ReLU's kink (`gn_module.reference.relu_kink`), 34 bytes
#: per element more than SiLU on the CPU (peak RSS, torch 2.13), doubled as above; an H200 case at
#: 0.81 GiB against 0.70 estimated before it was counted.
REF_KINK_BYTES_PER_ELEMENT = 72
#: The inputs are drawn in chunks of this many elements (fp32 values, scaled, plus the ramp).
INPUT_CHUNK_ELEMENTS = 1 << 24
#: Memory no estimate goes below: workspace rounding, mean/rstd, the allocator's block rounding.
FIXED_BYTES = 64 << 20


def reference_chunk(shape: tuple[int, ...], groups: int) -> tuple[int, int]:
    """(samples, groups) per fp64 reference chunk: whole samples when one fits the chunk size,
    else whole groups of one sample (at least one, whatever its size)."""
    n, c = shape[0], shape[1]
    per_sample = schedule.elements(shape[1:])
    if per_sample <= REF_CHUNK_ELEMENTS:
        return max(1, min(n, REF_CHUNK_ELEMENTS // max(1, per_sample))), groups
    per_group = per_sample // c * (c // groups)
    return 1, max(1, min(groups, REF_CHUNK_ELEMENTS // per_group))


def memory_estimate(case: GnCase, foreign: bool = False) -> int:
    """Peak device memory (bytes) of checking `case`, the largest of three phases.

    - inputs: x (and dy) plus the fp32 chunk they are drawn from;
    - run: gn_module forward holds x, the one-pass y and the two-pass y plus torch.equal's bool
      map; backward x, dy, the one-pass dx, the two-pass y and dx and the bool map. A foreign
      implementation (in its child process) holds x (and dy), the copy of x it is given, y
      (and dx); its own temporaries are not ours to know and are not counted;
    - check: the inputs and the checked outputs, plus the largest fp64 reference chunk.

    gn_module's workspace (from the schedule model: the tile plan's, or a task case's partials)
    comes on top. A task case runs three times (a backward one up to three) but holds two runs'
    outputs at once, as here.
    """
    e, itemsize = case.numel, case.spec.itemsize
    # a wide case's y and dy are float32: every tensor counted at that size (an upper bound)
    size = 4 if case.spec.wide else itemsize
    fwd = case.direction == "fwd"
    inputs = 1 if fwd else 2
    gen = inputs * e * size + min(e, INPUT_CHUNK_ELEMENTS) * 4 * 3
    if foreign:
        run = (inputs + 2 + (0 if fwd else 1)) * e * size
    else:
        run = (inputs + 1 + (1 if fwd else 2)) * e * size + e
    samples, groups = reference_chunk(case.shape, case.num_groups)
    chunk = e // case.shape[0] * samples // case.num_groups * groups
    per_element = REF_BYTES_PER_ELEMENT[case.direction]
    if not fwd and case.spec.act == "relu":
        per_element += REF_KINK_BYTES_PER_ELEMENT
    check = (inputs + 1) * e * size + chunk * per_element
    total = max(gen, run, check) + FIXED_BYTES
    if not foreign:
        n, c = case.shape[0], case.shape[1]
        tt = schedule.task_tiling(c, case.num_groups, e // (n * c), itemsize, case.direction, batch=n)
        if case.task is not None and tt is not None:
            total += 4 * sum(schedule.make_task_plan(tt, 2, 1, 1).workspace_floats.values())
        else:
            t = schedule.tiling(c, case.num_groups, e // (n * c), itemsize, case.direction, batch=n)
            total += 4 * sum(schedule.workspace_layout(t, n).values())
    return total


# ------------------------------------------------------------------ shapes
def spatial(rows: int, rows_per_tile: int) -> tuple[int, int]:
    """(H, W) with H x W = rows; W is the largest divisor of rows up to the tile height, so a
    whole-tile slice reads (tiles per slice, rows per tile) as before."""
    for w in range(min(rows, rows_per_tile), 0, -1):
        if rows % w == 0:
            return rows // w, w
    return rows, 1


def _divisors(n: int) -> set[int]:
    return {d for i in range(1, math.isqrt(n) + 1) if n % i == 0 for d in (i, n // i)}


def _batches(tiles: int, grid: int) -> list[int]:
    """Sample counts N >= 2 that divide `tiles`, best first: the first overflow tile inside a
    sample whose tiles are at most the grid, then inside any sample, then the fewest samples."""

    def rank(n: int) -> tuple[bool, bool, int]:
        per = tiles // n
        return grid % per == 0, per > grid, n

    return sorted((n for n in _divisors(tiles) if n >= 2), key=rank)


def geometry_candidates(
    geometry: str, tiles: int, rows_per_tile: int, grid: int, cut: int | None = None
) -> list[tuple[int, int]]:
    """(samples, rows per slice) that cut into `tiles` tiles of `rows_per_tile` rows with the
    geometry, best first, before any check against a real tiling. `cut`: rows taken from a
    partial slice (default: half a tile)."""
    if geometry == "even":
        found = [(b, tiles // b * rows_per_tile) for b in (2, 1) if tiles % b == 0]
        return [*found, (tiles, rows_per_tile)]
    if geometry == "partial":
        cut = rows_per_tile // 2 if cut is None else cut
        if not 1 <= cut < rows_per_tile:
            return []
        return [(b, tiles // b * rows_per_tile - cut) for b in (1, 2) if tiles % b == 0 and tiles // b >= 2]
    if geometry == "batch":
        return [(n, tiles // n * rows_per_tile) for n in _batches(tiles, grid)]
    raise ValueError(f"unknown geometry {geometry!r}")


def shape_for_tiles(
    spec: CaseSpec, tiles: int, rows_per_tile: int, grid: int | None = None
) -> tuple[tuple[int, ...], schedule.Tiling] | None:
    """(N, C, H, W) of the spec's geometry with exactly `tiles` one-pass tiles of
    `rows_per_tile` rows and the model's tiling of it; None when that tile height cannot give
    that many tiles in that geometry. `grid` (default: `tiles`) ranks the batch geometry."""
    grid = tiles if grid is None else grid
    for batch, rows in geometry_candidates(spec.geometry, tiles, rows_per_tile, grid):
        t = schedule.tiling(spec.channels, spec.groups, rows, spec.itemsize, spec.direction, batch=batch)
        if t.rows_per_tile != rows_per_tile or batch * t.tiles_per_slice != tiles:
            continue
        if spec.geometry == "partial" and rows % rows_per_tile == 0:
            continue
        return (batch, spec.channels, *spatial(rows, rows_per_tile)), t
    return None


Residency = int | Callable[[schedule.Tiling], int]


def _residency_at(
    spec: CaseSpec, of: Callable[[schedule.Tiling], int], cap: int | None
) -> Callable[[int], int]:
    """The one-pass residency (capped) as a function of the tile height (cached)."""
    cache: dict[int, int] = {}

    def at(rows_per_tile: int) -> int:
        if rows_per_tile not in cache:
            probe = schedule.tiling(spec.channels, spec.groups, rows_per_tile, spec.itemsize, spec.direction,
                                    batch=schedule.MIN_TILES)  # fmt: skip
            r = of(probe) if cap is None else min(of(probe), cap)
            if r < 1:
                raise ValueError(f"{spec.id}: one-pass residency is {r}: the one-pass kernel cannot run")
            cache[rows_per_tile] = r
        return cache[rows_per_tile]

    return at


def nearby_plus(ratio: Ratio, residency: int) -> list[int]:
    """The tile counts over ``mult x residency`` a case of `ratio` may use, nearest first: its own
    ``plus``, then (for plus > 0) ``plus + 1, plus - 1, plus + 2, ...`` within 1 .. residency - 1,
    so that the count stays between ``mult`` and ``mult + 1`` whole waves (the last wave partial:
    some blocks take one more tile, not all). ``x1``, ``x2``: the exact count only."""
    out = [ratio.plus]
    if ratio.plus > 0:
        for d in range(1, residency):
            out += [k for k in (ratio.plus + d, ratio.plus - d) if 1 <= k < residency]
    return out


def _partial_shape(
    spec: CaseSpec, at: Callable[[int], int]
) -> tuple[tuple[int, ...], schedule.Tiling, int, str] | None:
    """A partial shape when no one- or two-sample shape of the two usual tile heights has the
    ratio's tile count: (shape, tiling, residency, note), or None.

    `tiling` cuts a slice into tiles of the largest height only when it holds at least
    ceil(MIN_TILES / N) of them, and into MIN_TILE_ROWS-row (or intermediate) tiles only up to
    that many, N samples. So with one or two samples the largest tiles give at least about
    MIN_TILES tiles and shorter tiles at most MIN_TILES, while a 1-block/SM GPU holds
    ``SMs`` blocks of the largest tiles (ratio x SMs is often below MIN_TILES) and ``2 x SMs``
    of short ones (ratio x 2 SMs often above it). More samples of fewer tiles each reach the
    counts in between, but only those with a divisor N where every sample holds about
    ceil(MIN_TILES / N) tiles. Searched here, nearest first: the exact count, then the nearest
    counts of the same ratio class (`nearby_plus`), each over the tile heights (the two usual
    ones, then the shortest height of every other residency) and the sample counts (fewest first).
    """
    largest, *rest = schedule.tile_row_choices(spec.channels, spec.itemsize, spec.direction)
    smallest = rest[0] if rest else largest
    heights = [largest, smallest] if rest else [largest]
    seen = {at(h) for h in heights}
    for h in range(smallest + 1, largest):  # the residency only falls as tiles grow (shared memory)
        if at(h) not in seen:
            seen.add(at(h))
            heights.append(h)
    mult, want = spec.ratio.mult, spec.ratio.plus
    for plus in nearby_plus(spec.ratio, max(seen)):
        for h in heights:
            r = at(h)
            if plus != want and not 1 <= plus < r:  # outside the ratio class at this residency
                continue
            tiles = mult * r + plus
            for batch in sorted(d for d in _divisors(tiles) if tiles // d >= 2):
                per = tiles // batch
                rows = schedule.slice_rows_for_tiles(
                    spec.channels, spec.itemsize, spec.direction, batch, per, h
                )
                lo, hi = rows.start, min(rows.stop - 1, per * h - 1)  # S = per x h: no partial tile
                if lo > hi:
                    continue
                s = min(max(per * h - h // 2, lo), hi)  # half a tile short where the tiling allows
                t = schedule.tiling(spec.channels, spec.groups, s, spec.itemsize, spec.direction, batch=batch)
                if t.rows_per_tile != h or batch * t.tiles_per_slice != tiles or s % h == 0:
                    raise RuntimeError(f"{spec.id}: slice_rows_for_tiles disagrees with tiling: {t}")
                shape = (batch, spec.channels, *spatial(s, h))
                how = f"{batch} samples of {per} tiles of {h} rows"
                if plus == want:
                    note = f"partial shape of {how}: no 1- or 2-sample shape has {tiles} tiles"
                else:
                    note = (f"{tiles} tiles ({Ratio(mult, plus).label} of residency {r}) instead of "
                            f"{spec.ratio.tiles(r)} ({spec.ratio.label}), which no partial shape of "
                            f"the model's tilings has; {how}")  # fmt: skip
                return shape, t, r, note
    return None


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
    Raises CaseUnavailable when no shape of the spec's geometry fits.
    """
    of = residency if callable(residency) else (lambda _t, r=residency: r)
    if spec.big:
        shape, t, r = _big_shape(spec, of, cap)
    else:
        # The residency depends on the tile height (shared memory), and the tile height on the tile
        # count (small tensors get short tiles): fix the height first, then find a shape with it.
        at = _residency_at(spec, of, cap)
        for rows_per_tile in schedule.tile_row_choices(spec.channels, spec.itemsize, spec.direction):
            r = at(rows_per_tile)
            tiles = spec.ratio.tiles(r)
            found = shape_for_tiles(spec, tiles, rows_per_tile, min(tiles, r))
            if found is not None:
                shape, t = found
                break
        else:
            nearby = _partial_shape(spec, at) if spec.geometry == "partial" else None
            if nearby is None:
                also = " (nor a nearby count of its ratio class)" if spec.geometry == "partial" else ""
                raise CaseUnavailable(
                    f"{spec.id}: no {spec.geometry} shape has {tiles} tiles{also} of any tile height "
                    "the model allows"
                )
            shape, t, r, note = nearby
            notes = (*notes, note) if note else notes
    tiles = shape[0] * t.tiles_per_slice
    grid = min(tiles, r)
    if device_residency is not None:
        dev = device_residency(t) if callable(device_residency) else device_residency
        if dev < grid:
            notes = (*notes, f"grid limited by the device ({dev} < emulated {r})")
            grid = dev
    cap_used = r if cap_at_residency else cap
    return GnCase(spec, shape, r, tiles, cap_used, grid, variant, tuple(notes), t.rows_per_tile)


def big_rows(channels: int) -> int:
    """Rows of the one slice of a 2_31 case: the fewest with more than 2**31 elements."""
    return BIG_ELEMENTS // channels + 1


def _big_shape(
    spec: CaseSpec, of: Callable[[schedule.Tiling], int], cap: int | None
) -> tuple[tuple[int, ...], schedule.Tiling, int]:
    rows = big_rows(spec.channels)
    t = schedule.tiling(spec.channels, spec.groups, rows, spec.itemsize, spec.direction)
    r = of(t) if cap is None else min(of(t), cap)
    if r < 1:
        raise ValueError(f"{spec.id}: one-pass residency is {r}: the one-pass kernel cannot run")
    if t.tiles_per_slice <= r:
        raise CaseUnavailable(f"{spec.id}: {t.tiles_per_slice} tiles do not overflow a residency of {r}")
    return (1, spec.channels, *spatial(rows, t.rows_per_tile)), t, r


# ------------------------------------------------------------------ foreign implementations
#: ``describe(shape) -> (tile_rows, resident_blocks)`` or None (see `pytest_gn.describe`).
Describe = Callable[[tuple[int, ...]], "tuple[int, int] | None"]


def foreign_shape(spec: CaseSpec, tile_rows: int, resident: int, conservative: bool = False) -> tuple[
    tuple[int, ...], int
]:  # fmt: skip
    """(shape, tiles) for an implementation that cuts each sample into tiles of `tile_rows` rows
    and holds `resident` blocks. Raises CaseUnavailable when the geometry is impossible."""
    if spec.big:
        rows = big_rows(spec.channels)
        tiles = -(-rows // tile_rows)
        if tiles <= resident:
            raise CaseUnavailable(f"{spec.id}: {tiles} tiles of {tile_rows} rows do not overflow {resident}")
        return (1, spec.channels, *spatial(rows, tile_rows)), tiles
    tiles = spec.ratio.tiles(resident)
    cut = FOREIGN_PARTIAL_CUT if conservative else None
    found = geometry_candidates(spec.geometry, tiles, tile_rows, min(tiles, resident), cut)
    if not found:
        raise CaseUnavailable(f"{spec.id}: no {spec.geometry} shape has {tiles} tiles of {tile_rows} rows")
    batch, rows = found[0]
    return (batch, spec.channels, *spatial(rows, tile_rows)), tiles


def resolve_foreign(
    spec: CaseSpec, sm_count: int, max_blocks_per_sm: int, describe: Describe | None = None
) -> GnCase:
    """The case for a foreign implementation.

    With a description (`describe(shape) -> (tile_rows, resident_blocks)`), the shape has
    ratio x resident_blocks tiles of the implementation's own height; the description is asked
    again for the new shape until it stops changing. Without one (or when it returns None): a
    shape whose rows overflow any grid of tiles up to 512 rows on the device: no kernel holds
    more than sm_count x max_blocks_per_sm blocks, so S = 512 x ratio(bound) rows overflow them.
    """
    bound = sm_count * max_blocks_per_sm
    shape, units = foreign_shape(spec, FOREIGN_TILE_ROWS, bound, conservative=True)
    fallback = GnCase(
        spec, shape, bound, units, None, None, None,
        (f"foreign implementation: {units * FOREIGN_TILE_ROWS} rows overflow any grid of <= {bound} blocks "
         f"with tiles of <= {FOREIGN_TILE_ROWS} rows",), FOREIGN_TILE_ROWS,
    )  # fmt: skip
    if describe is None:
        return fallback
    said = describe(shape)
    for _ in range(8):
        if said is None:
            return fallback
        rows, resident = said
        shape, tiles = foreign_shape(spec, rows, resident)
        again = describe(shape)
        if again == said:
            note = (
                f"sized by the implementation's description: tiles of {rows} rows, {resident} resident blocks"
            )
            return GnCase(spec, shape, resident, tiles, None, None, None, (note,), rows)
        said = again
    if said is None:
        return fallback
    rows, resident = said
    shape, tiles = foreign_shape(spec, rows, resident)
    note = f"the implementation's description did not settle (last: {said}); sized by its last answer"
    return GnCase(spec, shape, resident, tiles, None, None, None, (note,), rows)


# ------------------------------------------------------------------ NaN probes
#: A NaN probe's tensor: C = 48 in 16 groups of 3 channels, so that a vector of 2, 4 or 8 channels, in any
#: kernel that vectorizes, straddles groups; the NaN goes to channel 3 (group 1) of sample 0.
NAN_SHAPE = (2, 48, 6, 7)
NAN_GROUPS = 16
NAN_AT = (0, 3, 2, 2)
#: The activations a probe may take: a fused epilogue must keep a NaN (a ReLU of fmaxf(z, 0) makes it 0).
#: The bundled suite probes None and "silu", the protocol's (`gn_impl`); a test of your own may ask for more.
NAN_ACTS = (None, "silu", "relu", "gelu", "gelu_tanh")


def nan_probe(direction: str, dtype: str, act: str | None) -> GnCase:
    """A NaN probe (`pytest_gn.suite.test_gn_nan`): x of NAN_SHAPE with one NaN at NAN_AT. torch's GroupNorm
    and activation make that group's y (and dx) NaN and, backward, its channels' dweight and dbias; every
    other element is finite and checked against the fp64 reference as usual. A GroupNorm that lets the NaN
    into other groups (a shared sum, a vector of channels across groups) or loses it (a fused activation
    that maps NaN to a number hides a diverging model) fails."""
    if direction not in schedule.DIRECTIONS or dtype not in DTYPES or act not in NAN_ACTS:
        raise ValueError(f"no NaN probe for {direction!r}, {dtype!r}, {act!r}")
    spec = CaseSpec(direction, Ratio(1), dtype, act, NAN_SHAPE[1], NAN_GROUPS, geometry=NAN_GEOMETRY)
    return GnCase(spec, NAN_SHAPE, residency=0, tiles=0, cap=None, expected_grid=None, nan_at=NAN_AT)
