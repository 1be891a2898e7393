"""Overflow cases of the task backward (``GN_ARCH=tasks+bwd``), from the schedule model.

The task backward (csrc/gn_backward.cu ``bwd_task_stats``, ``bwd_task_apply``) has one schedule: two
launches over the persistent teams of `schedule.make_task_plan`. Each member of a team takes the tiles
[t0, t1) of every task of its team (`schedule.member_tiles`), reduces them chunk by chunk through its
ring of ``slots`` chunk pairs (x and dy) into one per-channel partial per tile, and the task's last
member sums the partials over tiles in order (``bwd_combine_task``), the window's last sample writing
dweight and dbias; the apply launch reads every chunk again. Nothing is kept on chip, so the backward's
overflow is not a re-read (every chunk is read twice by design): it is a member with more than one tile
of a task, the tile architecture's overflow tile within a team.

**Ratio.** A backward task case's ratio ``xMpK`` says that each task has M x team_size + K tiles, the
team size being the one `schedule.choose_teams` gives the scope's grid: its busiest member reduces
M + ceil(K / team_size) tiles and writes that many partials. ``x1``: one tile per member, in teams that
fill the grid (no room for one more member in every team: two tasks on 132 blocks make two teams of 66,
not of one), the case where no member has two tiles; with teams of more than K members ``x1p1`` gives a
member two tiles, ``x2p1`` three, ``x4p3`` five (a team of one: 2, 3, 7). Where no shape has the exact
count, the nearest of its class (M x team_size < tiles < (M + 1) x team_size; said in the notes). A
member with more chunks than slots also wraps its ring (the notes and the summary say which cases do).

**Shapes, scopes.** The forward task cases' geometries, sample counts and tensor bound
(`pytest_gn.tasks`): ``even``, ``partial``, ``batch`` (teams run several tasks in turn: rounds > 1),
``2_31``. This GPU's capped cases rotate over the caps 1, 2 and 3, its natural cases use its residency
(the occupancy API for ``bwd_task_stats``), a profile's its modelled residency (`schedule.task_model`
with the registers ptxas gives ``bwd_task_stats``) with the grid capped there. The plan weighs no slots
(schedule 2), so a profile's teams are emulated exactly through the cap; only the ring's depth is this
GPU's (said in the notes where it differs).
"""

from __future__ import annotations

from gn_module import schedule
from gn_module.schedule import TaskPlan, TaskTiling
from pytest_gn.cases import BIG, CaseSpec, CaseUnavailable, GnCase, Ratio, TaskRun, big_rows, spatial
from pytest_gn.tasks import (
    BATCH_SAMPLES,
    EVEN_SAMPLES,
    MAX_ELEMENTS,
    Found,
    TaskModel,
    geometry_rows,
    member_tiles,
    probe_tiling,
    tiling_of,
)

#: Sample counts the batch geometry tries where the forward's give no shape: a backward team runs
#: several tasks in turn only when the tasks outnumber the teams (its plan weighs no overflow against
#: rounds), which small teams on a large grid need many samples for.
MORE_BATCH_SAMPLES = (128, 256, 512)

_PLANS: dict[tuple, TaskPlan] = {}


def plan_of(t: TaskTiling, slots: int, residency: int, cap: int | None) -> TaskPlan:
    """`schedule.make_task_plan` of the backward (schedule 2), remembered by what its teams read of the
    tiling (tasks, tiles per task, chunks per tile): the search asks the same ones again for every
    ratio, act and shape. The plan returned is that of the first tiling asked; callers that keep one
    make it again for their own tiling."""
    key = (t.tasks, t.tiles_per_task, t.chunks_per_tile, slots, residency, cap)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) > 1 << 18:
            _PLANS.clear()
        plan = _PLANS[key] = schedule.make_task_plan(t, 2, slots, residency, cap)
    return plan


def grid_bound(p: TaskPlan) -> int:
    """Blocks the plan's grid may use: the residency, under the cap."""
    return max(1, p.residency if p.cap is None else min(p.residency, p.cap))


