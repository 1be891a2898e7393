"""The task backward's overflow cases (pytest_gn.tasks_bwd), on the CPU: the specs, the case generator
against the schedule model (every case has the ratio it claims: tiles per task over the team's members),
every tile in both launches, the profiles' emulation, the planted bug's reach, and the runner's runs."""

from __future__ import annotations

import dataclasses
import functools
import os

import pytest
import task_case_helpers as helpers
from task_case_helpers import BUILTIN, NUMBERS, THIS_GPU, Direction, in_scope, tiling_of

from gn_module import profiles, schedule
from gn_module.schedule import TaskPlan
from pytest_gn import tasks, tasks_bwd
from pytest_gn.cases import (
    REF_KINK_BYTES_PER_ELEMENT,
    CaseSpec,
    CaseUnavailable,
    GnCase,
    Ratio,
    memory_estimate,
    specs_from_marker,
)
from pytest_gn.runner import case_context, case_from_json, case_to_json, task_runs

#: What ptxas gives bwd_task_stats on sm_90 (117-126 registers with 16-byte vectors, 70-72 on the
#: scalar path; 16 bytes of static shared memory): the residency's shared memory decides either way.
BWD_REGISTERS = schedule.KernelResources(126, 16)
BACKWARD = Direction("bwd", BWD_REGISTERS, 2, tasks_bwd.resolve_task_bwd)
model_of, scope_plan = BACKWARD.model_of, BACKWARD.scope_plan
#: `Direction.resolve`, remembered: cases are frozen.
resolve = functools.cache(BACKWARD.resolve)
RATIOS = {"x1", "x1p1", "x2p1", "x4p3"}
ACTS = {None, "silu", "relu", "gelu", "gelu_tanh"}  # every scope runs every activation (issue 14)


SPECS = helpers.sweep_specs("bwd")
SCOPES = helpers.scopes(SPECS)


def run_plans(case: GnCase) -> list[TaskPlan]:
    """The plans of the case's runs on this GPU (`runner.task_runs`): its own cap, then caps 1 and 2."""
    out = []
    for _label, passes, extra in task_runs(case, case.cap):
        cap = case.cap if extra is None else extra
        out.append(tasks.expected_plan(case, passes, cap))
    return out


# ------------------------------------------------------------------ specs
def test_backward_task_specs_have_readable_stable_ids() -> None:
    specs = helpers.default_specs("bwd")
    ids = [s.id for s in specs]
    assert all(s.arch == "tasks" and s.env_arch == "tasks+bwd" for s in specs)
    forward = specs_from_marker({"directions": ("fwd",)}, archs=("tasks",))
    assert helpers.default_specs("fwd") == forward  # the backward's cells come after
    assert ids[:3] == ["bwd-tasks-cap1-x1-fp16-silu-c64g1", "bwd-tasks-cap2-x1-fp16-noact-c64g1-partial",
                       "bwd-tasks-cap3-x1-bf16-relu-c64g1-batch"]  # fmt: skip
    assert ids[-1] == "bwd-tasks-x4p3-fp32-noact-c100g20"
    capped = [s for s in specs if s.variant == "capped"]
    for k in (1, 2, 3):  # every cap meets every ratio
        assert {s.ratio.label for s in capped if s.cap == k} == RATIOS
    alone = specs_from_marker({"directions": ("bwd",)}, archs=("tasks",))
    assert len(alone) == 96 and alone[0].id == "bwd-tasks-cap1-x1-fp16-silu"  # numbered from 0 alone
    assert [s.id for s in alone if s.arch == "tasks1"][:1] == ["bwd-tasks1-cap1-x1-fp16-silu-c64g1"]
    assert specs_from_marker({"directions": ("bwd",)}, archs=("tasks",), foreign=True) == []
    assert [s.env_arch for s in specs_from_marker({"directions": ("bwd",)})] == ["tiles"] * 48
    assert CaseSpec("bwd", Ratio(1), "fp16", None, 30, 10, arch="tasks").config == "bwd_task_stats[fp16,vec1]"


