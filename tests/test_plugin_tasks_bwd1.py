"""The one-launch task backward's overflow cases (pytest_gn.tasks_bwd.BACKWARD_ONEPASS, arch ``tasks1``,
GN_ARCH=tasks+bwd1), on the CPU: the specs, every case against the schedule model (the busiest member's
chunk pairs per task over the slots it keeps), the planted re-read bug's reach, and the runner's runs."""

from __future__ import annotations

import functools
import os

import pytest
import task_case_helpers as helpers
from task_case_helpers import BUILTIN, THIS_GPU, Direction, in_scope

from gn_module import schedule
from pytest_gn import tasks, tasks_bwd
from pytest_gn.cases import CaseSpec, GnCase, Ratio, specs_from_marker
from pytest_gn.runner import case_context, case_from_json, case_to_json, task_runs

#: What ptxas gives bwd_task_onepass on sm_90 (128 registers at __launch_bounds__(256, 2), a few
#: counters in static shared memory): 2 blocks per SM, as the stats kernel.
BWD1_REGISTERS = schedule.KernelResources(128, 32)
ONEPASS = Direction("bwd", BWD1_REGISTERS, 1, tasks_bwd.resolve_task_bwd1)
model_of, scope_plan = ONEPASS.model_of, ONEPASS.scope_plan
resolve = functools.cache(ONEPASS.resolve)
RATIOS = {"x1", "x1p1", "x2p1", "x4p3"}
ACTS = {None, "silu", "relu", "gelu", "gelu_tanh"}

SPECS = helpers.sweep_specs("bwd1")
SCOPES = helpers.scopes(SPECS)


def run_plans(case: GnCase) -> list[schedule.TaskPlan]:
    """The plans of the case's runs on this GPU (`runner.task_runs`): one launch under its cap, one
    launch under another cap, two launches."""
    return [tasks.expected_plan(case, passes, case.cap if extra is None else extra)
            for _label, passes, extra in task_runs(case, case.cap)]  # fmt: skip


# ------------------------------------------------------------------ specs
def test_one_launch_backward_specs_have_readable_stable_ids() -> None:
    specs = helpers.default_specs("bwd1")
    assert all(s.arch == "tasks1" and s.direction == "bwd" and s.env_arch == "tasks+bwd1" for s in specs)
    assert [s.id for s in specs[:3]] == ["bwd-tasks1-cap1-x1-fp16-silu-c100g20",
                                        "bwd-tasks1-cap2-x1-fp16-noact-c100g20-partial",
                                        "bwd-tasks1-cap3-x1-bf16-relu-c100g20-batch"]  # fmt: skip
    assert specs[0].config == "bwd_task_onepass[fp16,vec1]"
    assert CaseSpec("bwd", Ratio(1), "fp16", None, arch="tasks1").config == "bwd_task_onepass[fp16,vec8]"
    # numbered after the forward's and the backward's cells: those keep their ids
    every = specs_from_marker({}, archs=("tasks",))
    for variant in ("capped", "natural"):  # each scope's last 24
        assert [s.arch for s in every if s.variant == variant][-24:] == ["tasks1"] * 24
    assert helpers.default_specs("bwd") == [s for s in every if s.arch == "tasks" and s.direction == "bwd"]
    forward = specs_from_marker({"directions": ("fwd",)}, archs=("tasks",))
    assert not [s for s in forward if s.arch == "tasks1"]
    with pytest.raises(ValueError, match="backward cases only"):
        CaseSpec("fwd", Ratio(1), "fp16", None, arch="tasks1")


def test_the_sweep_gives_every_profile_24_one_launch_backward_cases_that_meet_every_kind() -> None:
    assert [s.id for s in SPECS if s.big] == ["bwd-tasks1-2_31-bf16-silu-c1024g32"]
    helpers.assert_every_scope_has_24_cases_of_every_kind(SPECS)
    for scope in SCOPES:
        mine = in_scope(SPECS, scope)
        assert {s.ratio.label for s in mine} == RATIOS and {s.act for s in mine} == ACTS, scope


# ------------------------------------------------------------------ every case has the ratio it claims
def assert_claim(case: GnCase) -> None:
    """The busiest member's chunk pairs per task over the slots (`helpers.assert_chunks_claim`)."""
    helpers.assert_chunks_claim(case, scope_plan(case))


@pytest.mark.parametrize("scope", SCOPES)
def test_every_one_launch_backward_case_of_the_sweep_has_the_ratio_it_claims(scope: str) -> None:
    for spec in in_scope(SPECS, scope):
        assert_claim(resolve(spec))


@pytest.mark.parametrize("geometry", helpers.GEOMETRIES)
@pytest.mark.parametrize("scope", helpers.CELL_SCOPES)
def test_every_kind_and_cell_has_its_ratio(scope: str, geometry: str) -> None:
    for spec in helpers.every_cell("bwd1", scope, geometry):
        assert_claim(resolve(spec))


def test_the_case_over_2_31_elements_reads_chunk_pairs_again() -> None:
    (spec,) = [s for s in SPECS if s.big]
    case = resolve(spec)
    assert case.numel > 2**31 and case.spec.env_arch == "tasks+bwd1"
    p = scope_plan(case)
    assert schedule.task_reread_chunks(p) > 0 and case.task.chunks == p.teams.chunks_per_member > p.slots


def test_a_shape_the_task_kernels_do_not_cover_is_unavailable() -> None:
    with pytest.raises(Exception, match="do not cover"):
        ONEPASS.resolve(CaseSpec("bwd", Ratio(1, 1), "fp16", "silu", 4096, 1, arch="tasks1"))


