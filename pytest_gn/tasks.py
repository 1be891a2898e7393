"""Overflow cases of the task architecture's forward (``GN_ARCH=tasks``), from the schedule model (the
backward's: `pytest_gn.tasks_bwd`, which shares this module's geometries and launch-record checks).

The task kernels' overflow is not a grid smaller than the tile count: a task (one sample times one
channel window) is reduced by a team of blocks, each member reducing a contiguous range of the
task's tiles (`schedule.member_tiles`) chunk by chunk and keeping the last ``slots`` chunks in shared
memory for the apply phase. The chunks beyond its slots are the overflow: the apply phase reads them
from global memory again (``chunks_reread`` in the launch record). A smaller residency (a cap, a
smaller GPU) makes smaller teams, longer member ranges and more overflow; less shared memory per SM
(sm_86, sm_89, sm_12x against sm_90) makes fewer slots.

**Ratio.** A task case's ratio ``xMpK`` says that the busiest member of the one-pass plan reduces
``M x slots + K`` chunks of each task (`schedule.TaskTeams.chunks_per_member`), ``slots`` being what
one block keeps on the scope's GPU: ``x1`` fills its slots exactly (nothing is read twice: the
boundary), ``x1p1`` re-reads one chunk per task, ``x2p1`` and ``x4p3`` wrap the ring of slots two and
four times. So every ratio but ``x1`` runs the re-read path (and a planted bug that fires on members
with more chunks than slots, ``scripts/plant_bug.py task-overflow-drop``), and ``x1`` is the case with
no overflow, like the tile architecture's ``x1``.

**Shapes.** `find_shape` searches (samples, rows per sample) for the geometry, smallest tensor first,
and keeps the first whose plan (`schedule.make_task_plan` with `schedule.choose_teams`, as the
launcher makes it) has the ratio's chunk count; tilings come from `schedule.task_rows_for_tiles`
and are checked against `schedule.task_tiling`. Geometries: ``even`` (whole tiles, fewest samples),
``partial`` (the last tile and its last chunk are partial; with tiles of several chunks the last
chunk holds no row at all), ``batch`` (two or more samples and teams that run several tasks in turn:
``rounds`` > 1). ``2_31``: one sample over 2**31 elements, natural residency only.

**Scopes.** This GPU's capped cases rotate over the caps 1, 2 and 3 (``task_caps``), its natural
cases use its own residency (`ops.task_plan`: slots from its shared memory, blocks from the occupancy
API), and a profile's cases the profile's modelled slots and residency (`schedule.task_model` with
the registers ptxas gives ``fwd_task_onepass`` for the profile's arch) with the grid capped at that
residency. The task kernels take their slots from the GPU that runs them and gn_module has no knob
that lowers them, so a profile with less shared memory than this GPU is emulated in residency only:
the case's notes give the chunks its launch really re-reads, and the record is checked against that.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from gn_module import schedule
from gn_module.schedule import TaskPlan, TaskTiling
from pytest_gn.cases import (
    BIG,
    CaseSpec,
    CaseUnavailable,
    GnCase,
    Ratio,
    TaskRun,
    big_rows,
    spatial,
)

#: Caps the capped task cases rotate over (cell i takes TASK_CAPS[i % 3]): one block, which runs every
#: task alone, and two and three, whose teams split tasks.
TASK_CAPS = (1, 2, 3)
#: Sample counts tried, in order, for the even and partial geometries (fewest first) and the batch one.
EVEN_SAMPLES = (1, 2, 3, 4, 6, 8)
BATCH_SAMPLES = (2, 3, 4, 6, 8, 16, 32, 64)

#: A scope's GPU as the task kernels see it: tiling -> (slots, co-resident one-pass blocks).
TaskModel = Callable[[TaskTiling], "tuple[int, int]"]


def target_chunks(spec: CaseSpec, slots: int) -> int:
    """Chunks of each task the busiest member reduces under the spec's ratio: M x slots + K."""
    return spec.ratio.mult * slots + spec.ratio.plus


def tiling_of(spec: CaseSpec, shape: tuple[int, ...]) -> TaskTiling:
    """The task tiling of the spec's direction for `shape`."""
    n, c = shape[0], shape[1]
    t = schedule.task_tiling(c, spec.groups, math.prod(shape[2:]), spec.itemsize, spec.direction, batch=n)
    if t is None:
        raise CaseUnavailable(f"{spec.id}: the task kernels do not cover the shape {list(shape)}")
    return t