def test_the_sweep_gives_every_profile_24_backward_task_cases_that_meet_every_kind() -> None:
    assert [s.id for s in SPECS if s.big] == ["bwd-tasks-2_31-bf16-silu-c1024g32"]
    helpers.assert_every_scope_has_24_cases_of_every_kind(SPECS)
    for scope in SCOPES:
        mine = in_scope(SPECS, scope)
        assert {s.ratio.label for s in mine} == RATIOS and {s.act for s in mine} == ACTS, scope
    both = specs_from_marker({"over_2_31": True}, profiles=BUILTIN, profile_numbers=NUMBERS, archs=("tasks",))
    assert len(both) == 3 * 337  # as many backward and one-launch backward task cases as forward ones


# ------------------------------------------------------------------ every case has the ratio it claims
def assert_claim(case: GnCase) -> None:
    """The case's shape, run through the model, has tasks of M x team_size + K tiles (or, said in the
    notes, the nearest count strictly between M and M + 1 team sizes); its busiest member reduces
    M + ceil(K / team_size) tiles; the team is as large as the grid allows; and the geometry holds."""
    spec, t, p = case.spec, tiling_of(case), scope_plan(case)
    m, tiles, ratio = p.teams.team_size, t.tiles_per_task, spec.ratio
    assert (case.task.team, case.task.member_tiles, case.task.chunks) == (
        m, tasks.member_tiles(p), p.teams.chunks_per_member), spec.id  # fmt: skip
    assert case.task.model_slots == p.slots and case.tiles == t.tiles == p.tiles, spec.id
    want = ratio.mult * m + ratio.plus
    if tiles != want:
        assert ratio.plus > 0 and ratio.mult * m < tiles < (ratio.mult + 1) * m, spec.id
        assert any(f"instead of {want} ({ratio.label})" in note for note in case.notes), case.notes
    assert tasks.member_tiles(p) == -(-tiles // m) == ratio.mult + -(-(tiles - ratio.mult * m) // m), spec.id
    assert (tasks.member_tiles(p) == 1) == (ratio.label == "x1"), spec.id  # several tiles: all but x1
    assert p.teams.teams * (m + 1) > tasks_bwd.grid_bound(p), spec.id  # no room for one more member
    helpers.assert_geometry(case, t, p)


@pytest.mark.parametrize("geometry", helpers.GEOMETRIES)
@pytest.mark.parametrize("scope", helpers.CELL_SCOPES)
def test_every_kind_and_cell_has_its_ratio(scope: str, geometry: str) -> None:
    for spec in helpers.every_cell("bwd", scope, geometry):
        try:
            case = resolve(spec)
        except CaseUnavailable:
            # x1 with a partial last tile needs a team of two or more members of one tile each: cap 1
            # has teams of one, and cap 2 gives C=128 (two tasks per sample) two teams of one
            assert (spec.ratio.label, spec.geometry, spec.cap, spec.variant) in (
                ("x1", "partial", 1, "capped"), ("x1", "partial", 2, "capped")), spec.id  # fmt: skip
            assert spec.cap == 1 or spec.channels == 128, spec.id
            continue
        assert_claim(case)


@pytest.mark.parametrize("scope", SCOPES)
def test_every_backward_task_case_of_the_sweep_has_the_ratio_it_claims(scope: str) -> None:
    for spec in in_scope(SPECS, scope):
        assert_claim(resolve(spec))


def test_the_case_over_2_31_elements_gives_members_several_tiles() -> None:
    (spec,) = [s for s in SPECS if s.big]
    case = resolve(spec)
    assert case.numel > 2**31 and case.shape[0] == 1 and case.spec.env_arch == "tasks+bwd"
    p = scope_plan(case)
    assert case.task.member_tiles == tasks.member_tiles(p) >= 2
    assert case.bytes_needed() < 40 * 2**30


def test_a_shape_the_task_kernels_do_not_cover_is_unavailable() -> None:
    BACKWARD.assert_unavailable_where_the_kernels_cannot_run()


def test_resolution_is_quick_enough_for_a_sweep() -> None:
    specs = [s for s in SPECS if s.profile == "GB10" or (s.profile is None and not s.big)]
    # 72 cases, cold: 21-23 s on the 2-core dev machine
    assert helpers.seconds_to_resolve(resolve.__wrapped__, specs) < 30


# ------------------------------------------------------------------ every tile in both launches
def kernel_counts(p: TaskPlan) -> tuple[list[int], int, int, int]:
    """(times each (task, tile) partial is written, tiles reduced, tiles applied, chunks read again),
    as bwd_task_stats and bwd_task_apply in csrc/gn_backward_tasks.cu walk them: block -> team = block / m,
    member = block % m, the tiles [t0, t1) of `member_tiles`, the tasks team, team + teams, ... (the
    apply launch from its last down); the apply reads every chunk again."""
    t, teams = p.tiling, p.teams
    written = [0] * (t.tasks * t.tiles_per_task)
    reduced = applied = reread = 0
    for block in range(p.grid):
        team, member = divmod(block, teams.team_size)
        t0, t1 = schedule.member_tiles(t.tiles_per_task, teams.team_size, member)
        for task in range(team, t.tasks, teams.teams):
            for tile in range(t0, t1):
                written[task * t.tiles_per_task + tile] += 1
            reduced += t1 - t0
        if team < teams.teams and team < t.tasks:
            last = team + (t.tasks - 1 - team) // teams.teams * teams.teams
            for _task in range(last, team - 1, -teams.teams):
                applied += t1 - t0
                reread += (t1 - t0) * t.chunks_per_tile
    return written, reduced, applied, reread


@pytest.mark.parametrize("scope", ["capped", "natural", "A100", "RTX4090", "GB10"])
def test_every_tile_of_every_case_is_in_both_launches_at_every_cap(scope: str) -> None:
    for spec in in_scope(SPECS, scope):
        case = resolve(spec)
        for p in [scope_plan(case), *run_plans(case)]:
            written, reduced, applied, reread = kernel_counts(p)
            assert set(written) == {1}, spec.id  # every tile's partial, once
            assert reduced == applied == p.tiles and reread == schedule.task_reread_chunks(p), spec.id


# ------------------------------------------------------------------ profiles
def test_a_profiles_teams_are_emulated_exactly_only_the_ring_depth_is_this_gpus() -> None:
    spec = CaseSpec("bwd", Ratio(2, 1), "fp16", "silu", profile="RTX3090", arch="tasks")
    alone, on_h200 = resolve(spec), resolve(spec, run_on="H200")
    assert alone.shape == on_h200.shape and alone.expected_grid == on_h200.expected_grid
    assert (alone.task.team, alone.task.member_tiles) == (on_h200.task.team, on_h200.task.member_tiles)
    launched = tasks.expected_plan(on_h200, 2, on_h200.cap)
    scope = scope_plan(on_h200)
    assert launched.teams == scope.teams and launched.grid == scope.grid == on_h200.expected_grid
    assert launched.slots != scope.slots
    assert "ring depth not emulated: RTX3090 keeps" in on_h200.notes[-1], on_h200.notes


def test_a_profile_case_limited_by_this_gpus_grid_says_so() -> None:
    small = profiles.limits_for("Small", (9, 0), 8)
    spec = CaseSpec("bwd", Ratio(1, 1), "fp16", "silu", 64, 1, profile="Thor", arch="tasks")
    run = lambda t: schedule.task_model(small, BWD_REGISTERS, t)  # noqa: E731
    case = tasks_bwd.resolve_task_bwd(spec, model_of("Thor"), emulated=True, run_model=run)
    assert case.task.residency < case.residency
    assert "grid limited by the device" in case.notes[-1], case.notes


# ------------------------------------------------------------------ the planted bug's reach
def planted_fires(case: GnCase) -> list[bool]:
    """Per run of the case on an H200 (`run_plans`): whether ``task-bwd-overflow-drop`` fires, i.e. some
    member has more than one tile of a task."""
    return [tasks.member_tiles(p) > 1 for p in run_plans(case)]


def test_the_planted_backward_bug_fires_in_every_case_but_the_x1_cases_of_one_tile() -> None:
    """``scripts/plant_bug.py task-bwd-overflow-drop`` loses the last tile's partial of every member with
    more than one tile. Every case outside x1 gives a member several tiles in its first run; the x1 cases
    do not, but their runs under cap 1 (and 2) do whenever a task has more than one tile: so on a GPU
    every backward task case goes red (-k bwd-tasks) except the x1 cases of one tile per task."""
    planting = helpers.plant_bug().PLANTINGS["task-bwd-overflow-drop"]
    assert "t1 - t0 > 1 && tile == t1 - 1" in planting.replacement and planting.select == "bwd-tasks"
    green = []
    for spec in (s for s in SPECS if s.profile is None or s.profile in BUILTIN):
        case = resolve(spec, run_on=THIS_GPU if spec.profile else None)
        fires = planted_fires(case)
        limited = any("grid limited by the device" in note for note in case.notes)  # other teams run
        assert fires[0] == (spec.ratio.label != "x1" or spec.big) or limited, spec.id
        if not any(fires):
            green.append(spec.id)
            assert spec.ratio.label == "x1" and tiling_of(case).tiles_per_task == 1, spec.id
    this_gpu = [i for i in green if not any(i.startswith(p + "-") for p in BUILTIN)]
    assert this_gpu == ["bwd-tasks-cap1-x1-fp16-silu-c64g1", "bwd-tasks-cap3-x1-bf16-relu-c64g1-batch",
                        "bwd-tasks-cap1-x1-bf16-noact-c32g32",
                        "bwd-tasks-cap3-x1-fp32-noact-c32g32-batch"], green  # fmt: skip
    assert 0 < len(green) - len(this_gpu) <= 24  # a profile's x1 batch cases: teams of one, one tile each


# ------------------------------------------------------------------ what the runner checks
X2P1 = Ratio(2, 1)


def _case(cap: int | None = 3, ratio: Ratio = X2P1, geometry: str = "even") -> GnCase:
    spec = CaseSpec("bwd", ratio, "fp16", "silu", 64, 1, variant="capped" if cap else "natural", cap=cap or 3,
                    geometry=geometry, arch="tasks")  # fmt: skip
    return tasks_bwd.resolve_task_bwd(spec, model_of(THIS_GPU), cap=cap)


def test_a_backward_case_runs_under_its_cap_then_the_lower_of_caps_1_and_2() -> None:
    labels = lambda cap: [(label, extra) for label, _, extra in task_runs(_case(cap), cap)]  # noqa: E731
    assert labels(None) == [("natural", None), ("cap 1", 1), ("cap 2", 2)]
    assert labels(3) == [("cap 3", None), ("cap 1", 1), ("cap 2", 2)]
    assert labels(2) == [("cap 2", None), ("cap 1", 1)]
    assert labels(1) == [("cap 1", None), ("cap 2", 2)]  # the extra run's cap replaces the case's
    assert {passes for _, passes, _ in task_runs(_case(None), None)} == {2}  # one schedule


def test_the_record_of_a_backward_launch_must_show_the_model_plan() -> None:
    case = _case()
    plan = tasks.expected_plan(case, 2, case.cap)
    assert plan.direction == "bwd" and plan.grid == case.expected_grid
    good = helpers.good_record(plan)
    assert good["chunks_reread"] == plan.tiles * plan.tiling.chunks_per_tile  # the apply reads them all
    assert tasks.record_problems(good, plan, "cap 3") == []
    for key, value in (("tiles_phase1", plan.tiles - 1), ("tiles_applied", 0), ("grid", plan.grid + 1)):
        problems = tasks.record_problems({**good, key: value}, plan, "cap 3")
        assert len(problems) == 1 and problems[0].startswith(f"cap 3: {key} {value} != "), problems
    assert tasks.record_problems(None, plan, "cap 1") == [
        "cap 1: no launch record for the backward kernels (did the fast path run?)"
    ]


def test_backward_task_cases_survive_json_and_size_their_memory() -> None:
    case = _case()
    assert case_from_json(case_to_json(case)) == case
    summary = case.summary()
    assert summary["direction"] == "bwd" and summary["arch"] == "tasks"
    assert (summary["team"], summary["member_tiles"]) == (case.task.team, case.task.member_tiles) and (
        case.task.member_tiles == 3)  # fmt: skip
    t = tiling_of(case)
    workspace = 4 * sum(schedule.make_task_plan(t, 2, 1, 1).workspace_floats.values())
    assert memory_estimate(case) >= 5 * case.numel * case.spec.itemsize + workspace
    # a ReLU case also holds the allowances at ReLU's kink, per element of its reference chunk
    relu = dataclasses.replace(case, spec=dataclasses.replace(case.spec, act="relu"))
    assert memory_estimate(relu) - memory_estimate(case) == case.numel * REF_KINK_BYTES_PER_ELEMENT


def _fake_kernels(case: GnCase, monkeypatch, bug: str = "") -> list[dict]:
    """A CPU stand-in for gn_module under GN_ARCH=tasks+bwd: torch's GroupNorm, and when its gradient
    flows back, a backward launch record from the model's plan for the cap in force (what the task
    backward records). `bug`: "tile-drop" moves the gradient wherever a member has several tiles of a
    task (as the planted bug does), "record" records a tile too few, "cap1" moves it under cap 1."""
    from gn_module import ops

    calls: list[dict] = []
    record: dict = {}

    def group_norm(x, num_groups, weight, bias, eps, act, passes):
        assert os.environ.get("GN_ARCH") == "tasks+bwd"
        cap = ops.current_cap()
        plan = tasks.expected_plan(case, 2, cap)
        y = helpers.torch_group_norm(x, num_groups, weight, bias, eps, act)
        calls.append({"passes": passes, "cap": cap, "poisoned": bool(ops._poison)})

        def on_backward(grad):
            record["bwd"] = {**helpers.good_record(plan), "tiles_applied": plan.tiles - (bug == "record")}
            moved = (bug == "tile-drop" and tasks.member_tiles(plan) > 1) or (bug == "cap1" and cap == 1)
            return grad * 2 if moved else grad

        y.register_hook(on_backward)
        return y

    helpers.patch_kernels(monkeypatch, group_norm, record)
    return calls


BUGS = [
    ("", None, X2P1),
    ("tile-drop", "(fp64 reference)", X2P1),
    ("tile-drop", "dx: cap 1 differs from the first cap 3 run", Ratio(1)),  # x1: the cap-1 run fires
    ("record", "cap 3: tiles_applied", X2P1),
    ("cap1", "dweight: cap 1 differs from the first cap 3 run", Ratio(1, 1)),
]


@pytest.mark.parametrize(("bug", "problem", "ratio"), BUGS)
def test_the_runner_checks_a_backward_task_case_at_three_caps(monkeypatch, bug, problem, ratio) -> None:
    pytest.importorskip("torch")
    from pytest_gn.runner import check_case

    monkeypatch.delenv("GN_MAX_RESIDENT_BLOCKS", raising=False)
    monkeypatch.delenv("GN_ARCH", raising=False)
    case = _case(3, ratio, "partial")  # C=64 G=1, one task per sample: a team of three at cap 3
    if ratio == Ratio(1):
        assert case.task.member_tiles == 1 and tiling_of(case).tiles_per_task > 1
    calls = _fake_kernels(case, monkeypatch, bug)
    result = check_case(case, None, 0, device="cpu")
    assert [(c["passes"], c["cap"]) for c in calls] == [(2, 3), (2, 1), (2, 2)]  # its cap, then 1 and 2
    assert all(c["poisoned"] for c in calls)
    assert set(result.record) == {"bwd"} and result.record["bwd"]["grid"] == case.expected_grid
    helpers.assert_outcome(result, problem)


def test_case_context_runs_a_backward_task_case_under_tasks_bwd(monkeypatch) -> None:
    monkeypatch.setenv("GN_ARCH", "tiles")
    case = _case()
    with case_context(case):
        assert os.environ["GN_ARCH"] == "tasks+bwd"
    assert os.environ["GN_ARCH"] == "tiles"


def test_the_summary_counts_the_backward_task_cases_apart() -> None:
    from pytest_gn.report import Tally, scope_lines, task_lines

    tally = Tally()
    fwd = tasks.resolve_task(CaseSpec("fwd", X2P1, "fp16", "silu", arch="tasks"), model_of(THIS_GPU))
    for case, outcome in ((fwd, "passed"), (_case(None), "failed"), (_case(None, Ratio(1)), "passed")):
        tally.add(case.summary(), outcome)
    lines = task_lines(tally)
    assert lines[0].startswith("task forward cases (GN_ARCH=tasks): 1 run, 1 with members over their slots")
    assert lines[1].startswith(
        "task backward cases (GN_ARCH=tasks+bwd): 2 run, 1 with members of several tiles"
    )
    team = _case(None).task.team
    heaviest = f"bwd-tasks-x2p1-fp16-silu-c64g1: busiest member 3 tiles per task in a team of {team}"
    assert lines[1].endswith(heaviest)
    assert "3 of them task kernel cases (1 forward, 2 backward)" in scope_lines(tally)[0]