# ------------------------------------------------------------------ the planted bug's reach
def test_the_planted_re_read_bug_fires_in_every_case_whose_one_launch_runs_read_again() -> None:
    """``scripts/plant_bug.py task-bwd1-reread-skip``: the one-launch backward never reads again the chunk
    pairs a member could not keep (the two launches are untouched). A case stays green only when none of
    its one-launch runs (its cap, another cap) reads anything again: on this GPU two x1 cases of cap 1,
    whose other run (cap 2) splits the same chunk pairs over two members."""
    planting = helpers.plant_bug().PLANTINGS["task-bwd1-reread-skip"]
    assert "kept > 0" in planting.replacement
    green = []
    for spec in (s for s in SPECS if s.profile is None):
        case = resolve(spec)
        fires = [p.schedule == 1 and schedule.task_reread_chunks(p) > 0 for p in run_plans(case)]
        assert fires[0] == (spec.ratio.label != "x1" or spec.big), spec.id
        if not any(fires):
            green.append(spec.id)
    assert green == ["bwd-tasks1-cap1-x1-fp16-silu-c100g20", "bwd-tasks1-cap1-x1-bf16-noact-c30g10"], green


# ------------------------------------------------------------------ what the runner runs and checks
X2P1 = Ratio(2, 1)


def _case(cap: int | None = 3, ratio: Ratio = X2P1) -> GnCase:
    spec = CaseSpec("bwd", ratio, "fp16", "silu", 64, 1, variant="capped" if cap else "natural", cap=cap or 3,
                    arch="tasks1")  # fmt: skip
    return tasks_bwd.resolve_task_bwd1(spec, model_of(THIS_GPU), cap=cap)


def test_a_one_launch_case_runs_as_the_forwards_one_launch_another_cap_two_launches() -> None:
    two = ("two-pass", 2, None)
    assert task_runs(_case(None), None) == [("one-pass", 1, None), ("one-pass cap 1", 1, 1), two]
    assert task_runs(_case(1), 1) == [("one-pass", 1, None), ("one-pass cap 2", 1, 2), two]


def test_the_record_of_a_one_launch_backward_must_show_its_re_reads() -> None:
    case = _case()
    plan = tasks.expected_plan(case, 1, case.cap)
    assert plan.schedule == 1 and plan.direction == "bwd" and plan.grid == case.expected_grid
    good = helpers.good_record(plan)
    assert 0 < good["chunks_reread"] < plan.tiles * plan.tiling.chunks_per_tile  # some kept, some not
    assert tasks.record_problems(good, plan, "one-pass") == []
    bad = tasks.record_problems({**good, "chunks_reread": 0}, plan, "one-pass")
    assert len(bad) == 1 and bad[0].startswith("one-pass: chunks_reread 0 != "), bad


def test_one_launch_cases_survive_json_and_run_under_tasks_bwd1(monkeypatch) -> None:
    case = _case()
    assert case_from_json(case_to_json(case)) == case
    summary = case.summary()
    assert summary["arch"] == "tasks1" and summary["over"] == case.task.chunks - case.task.model_slots > 0
    monkeypatch.setenv("GN_ARCH", "tiles")
    with case_context(case):
        assert os.environ["GN_ARCH"] == "tasks+bwd1"
    assert os.environ["GN_ARCH"] == "tiles"


def test_the_summary_counts_the_one_launch_backward_cases_apart() -> None:
    from pytest_gn.report import Tally, scope_lines, task_lines

    tally = Tally()
    two = tasks_bwd.resolve_task_bwd(
        CaseSpec("bwd", Ratio(2, 1), "fp16", "silu", 64, 1, arch="tasks"), model_of(THIS_GPU)
    )
    for case, outcome in ((two, "passed"), (_case(None), "failed"), (_case(None, Ratio(1)), "passed")):
        tally.add(case.summary(), outcome)
    lines = task_lines(tally)
    assert lines[0].startswith(
        "task one-launch backward cases (GN_ARCH=tasks+bwd1): 2 run, 1 with members over their slots "
        "(chunk pairs read twice); heaviest: bwd-tasks1-x2p1-fp16-silu-c64g1: busiest member"
    ), lines
    assert lines[1].startswith("task backward cases (GN_ARCH=tasks+bwd): 1 run"), lines
    counts = "3 of them task kernel cases (0 forward, 1 backward, 2 one-launch backward)"
    assert counts in scope_lines(tally)[0]


def test_profiles_use_the_one_launch_kernels_registers() -> None:
    spec = next(s for s in SPECS if s.profile in BUILTIN)
    assert spec.config.startswith("bwd_task_onepass[")


def test_the_plugin_resolves_each_kind_of_task_case_with_its_own_rules() -> None:
    """resolve_local and the sweep resolve through `tasks_bwd.resolver_of`: a one-launch backward case must
    get the one-launch rules (chunk pairs over slots), not the two launches' (tiles over members)."""
    kinds = {"fwd": ("fwd", "tasks"), "bwd": ("bwd", "tasks"), "bwd1": ("bwd", "tasks1")}
    resolvers = {kind: tasks_bwd.resolver_of(CaseSpec(d, X2P1, "fp16", "silu", arch=a)) for kind, (d, a) in
                 kinds.items()}  # fmt: skip
    assert resolvers == {"fwd": tasks.resolve_task, "bwd": tasks_bwd.resolve_task_bwd,
                         "bwd1": tasks_bwd.resolve_task_bwd1}  # fmt: skip
    spec = CaseSpec("bwd", X2P1, "fp16", "silu", 64, 1, arch="tasks1")
    case = tasks_bwd.resolver_of(spec)(spec, model_of(THIS_GPU))
    assert case == resolve(spec) and scope_plan(case).schedule == 1
    assert case.task.chunks == 2 * case.task.model_slots + 1  # x2p1 of the slots, not of the team