def probe_tiling(spec: CaseSpec) -> TaskTiling | None:
    """The task tiling of a large tensor of the spec's channels, dtype and direction (its chunk height
    and vectors)."""
    return schedule.task_tiling(spec.channels, spec.groups, 1 << 30, spec.itemsize, spec.direction)


#: Largest tensor (elements) a task case may have; the search looks no further.
MAX_ELEMENTS = 1 << 28


_TEAMS: dict[tuple[int, ...], schedule.TaskTeams] = {}


def _teams(t: TaskTiling, blocks: int, slots: int) -> schedule.TaskTeams:
    """`schedule.choose_teams`, remembered by what it reads of the tiling (tasks, tiles per task,
    chunks per tile): the search asks the same ones again for every ratio, act, dtype and shape."""
    key = (t.tasks, t.tiles_per_task, t.chunks_per_tile, blocks, slots)
    teams = _TEAMS.get(key)
    if teams is None:
        if len(_TEAMS) > 1 << 18:
            _TEAMS.clear()
        teams = _TEAMS[key] = schedule.choose_teams(t, blocks, slots)
    return teams


@dataclass(frozen=True)
class Found:
    shape: tuple[int, ...]
    tiling: TaskTiling
    plan: TaskPlan  # the scope's one-pass plan (the ratio is its busiest member's chunks)
    slots: int
    residency: int
    wanted: int  # the ratio's own count (the plan's may be the nearest of its class)


