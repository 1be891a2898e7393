"""Overflow cases of the task backward (``GN_ARCH=tasks+bwd``, and its one-launch kernel under
``GN_ARCH=tasks+bwd1``: `BACKWARD_ONEPASS`), from the schedule model.

The task backward (csrc/gn_backward_tasks.cu ``bwd_task_stats``, ``bwd_task_apply``) has one schedule: two
launches over the persistent teams of `schedule.make_task_plan`. Each member of a team takes the tiles
[t0, t1) of every task of its team (`schedule.member_tiles`), reduces them chunk by chunk through its
ring of ``slots`` chunk pairs (x and dy) into one per-channel and one per-group partial per tile; the
task's last member sums the group partials over tiles in order (``bwd_combine_task``); the apply launch
reads every chunk again, and its blocks sum the channel partials into dweight and dbias
(``bwd_param_sums``). Nothing is kept on chip, so the backward's
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

import functools
from collections.abc import Callable

from gn_module.schedule import TaskPlan
from pytest_gn import tasks
from pytest_gn.cases import CaseSpec, GnCase, Ratio
from pytest_gn.tasks import (
    BATCH_SAMPLES,
    FORWARD,
    TaskCases,
    chunks_rank,
    member_tiles,
    near_rank,
    rereads_nothing,
)

#: Sample counts the batch geometry tries where the forward's give no shape: a backward team runs
#: several tasks in turn only when the tasks outnumber the teams (its plan weighs no overflow against
#: rounds), which small teams on a large grid need many samples for.
MORE_BATCH_SAMPLES = (128, 256, 512)


def grid_bound(p: TaskPlan) -> int:
    """Blocks the plan's grid may use: the residency, under the cap."""
    return max(1, p.residency if p.cap is None else min(p.residency, p.cap))


def tiles_rank(ratio: Ratio, p: TaskPlan) -> int | None:
    """Where the plan's tiles per task stand in the ratio's class (`near_rank`: M x team_size + K
    exactly; then, for K > 0, the counts strictly between M and M + 1 team sizes), or None outside it,
    or when the teams do not fill the grid (room for one more member in every team: only an ``x1`` plan
    can have that, a team of as many members as the task has tiles)."""
    assert p.teams is not None
    m, tiles = p.teams.team_size, p.tiling.tiles_per_task
    if p.teams.teams * (m + 1) <= grid_bound(p):
        return None
    want = ratio.mult * m + ratio.plus
    if tiles == want:
        return 0
    if ratio.plus > 0 and ratio.mult * m < tiles < (ratio.mult + 1) * m:
        return near_rank(tiles, want)
    return None


def describe_plan(p: TaskPlan) -> str:
    assert p.teams is not None
    chunks = p.teams.chunks_per_member
    ring = f"{chunks} chunks over {p.slots} slots" + (": the ring wraps" if chunks > p.slots else "")
    return (
        f"grid {p.grid} = {p.teams.teams} teams x {p.teams.team_size}, {p.teams.rounds} rounds, tasks of "
        f"{p.tiling.tiles_per_task} tiles: busiest member {member_tiles(p)} tiles ({ring})"
    )


def _one_tile_each(p: TaskPlan) -> str | None:
    if member_tiles(p) < 2:
        return f"no member has two of the {p.tiling.tiles_per_task} tiles with {p.residency} blocks"
    return None


BACKWARD = TaskCases(
    direction="bwd",
    schedule=2,
    kernel="the task backward",
    batch_samples=(BATCH_SAMPLES, MORE_BATCH_SAMPLES),
    count=lambda p: p.tiling.tiles_per_task,
    unit=lambda p: p.teams.team_size,
    rank=tiles_rank,
    no_overflow=_one_tile_each,
    counted="tasks of {count} tiles ({label} of a team of {unit})",
    unfound="has tasks of {ratio} team sizes of tiles (or a count of its class)",
    unemulated="ring depth not emulated: {profile} keeps {model} chunk pairs per block, this GPU {run}",
    describe=describe_plan,
)
#: The backward's search and resolution (`pytest_gn.tasks.TaskCases`), as `pytest_gn.tasks` has the
#: forward's.
find_shape = BACKWARD.find_shape
resolve_task_bwd = BACKWARD.resolve


# ------------------------------------------------------------------ the one-launch backward's
#: The one-launch backward (``bwd_task_onepass``, ``GN_ARCH=tasks+bwd1``, case arch ``tasks1``): the
#: same teams, tiles and sums as the two launches in one cooperative launch. Its members keep their last
#: ``slots`` chunk pairs (x and dy) on chip across the task's barrier and read the others again for dx,
#: so its overflow is the forward's: the ratio counts the busiest member's chunk pairs per task over the
#: slots (``x1`` keeps them all; ``x1p1`` reads one again; ``x2p1``, ``x4p3`` wrap the ring). Its runs are
#: the forward's: one launch, one launch under another cap, two launches, all bitwise equal.
BACKWARD_ONEPASS = TaskCases(
    direction="bwd",
    schedule=1,
    kernel="the one-launch task backward",
    batch_samples=(BATCH_SAMPLES, MORE_BATCH_SAMPLES),
    count=FORWARD.count,
    unit=FORWARD.unit,
    rank=chunks_rank,
    no_overflow=rereads_nothing,
    counted="busiest member {count} chunk pairs ({label} of {unit} slots)",
    unfound="gives a member {want} chunk pairs ({ratio} of {slots} slots) or a count of its class",
    unemulated="shared memory not emulated: {profile} keeps {model} chunk pairs per block, this GPU {run}",
    describe=functools.partial(tasks.describe_plan, unit="chunk pairs"),
)
resolve_task_bwd1 = BACKWARD_ONEPASS.resolve


def resolver_of(spec: CaseSpec) -> Callable[..., GnCase]:
    """The resolution of a task case's kind: the forward's, the backward's or the one-launch backward's."""
    if spec.arch == "tasks1":
        return resolve_task_bwd1
    return resolve_task_bwd if spec.direction == "bwd" else FORWARD.resolve