def ratio_rank(ratio: Ratio, p: TaskPlan) -> tuple[int, bool] | None:
    """Where the plan's tiles per task stand in the ratio's class, nearest first (0: M x team_size + K
    exactly; then, for K > 0, the counts strictly between M and M + 1 team sizes, above first), or None
    outside it, or when the teams do not fill the grid (room for one more member in every team: only an
    ``x1`` plan can have that, a team of as many members as the task has tiles)."""
    assert p.teams is not None
    m, tiles = p.teams.team_size, p.tiling.tiles_per_task
    if p.teams.teams * (m + 1) <= grid_bound(p):
        return None
    want = ratio.mult * m + ratio.plus
    if tiles == want:
        return 0, False
    if ratio.plus > 0 and ratio.mult * m < tiles < (ratio.mult + 1) * m:
        return abs(tiles - want), tiles < want
    return None


def find_shape(spec: CaseSpec, model: TaskModel, cap: int | None) -> Found:
    """The smallest shape of the spec's geometry whose backward plan on the scope's GPU (`model`, under
    `cap`) has the ratio's tiles per task, or the nearest count of its class (`ratio_rank`). Even and
    partial shapes have the fewest samples (1 or 2, else up to 8), batch shapes two or more (up to 64,
    else 128, 256 or 512) and teams that run several tasks (rounds > 1). CaseUnavailable when none fits."""
    probe = probe_tiling(spec)
    if probe is None:
        raise CaseUnavailable(f"{spec.id}: the task kernels do not cover C={spec.channels} {spec.dtype}")
    slots, residency = model(probe)
    if slots < 1 or residency < 1:
        raise CaseUnavailable(
            f"{spec.id}: the task backward cannot run ({slots} slots, {residency} resident blocks)"
        )
    c, g, item = spec.channels, spec.groups, spec.itemsize
    rows = geometry_rows(c, g, item, "partial" if spec.geometry == "partial" else "even")
    if spec.geometry == "batch":
        groups = [BATCH_SAMPLES, MORE_BATCH_SAMPLES]
    else:
        groups = [EVEN_SAMPLES[:2], EVEN_SAMPLES[2:]]
    best: tuple[tuple[int, bool], int, int, int] | None = None  # (rank, elements, samples, rows)
    for samples_set in groups:
        order = sorted((n * s, n, s) for n in samples_set for s, _, _ in rows if n * s * c <= MAX_ELEMENTS)
        for size, n, s in order:
            if best is not None and best[0][0] == 0:
                break
            t = schedule.task_tiling(c, g, s, item, "bwd", batch=n)
            assert t is not None
            p = plan_of(t, slots, residency, cap)
            rank = ratio_rank(spec.ratio, p)
            if rank is None or (spec.geometry == "batch" and p.teams.rounds < 2):
                continue
            if best is None or (rank, size) < best[:2]:
                best = (rank, size, n, s)
        if best is not None:
            break
    if best is None:
        where = f"{residency} resident blocks" + (f" capped at {cap}" if cap is not None else "")
        raise CaseUnavailable(
            f"{spec.id}: no {spec.geometry} shape of at most {MAX_ELEMENTS} elements has tasks of "
            f"{spec.ratio.label} team sizes of tiles (or a count of its class) with {where}"
        )
    _, _, n, s = best
    t = schedule.task_tiling(c, g, s, item, "bwd", batch=n)
    assert t is not None
    if model(t) != (slots, residency):  # same chunk height on the same GPU: the model must agree
        raise RuntimeError(f"{spec.id}: slots/residency {model(t)} of {t} != {(slots, residency)}")
    plan = schedule.make_task_plan(t, 2, slots, residency, cap)
    assert plan.teams is not None and ratio_rank(spec.ratio, plan) == best[0]
    want = spec.ratio.mult * plan.teams.team_size + spec.ratio.plus
    return Found((n, c, *spatial(s, t.rows_per_tile)), t, plan, slots, residency, want)


