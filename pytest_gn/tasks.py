"""Overflow cases of the task architecture's forward (``GN_ARCH=tasks``), from the schedule model, and
the search both directions share (the backward's cases: `pytest_gn.tasks_bwd`, which takes this
module's geometries, search, resolution and launch-record checks).

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

**Both directions.** `TaskCases` searches and resolves the cases of a direction (`TaskCases.find_shape`,
`TaskCases.big_shape`, `TaskCases.resolve`); what differs is a direction's fields: its plan's schedule,
what the ratio counts (here the busiest member's chunks over slots, in the backward a task's tiles over
team members) and how near a count of the ratio's class is (`chunks_rank`, `tasks_bwd.tiles_rank`),
the batch geometry's sample counts, and the notes' words. FORWARD is the forward's.

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
    rows = math.prod(shape[2:])
    t = schedule.task_tiling(
        c, spec.groups, rows, spec.itemsize, spec.direction, batch=n, wide_itemsize=spec.wide_itemsize
    )
    if t is None:
        raise CaseUnavailable(f"{spec.id}: the task kernels do not cover the shape {list(shape)}")
    return t


def probe_tiling(spec: CaseSpec) -> TaskTiling | None:
    """The task tiling of a large tensor of the spec's channels, dtype and direction (its chunk height
    and vectors)."""
    return schedule.task_tiling(
        spec.channels, spec.groups, 1 << 30, spec.itemsize, spec.direction, wide_itemsize=spec.wide_itemsize
    )


#: Largest tensor (elements) a task case may have; the search looks no further.
MAX_ELEMENTS = 1 << 28


#: The search's plans by schedule: one bounded cache per direction, so that neither direction's search
#: pushes the other's plans out.
_PLANS: dict[int, dict[tuple, TaskPlan]] = {}


def plan_of(t: TaskTiling, schedule_: int, slots: int, residency: int, cap: int | None) -> TaskPlan:
    """`schedule.make_task_plan`, remembered by what its teams read of the tiling (tasks, tiles per
    task, chunks per tile): the search asks the same ones again for every ratio, act, dtype and shape.
    The plan returned is that of the first tiling asked; callers that keep one make it again for their
    own tiling."""
    plans = _PLANS.setdefault(schedule_, {})
    key = (t.tasks, t.tiles_per_task, t.chunks_per_tile, slots, residency, cap)
    plan = plans.get(key)
    if plan is None:
        if len(plans) > 1 << 18:
            plans.clear()
        plan = plans[key] = schedule.make_task_plan(t, schedule_, slots, residency, cap)
    return plan


@functools.lru_cache(maxsize=1024)
def geometry_rows(
    channels: int, groups: int, itemsize: int, geometry: str, batch: int = 1, direction: str = "fwd"
) -> tuple[tuple[int, int, int], ...]:
    """(rows per sample, tiles per task, chunks per tile) of every task tiling of `batch` samples of
    the geometry, smallest first: whole tiles (even, batch), or a partial last tile (partial: half a
    chunk short, and with tiles of several chunks one chunk and a half, so its last chunk holds no
    row). A batch shares a launch's tiles (schedule.max_tiles_per_task, per direction), so it has its
    own list."""
    probe = schedule.task_tiling(channels, groups, 1 << 30, itemsize, direction)
    if probe is None:
        return ()
    cr, most = probe.chunk_rows, schedule.max_tiles_per_task(channels, probe.window, batch, direction)
    found = []
    for q in range(1, MAX_ELEMENTS // (batch * most * cr * channels) + 2):  # beyond: over MAX_ELEMENTS
        # tiles of q > 1 chunks come only with more than max_tiles_per_task x (q - 1) chunks per task
        for tiles in range(1 if q == 1 else most * (q - 1) // q, most + 1):
            rows = schedule.task_rows_for_tiles(
                channels, groups, itemsize, tiles, q, batch=batch, direction=direction
            )
            if not rows:
                continue
            s = rows.stop - 1
            if geometry == "partial":
                s -= cr // 2 if q == 1 else cr + cr // 2
                if tiles < 2 or s not in rows or s % (q * cr) == 0:
                    continue
            if batch * s * channels <= MAX_ELEMENTS:
                found.append((s, tiles, q))
    return tuple(sorted(found))


def same_tiles_batch(channels: int, groups: int, itemsize: int, batch: int, direction: str = "fwd") -> int:
    """1 where `batch` samples tile as one does (the launch's tile budget does not bind), else `batch`:
    the samples whose `geometry_rows` list is the batch's, so that the search computes one list for
    every batch the budget leaves alone."""
    probe = schedule.task_tiling(channels, groups, 1 << 30, itemsize, direction)
    if probe is None:
        return batch
    most = schedule.max_tiles_per_task(channels, probe.window, batch, direction)
    return 1 if most == schedule.max_tiles_per_task(channels, probe.window, 1, direction) else batch


def geometry_holds(t: TaskTiling, geometry: str) -> bool:
    """Whether a tiling has its geometry's tiles: a partial last tile (partial), else whole tiles.
    `geometry_rows` lists one sample's tilings; a batch may tile more coarsely
    (schedule.MAX_TILES_PER_LAUNCH), so the search checks the tiling it gets. (The partial last chunk
    is the rows' own, relative to the full chunk height, which no budget changes; a wide backward's
    half-height chunks may end whole there.)"""
    if geometry == "partial":
        return bool(t.rows % t.rows_per_tile and t.tiles_per_task >= 2)
    return t.rows % t.rows_per_tile == 0


def near_rank(count: int, want: int) -> int:
    """Where a count of a ratio's class stands, nearest to the ratio's own count `want` first and, as
    near, above before below: 2 x the distance, plus 1 below (0: `want` itself)."""
    return 2 * abs(count - want) + (count < want)


def member_tiles(p: TaskPlan) -> int:
    """Tiles of each task the plan's busiest member reduces (`schedule.member_tiles`' longest range)."""
    assert p.teams is not None
    m = p.teams.team_size
    return max(b - a for a, b in (schedule.member_tiles(p.tiling.tiles_per_task, m, i) for i in range(m)))


# ------------------------------------------------------------------ the search, for either direction
@dataclass(frozen=True)
class TaskCases:
    """One direction's task cases: the shape search (`find_shape`, `big_shape`) and the resolution
    (`resolve`) are the same for both directions; the fields are what differs (the forward's: FORWARD
    below; the backward's: `pytest_gn.tasks_bwd.BACKWARD`). A ratio ``xMpK`` asks a plan for a count of
    M x unit + K."""

    direction: str  # the tilings': "fwd" or "bwd"
    schedule: int  # the plans': 1 (the one-pass forward) or 2 (the backward)
    kernel: str  # what cannot run where the scope has no slot or block
    batch_samples: tuple[tuple[int, ...], ...]  # what the batch geometry tries, set after set
    count: Callable[[TaskPlan], int]  # what the ratio counts of a plan
    unit: Callable[[TaskPlan], int]  # ... and in what unit
    rank: Callable[[Ratio, TaskPlan], int | None]  # the plan's `near_rank` in the ratio's class, or None
    no_overflow: Callable[[TaskPlan], str | None]  # why the case over 2**31 elements would not overflow
    # the notes' and errors' words (str.format templates of the names in braces)
    counted: str  # a count the ratio did not get: {count} ({label} of {unit})
    unfound: str  # what no shape has: {ratio}, {slots}, {want} = M x slots + K
    unemulated: str  # a profile's slots this GPU does not have: {profile} {model}, this GPU {run}
    describe: Callable[[TaskPlan], str]  # a plan

    def scope_gpu(self, spec: CaseSpec, model: TaskModel) -> tuple[int, int]:
        """The scope's slots and residency for the spec's channels, dtype and direction."""
        probe = probe_tiling(spec)
        if probe is None:
            raise CaseUnavailable(f"{spec.id}: the task kernels do not cover C={spec.channels} {spec.dtype}")
        slots, residency = model(probe)
        if slots < 1 or residency < 1:
            raise CaseUnavailable(
                f"{spec.id}: {self.kernel} cannot run ({slots} slots, {residency} resident blocks)"
            )
        return slots, residency

    def find_shape(
        self, spec: CaseSpec, model: TaskModel, cap: int | None
    ) -> tuple[tuple[int, ...], TaskPlan]:
        """The shape of the spec's geometry, smallest first, whose plan on the scope's GPU (`model`, under
        `cap`) has the ratio's count, or where no shape of at most MAX_ELEMENTS elements has it the
        nearest of its class (`rank`; said in the notes); with that plan. Even and partial shapes have
        the fewest samples (1 or 2, else up to 8), batch shapes two or more (`batch_samples`) and teams
        that run several tasks (rounds > 1). CaseUnavailable when none fits."""
        slots, residency = self.scope_gpu(spec, model)
        c, g, item, wide = spec.channels, spec.groups, spec.itemsize, spec.wide_itemsize
        kind = "partial" if spec.geometry == "partial" else "even"
        groups = self.batch_samples if spec.geometry == "batch" else (EVEN_SAMPLES[:2], EVEN_SAMPLES[2:])
        best: tuple[int, int, int, int] | None = None  # (rank, elements, samples, rows)
        for samples_set in groups:
            order = sorted(
                (n * s, n, s)
                for n in samples_set
                for s, _, _ in geometry_rows(
                    c, g, item, kind, same_tiles_batch(c, g, item, n, self.direction), self.direction
                )
                if n * s * c <= MAX_ELEMENTS
            )
            for size, n, s in order:
                if best is not None and best[0] == 0:
                    break
                t = schedule.task_tiling(c, g, s, item, self.direction, batch=n, wide_itemsize=wide)
                assert t is not None
                if not geometry_holds(t, spec.geometry):
                    continue
                p = plan_of(t, self.schedule, slots, residency, cap)
                rank = self.rank(spec.ratio, p)
                if rank is None or (spec.geometry == "batch" and p.teams.rounds < 2):
                    continue
                if best is None or (rank, size) < best[:2]:
                    best = (rank, size, n, s)
            if best is not None:
                break
        if best is None:
            where = f"{residency} resident blocks" + (f" capped at {cap}" if cap is not None else "")
            unfound = self.unfound.format(ratio=spec.ratio.label, slots=slots,
                                          want=spec.ratio.mult * slots + spec.ratio.plus)  # fmt: skip
            no = f"no {spec.geometry} shape of at most {MAX_ELEMENTS} elements"
            raise CaseUnavailable(f"{spec.id}: {no} {unfound} with {where}")
        _, _, n, s = best
        t = schedule.task_tiling(c, g, s, item, self.direction, batch=n, wide_itemsize=wide)
        assert t is not None
        if model(t) != (slots, residency):  # same chunk height on the same GPU: the model must agree
            raise RuntimeError(f"{spec.id}: slots/residency {model(t)} of {t} != {(slots, residency)}")
        plan = schedule.make_task_plan(t, self.schedule, slots, residency, cap)
        assert plan.teams is not None and self.rank(spec.ratio, plan) == best[0]
        return (n, c, *spatial(s, t.rows_per_tile)), plan

    def big_shape(
        self, spec: CaseSpec, model: TaskModel, cap: int | None
    ) -> tuple[tuple[int, ...], TaskPlan]:
        """The shape over 2**31 elements (one sample), with its plan on the scope's GPU under `cap`."""
        shape = (1, spec.channels, *spatial(big_rows(spec.channels), 1 << 16))
        t = tiling_of(spec, shape)
        slots, residency = model(t)
        if slots < 1 or residency < 1:
            raise CaseUnavailable(f"{spec.id}: {self.kernel} cannot run ({slots} slots, {residency} blocks)")
        p = schedule.make_task_plan(t, self.schedule, slots, residency, cap)
        why = self.no_overflow(p)
        if why is not None:
            raise CaseUnavailable(f"{spec.id}: {why}")
        return shape, p

    def resolve(
        self,
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
        big = spec.geometry == BIG
        shape, scope = (self.big_shape if big else self.find_shape)(spec, model, cap)
        t = scope.tiling
        assert scope.teams is not None
        run_cap = scope.residency if emulated else cap
        slots, residency = (run_model or model)(t)
        if slots < 1 or residency < 1:
            raise CaseUnavailable(f"{spec.id}: {self.kernel} cannot run on this GPU")
        run = schedule.make_task_plan(t, self.schedule, slots, residency, run_cap)
        notes = (*notes, f"plan: {self.describe(scope)}")
        count, unit, ratio = self.count(scope), self.unit(scope), spec.ratio
        want = ratio.mult * unit + ratio.plus
        if count != want and not big:
            label = Ratio(ratio.mult, count - ratio.mult * unit).label
            notes = (*notes, f"{self.counted.format(count=count, label=label, unit=unit)} instead of {want} "
                             f"({ratio.label}), which no {spec.geometry} shape of at most {MAX_ELEMENTS} "
                             "elements gives")  # fmt: skip
        # what a GPU with the scope's own slots and residency would launch
        as_emulated = schedule.make_task_plan(t, self.schedule, scope.slots, scope.residency, run_cap)
        if emulated and run != as_emulated:
            why = []
            if slots != scope.slots:
                why.append(self.unemulated.format(profile=spec.profile, model=scope.slots, run=slots))
            if residency < scope.residency:
                why.append(f"grid limited by the device ({residency} < emulated {scope.residency})")
            notes = (*notes, "; ".join(why) + f"; launched: {self.describe(run)}")
        task = TaskRun(slots=slots, residency=residency, chunks=scope.teams.chunks_per_member,
                       model_slots=scope.slots, team=scope.teams.team_size,
                       member_tiles=member_tiles(scope))  # fmt: skip
        return GnCase(spec, shape, scope.residency, t.tiles, run_cap, run.grid, variant, notes,
                      t.rows_per_tile, task)  # fmt: skip


# ------------------------------------------------------------------ the forward's
def chunks_rank(ratio: Ratio, p: TaskPlan) -> int | None:
    """Where the busiest member's chunks per task stand in the ratio's class (`near_rank`): M x slots
    + K, then (for K > 0) the counts within one ring of slots of it that stay above M x slots (the ring
    wraps M times and then some); None outside. ``x1`` and ``x2`` (K = 0) take their count only."""
    assert p.teams is not None
    chunks, want = p.teams.chunks_per_member, ratio.mult * p.slots + ratio.plus
    if chunks == want:
        return 0
    if ratio.plus > 0 and chunks > ratio.mult * p.slots and abs(chunks - want) < p.slots:
        return near_rank(chunks, want)
    return None


def describe_plan(p: TaskPlan, unit: str = "chunks") -> str:
    """A plan whose members keep chunks on chip (the forward's; the one-launch backward's keep chunk
    pairs: `unit`)."""
    assert p.teams is not None
    return (
        f"grid {p.grid} = {p.teams.teams} teams x {p.teams.team_size}, {p.teams.rounds} rounds, busiest "
        f"member {p.teams.chunks_per_member} {unit} per task over {p.slots} slots, "
        f"{schedule.task_reread_chunks(p)} {unit} re-read"
    )


def rereads_nothing(p: TaskPlan) -> str | None:
    """Why a plan would not overflow (nothing read twice), or None."""
    if schedule.task_reread_chunks(p) == 0:
        return f"{p.tiling.tiles} tiles re-read nothing with {p.residency} blocks"
    return None


FORWARD = TaskCases(
    direction="fwd",
    schedule=1,
    kernel="the one-pass task kernel",
    batch_samples=(BATCH_SAMPLES,),
    count=lambda p: p.teams.chunks_per_member,
    unit=lambda p: p.slots,
    rank=chunks_rank,
    no_overflow=rereads_nothing,
    counted="busiest member {count} chunks ({label} of {unit} slots)",
    unfound="gives a member {want} chunks ({ratio} of {slots} slots) or a count of its class",
    unemulated="shared memory not emulated: {profile} keeps {model} chunks per block, this GPU {run} "
    "(gn_module has no knob that lowers them)",
    describe=describe_plan,
)
#: The forward's search and resolution (`TaskCases.find_shape`, `TaskCases.resolve`).
find_shape = FORWARD.find_shape
resolve_task = FORWARD.resolve


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