@functools.lru_cache(maxsize=1024)
def geometry_rows(
    channels: int, groups: int, itemsize: int, geometry: str
) -> tuple[tuple[int, int, int], ...]:
    """(rows per sample, tiles per task, chunks per tile) of every task tiling of the geometry,
    smallest first: whole tiles (even, batch), or a partial last tile (partial: half a chunk short,
    and with tiles of several chunks one chunk and a half, so its last chunk holds no row)."""
    probe = schedule.task_tiling(channels, groups, 1 << 30, itemsize, "fwd")
    if probe is None:
        return ()
    cr, most = probe.chunk_rows, schedule.MAX_TILES_PER_TASK
    found = []
    for q in range(1, MAX_ELEMENTS // (most * cr * channels) + 2):  # beyond: over MAX_ELEMENTS
        # tiles of q > 1 chunks come only with more than MAX_TILES_PER_TASK x (q - 1) chunks per task
        for tiles in range(1 if q == 1 else most * (q - 1) // q, most + 1):
            rows = schedule.task_rows_for_tiles(channels, groups, itemsize, tiles, q)
            if not rows:
                continue
            s = rows.stop - 1
            if geometry == "partial":
                s -= cr // 2 if q == 1 else cr + cr // 2
                if tiles < 2 or s not in rows or s % (q * cr) == 0:
                    continue
            if s * channels <= MAX_ELEMENTS:
                found.append((s, tiles, q))
    return tuple(sorted(found))


def class_counts(spec: CaseSpec, slots: int) -> list[int]:
    """The busiest member's chunk counts a case of the spec's ratio may have, nearest first: M x slots
    + K, then (for K > 0) the counts within one ring of slots of it that stay above M x slots, above
    first (the ring wraps M times and then some). ``x1`` and ``x2`` (K = 0) take their count only."""
    want = spec.ratio.mult * slots + spec.ratio.plus
    out = [want]
    if spec.ratio.plus > 0:
        for d in range(1, slots):
            out += [c for c in (want + d, want - d) if c > spec.ratio.mult * slots]
    return out


def find_shape(spec: CaseSpec, model: TaskModel, cap: int | None) -> Found:
    """The shape of the spec's geometry, smallest first, whose one-pass task plan on the scope's GPU
    (`model`, under `cap`) gives the busiest member ratio x slots chunks per task; where no shape of at
    most MAX_ELEMENTS elements has that count, the nearest count of the ratio class (said in the notes).
    Even and partial shapes have the fewest samples (1 or 2, else up to 8), batch shapes two or more
    and teams that run several tasks (rounds > 1). CaseUnavailable when none fits."""
    probe = probe_tiling(spec)
    if probe is None:
        raise CaseUnavailable(f"{spec.id}: the task kernels do not cover C={spec.channels} {spec.dtype}")
    slots, residency = model(probe)
    if slots < 1 or residency < 1:
        raise CaseUnavailable(
            f"{spec.id}: the one-pass task kernel cannot run ({slots} slots, {residency} resident blocks)"
        )
    blocks = residency if cap is None else min(residency, cap)
    wanted = class_counts(spec, slots)
    rank = {c: i for i, c in enumerate(wanted)}
    c, g, item = spec.channels, spec.groups, spec.itemsize
    rows = geometry_rows(c, g, item, "partial" if spec.geometry == "partial" else "even")
    groups = [BATCH_SAMPLES] if spec.geometry == "batch" else [EVEN_SAMPLES[:2], EVEN_SAMPLES[2:]]
    best: tuple[int, int, int, int] | None = None  # (rank, elements, samples, rows)
    for samples_set in groups:
        order = sorted((n * s, n, s) for n in samples_set for s, _, _ in rows if n * s * c <= MAX_ELEMENTS)
        for size, n, s in order:
            if best is not None and best[0] == 0:
                break
            t = schedule.task_tiling(c, g, s, item, "fwd", batch=n)
            assert t is not None
            teams = _teams(t, blocks, slots)
            i = rank.get(teams.chunks_per_member)
            if i is None or (spec.geometry == "batch" and teams.rounds < 2):
                continue
            if best is None or (i, size) < best[:2]:
                best = (i, size, n, s)
        if best is not None:
            break
    if best is None:
        where = f"{residency} resident blocks" + (f" capped at {cap}" if cap is not None else "")
        raise CaseUnavailable(
            f"{spec.id}: no {spec.geometry} shape of at most {MAX_ELEMENTS} elements gives a member "
            f"{wanted[0]} chunks ({spec.ratio.label} of {slots} slots) or a count of its class with {where}"
        )
    _, _, n, s = best
    t = schedule.task_tiling(c, g, s, item, "fwd", batch=n)
    assert t is not None
    if model(t) != (slots, residency):  # same chunk height on the same GPU: the model must agree
        raise RuntimeError(f"{spec.id}: slots/residency {model(t)} of {t} != {(slots, residency)}")
    plan = schedule.make_task_plan(t, 1, slots, residency, cap)
    assert plan.teams is not None and plan.teams.chunks_per_member in rank
    return Found((n, c, *spatial(s, t.rows_per_tile)), t, plan, slots, residency, wanted[0])


def _big(spec: CaseSpec, model: TaskModel, cap: int | None) -> Found:
    rows = big_rows(spec.channels)
    shape = (1, spec.channels, *spatial(rows, 1 << 16))
    t = tiling_of(spec, shape)
    slots, residency = model(t)
    if slots < 1 or residency < 1:
        raise CaseUnavailable(
            f"{spec.id}: the one-pass task kernel cannot run ({slots} slots, {residency} blocks)"
        )
    p = schedule.make_task_plan(t, 1, slots, residency, cap)
    if schedule.task_reread_chunks(p) == 0:
        raise CaseUnavailable(f"{spec.id}: {t.tiles} tiles re-read nothing with {residency} blocks")
    return Found(shape, t, p, slots, residency, p.teams.chunks_per_member if p.teams else 0)


def member_tiles(p: TaskPlan) -> int:
    """Tiles of each task the plan's busiest member reduces (`schedule.member_tiles`' longest range)."""
    assert p.teams is not None
    m = p.teams.team_size
    return max(b - a for a, b in (schedule.member_tiles(p.tiling.tiles_per_task, m, i) for i in range(m)))


def describe_plan(p: TaskPlan) -> str:
    assert p.teams is not None
    return (
        f"grid {p.grid} = {p.teams.teams} teams x {p.teams.team_size}, {p.teams.rounds} rounds, busiest "
        f"member {p.teams.chunks_per_member} chunks per task over {p.slots} slots, "
        f"{schedule.task_reread_chunks(p)} chunks re-read"
    )


def resolve_task(
    spec: CaseSpec,
    model: TaskModel,
    *,
    cap: int | None = None,
    emulated: bool = False,
    run_model: TaskModel | None = None,
    variant: str | None = None,
    notes: tuple[str, ...] = (),
) -> GnCase:
    """The concrete task case for a scope: `model` gives the scope's slots and residency (this GPU's,
    or a profile's modelled ones with `emulated`, which caps the grid at that residency); `cap` is the
    scope's residency cap. `run_model` is what the GPU at hand launches with (default: `model`): the
    expected launch uses its slots and residency under the case's cap. Raises CaseUnavailable."""
    found = _big(spec, model, cap) if spec.geometry == BIG else find_shape(spec, model, cap)
    t, scope = found.tiling, found.plan
    assert scope.teams is not None
    run_cap = found.residency if emulated else cap
    slots, residency = (run_model or model)(t)
    if slots < 1 or residency < 1:
        raise CaseUnavailable(f"{spec.id}: the one-pass task kernel cannot run on this GPU")
    run = schedule.make_task_plan(t, 1, slots, residency, run_cap)
    notes = (*notes, f"plan: {describe_plan(scope)}")
    if scope.teams.chunks_per_member != found.wanted and spec.geometry != BIG:
        k = scope.teams.chunks_per_member - spec.ratio.mult * found.slots
        label = Ratio(spec.ratio.mult, k).label
        notes = (*notes, f"busiest member {scope.teams.chunks_per_member} chunks ({label} of {found.slots} "
                         f"slots) instead of {found.wanted} ({spec.ratio.label}), which no {spec.geometry} "
                         f"shape of at most {MAX_ELEMENTS} elements gives")  # fmt: skip
    if emulated and run != schedule.make_task_plan(t, 1, found.slots, found.residency, run_cap):
        why = []
        if slots != found.slots:
            why.append(f"shared memory not emulated: {spec.profile} keeps {found.slots} chunks per block, "
                       f"this GPU {slots} (gn_module has no knob that lowers them)")  # fmt: skip
        if residency < found.residency:
            why.append(f"grid limited by the device ({residency} < emulated {found.residency})")
        notes = (*notes, "; ".join(why) + f"; launched: {describe_plan(run)}")
    task = TaskRun(slots=slots, residency=residency, chunks=scope.teams.chunks_per_member,
                   model_slots=found.slots, team=scope.teams.team_size,
                   member_tiles=member_tiles(scope))  # fmt: skip
    return GnCase(spec, found.shape, found.residency, t.tiles, run_cap, run.grid, variant, notes,
                  t.rows_per_tile, task)  # fmt: skip


# ------------------------------------------------------------------ what the launch must show
def expected_plan(case: GnCase, schedule_: int, cap: int | None) -> TaskPlan:
    """The model's plan of the case's shape on the GPU at hand (`case.task`) under `cap`."""
    assert case.task is not None
    return schedule.make_task_plan(tiling_of(case.spec, case.shape), schedule_, case.task.slots,
                                   case.task.residency, cap)  # fmt: skip


def record_problems(rec: dict | None, plan: TaskPlan, label: str) -> list[str]:
    """What a launch record of the task kernels (forward or backward, the plan's direction) must show
    for `plan`: the task architecture and the plan's schedule, its grid, every tile reduced and applied,
    and the chunks re-read the model predicts (summed over blocks); the launcher's plan must be the
    model's."""
    if rec is None:
        which = "forward" if plan.direction == "fwd" else "backward"
        return [f"{label}: no launch record for the {which} kernels (did the fast path run?)"]
    problems = []
    launched = rec.get("plan")
    if launched is not None and launched != plan:
        problems.append(f"{label}: the launcher planned {_short(launched)}, the model {_short(plan)}")
    want = {"arch": 2, "schedule": plan.schedule, "grid": plan.grid, "tiles_phase1": plan.tiles,
            "tiles_applied": plan.tiles, "chunks_reread": schedule.task_reread_chunks(plan)}  # fmt: skip
    for key, value in want.items():
        if rec.get(key) != value:
            problems.append(f"{label}: {key} {rec.get(key)} != {value} (model: {_short(plan)})")
    return problems


def _short(p: object) -> str:
    if not isinstance(p, TaskPlan):
        return repr(p)
    teams = p.teams
    team = f"{teams.teams}x{teams.team_size}" if teams is not None else "-"
    return (f"schedule {p.schedule} slots {p.slots} residency {p.residency} cap {p.cap} grid {p.grid} "
            f"teams {team}")  # fmt: skip