def _big(spec: CaseSpec, model: TaskModel, cap: int | None) -> Found:
    rows = big_rows(spec.channels)
    shape = (1, spec.channels, *spatial(rows, 1 << 16))
    t = tiling_of(spec, shape)
    slots, residency = model(t)
    if slots < 1 or residency < 1:
        raise CaseUnavailable(f"{spec.id}: the task backward cannot run ({slots} slots, {residency} blocks)")
    p = schedule.make_task_plan(t, 2, slots, residency, cap)
    if member_tiles(p) < 2:
        raise CaseUnavailable(
            f"{spec.id}: no member has two of the {t.tiles_per_task} tiles with {residency} blocks"
        )
    return Found(shape, t, p, slots, residency, t.tiles_per_task)


def describe_plan(p: TaskPlan) -> str:
    assert p.teams is not None
    chunks = p.teams.chunks_per_member
    ring = f"{chunks} chunks over {p.slots} slots" + (": the ring wraps" if chunks > p.slots else "")
    return (
        f"grid {p.grid} = {p.teams.teams} teams x {p.teams.team_size}, {p.teams.rounds} rounds, tasks of "
        f"{p.tiling.tiles_per_task} tiles: busiest member {member_tiles(p)} tiles ({ring})"
    )


def resolve_task_bwd(
    spec: CaseSpec,
    model: TaskModel,
    *,
    cap: int | None = None,
    emulated: bool = False,
    run_model: TaskModel | None = None,
    variant: str | None = None,
    notes: tuple[str, ...] = (),
) -> GnCase:
    """The concrete backward task case for a scope, as `pytest_gn.tasks.resolve_task` makes a forward
    one: `model` gives the scope's slots and residency of the backward (this GPU's, or a profile's with
    `emulated`, which caps the grid at that residency), `cap` the scope's cap, `run_model` what the GPU
    at hand launches with (default: `model`). Raises CaseUnavailable."""
    found = _big(spec, model, cap) if spec.geometry == BIG else find_shape(spec, model, cap)
    t, scope = found.tiling, found.plan
    assert scope.teams is not None
    run_cap = found.residency if emulated else cap
    slots, residency = (run_model or model)(t)
    if slots < 1 or residency < 1:
        raise CaseUnavailable(f"{spec.id}: the task backward cannot run on this GPU")
    run = schedule.make_task_plan(t, 2, slots, residency, run_cap)
    notes = (*notes, f"plan: {describe_plan(scope)}")
    if t.tiles_per_task != found.wanted and spec.geometry != BIG:
        m = scope.teams.team_size
        label = Ratio(spec.ratio.mult, t.tiles_per_task - spec.ratio.mult * m).label
        notes = (*notes, f"tasks of {t.tiles_per_task} tiles ({label} of a team of {m}) instead of "
                         f"{found.wanted} ({spec.ratio.label}), which no {spec.geometry} shape of at most "
                         f"{MAX_ELEMENTS} elements gives")  # fmt: skip
    if emulated and run != schedule.make_task_plan(t, 2, found.slots, found.residency, run_cap):
        why = []
        if slots != found.slots:
            why.append(f"ring depth not emulated: {spec.profile} keeps {found.slots} chunk pairs per block, "
                       f"this GPU {slots}")  # fmt: skip
        if residency < found.residency:
            why.append(f"grid limited by the device ({residency} < emulated {found.residency})")
        notes = (*notes, "; ".join(why) + f"; launched: {describe_plan(run)}")
    task = TaskRun(slots=slots, residency=residency, chunks=scope.teams.chunks_per_member,
                   model_slots=found.slots, team=scope.teams.team_size,
                   member_tiles=member_tiles(scope))  # fmt: skip
    return GnCase(spec, found.shape, found.residency, t.tiles, run_cap, run.grid, variant, notes,
                  t.rows_per_tile, task)  # fmt: skip
