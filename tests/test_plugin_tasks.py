"""The task architecture's overflow cases (pytest_gn.tasks), on the CPU: the schedule model's inverse
and re-read count, the case generator against the model (every case has the ratio it claims), the
profiles' shared memory, the planted bug's reach, and the runner's launch-record checks."""

from __future__ import annotations

import os

import pytest
import task_case_helpers as helpers
from task_case_helpers import BUILTIN, NUMBERS, THIS_GPU, Direction, in_scope, tiling_of

from gn_module import ops, profiles, resources, schedule
from pytest_gn import tasks
from pytest_gn.cases import CaseSpec, GnCase, Ratio, TaskRun, memory_estimate, specs_from_marker
from pytest_gn.runner import arch_env, case_context, case_from_json, case_to_json, other_task_cap
from pytest_gn.sweep import Sweep

#: What ptxas gives fwd_task_onepass on the built-in archs (126-128 registers, 16 bytes of static
#: shared memory: __launch_bounds__(256, 2)); the sweep reads the real numbers per arch.
TASK_REGISTERS = schedule.KernelResources(128, 16)
FORWARD = Direction("fwd", TASK_REGISTERS, 1, tasks.resolve_task)
model_of, resolve, scope_plan = FORWARD.model_of, FORWARD.resolve, FORWARD.scope_plan


SPECS = helpers.sweep_specs("fwd")
SCOPES = helpers.scopes(SPECS)


# ------------------------------------------------------------------ the schedule model's additions
SHAPES = [(128, 16, 2), (100, 20, 2), (30, 10, 4), (32, 32, 2), (64, 1, 4), (320, 32, 2)]


@pytest.mark.parametrize(("channels", "groups", "itemsize"), SHAPES)
def test_task_rows_for_tiles_is_the_inverse_of_task_tiling(channels: int, groups: int, itemsize: int) -> None:
    full = schedule.task_tiling(channels, groups, 1 << 30, itemsize, "fwd")
    for tiles in (1, 2, 3, 7, 128, 129, 255, 256):
        for q in (1, 2, 3, 5):
            rows = schedule.task_rows_for_tiles(channels, groups, itemsize, tiles, q)
            inside = {rows.start, rows.start + len(rows) // 2, rows.stop - 1} if rows else set()
            for s in inside:
                t = schedule.task_tiling(channels, groups, s, itemsize, "fwd")
                assert (t.tiles_per_task, t.chunks_per_tile, t.chunk_rows) == (tiles, q, full.chunk_rows), s
            for s in {rows.start - 1, rows.stop} if rows else set():
                t = schedule.task_tiling(channels, groups, s, itemsize, "fwd") if s > 0 else None
                assert t is None or (t.tiles_per_task, t.chunks_per_tile, t.chunk_rows) != (
                    tiles, q, full.chunk_rows), s  # fmt: skip
    # tiles of several chunks only once a task has more than max_tiles_per_task chunks
    most = schedule.max_tiles_per_task(channels, full.window)
    assert schedule.task_rows_for_tiles(channels, groups, itemsize, most // 2 + 1, 2)
    assert not schedule.task_rows_for_tiles(channels, groups, itemsize, most // 2, 2)
    assert not schedule.task_rows_for_tiles(channels, groups, itemsize, most + 1, 1)
    assert not schedule.task_rows_for_tiles(4096, 1, 2, 4, 1)  # a window the task kernels do not cover


def kernel_reread(p: schedule.TaskPlan) -> tuple[int, int, int]:
    """(tiles reduced, tiles applied, chunks re-read) summed over the blocks, as fwd_task_onepass and
    fwd_task_stats / fwd_task_apply count them in csrc/gn_forward.cu: every block of the grid takes
    team = block / team_size and member = block % team_size, the tiles [t0, t1) of `member_tiles`,
    and the tasks team, team + teams, ...; member_apply re-reads the chunks it did not keep."""
    t, teams = p.tiling, p.teams
    reduced = applied = reread = 0
    for block in range(p.grid):
        team, member = divmod(block, teams.team_size)
        t0, t1 = schedule.member_tiles(t.tiles_per_task, teams.team_size, member)
        for _task in range(team, t.tasks, teams.teams):
            chunks = (t1 - t0) * t.chunks_per_tile
            kept = min(chunks, p.slots) if p.schedule == 1 else 0
            reduced, applied, reread = reduced + t1 - t0, applied + t1 - t0, reread + chunks - kept
    return reduced, applied, reread


@pytest.mark.parametrize("blocks", [1, 2, 3, 7, 40, 264])
@pytest.mark.parametrize("slots", [1, 2, 6, 8])
def test_reread_chunks_count_what_the_kernels_count(blocks: int, slots: int) -> None:
    for n, c, g, rows, item in [(1, 128, 16, 7 * 128, 2), (3, 100, 20, 37, 2), (2, 64, 1, 300 * 128 + 5, 4),
                                (5, 32, 32, 1000, 2), (1, 128, 16, 256 * 3 * 128 - 100, 2)]:  # fmt: skip
        t = schedule.task_tiling(c, g, rows, item, "fwd", batch=n)
        for passes in (1, 2):
            p = schedule.make_task_plan(t, passes, slots, blocks)
            reduced, applied, reread = kernel_reread(p)
            assert reduced == applied == t.tiles
            assert schedule.task_reread_chunks(p) == reread, (t, p.teams)
            members = schedule.task_member_chunks(t, p.teams.team_size)
            assert sum(members) == t.tiles_per_task * t.chunks_per_tile
            assert max(members) == p.teams.chunks_per_member


def test_task_model_is_the_occupancy_rule_with_the_profiles_shared_memory() -> None:
    t = schedule.task_tiling(128, 16, 1 << 20, 2, "fwd")
    for p in profiles.BUILTIN_PROFILES:
        slots, residency = schedule.task_model(p, TASK_REGISTERS, t)
        assert slots == schedule.task_slots(t, schedule.task_smem_budget(p)) >= 1
        assert residency == p.sm_count * schedule.blocks_per_sm(
            p, TASK_REGISTERS, schedule.THREADS, schedule.task_smem_bytes(t, slots)
        )
    tiny = profiles.limits_for("Tiny", (8, 6), 4, smem_per_sm=16 * 1024)
    assert schedule.task_model(tiny, TASK_REGISTERS, t) == (0, 0)  # not one 16 KB chunk fits


# ------------------------------------------------------------------ specs
def test_forward_task_specs_have_readable_stable_ids() -> None:
    every = specs_from_marker({}, archs=("tasks",))
    specs = helpers.default_specs("fwd")
    ids = [s.id for s in specs]
    assert all(s.arch == "tasks" and s.env_arch == "tasks" for s in specs)
    assert specs_from_marker({"directions": ("fwd",)}, archs=("tasks",)) == specs  # forward cells first
    assert ids[:4] == ["fwd-tasks-cap1-x1-fp16-silu", "fwd-tasks-cap2-x1-fp16-noact-partial",
                       "fwd-tasks-cap3-x1-bf16-relu-batch",
                       "fwd-tasks-cap1-x1-bf16-noact-c100g20"]  # fmt: skip
    assert ids[-1] == "fwd-tasks-x4p3-fp32-noact-c64g1"
    capped = [s for s in specs if s.variant == "capped"]
    assert [s.cap for s in capped[:6]] == [1, 2, 3, 1, 2, 3]
    for k in (1, 2, 3):  # every cap meets every ratio
        assert {s.ratio.label for s in capped if s.cap == k} == {"x1", "x1p1", "x2p1", "x4p3"}
    assert specs_from_marker({}, archs=("tasks",)) == every  # deterministic: the same on every worker
    assert not [s for s in specs_from_marker({}) if s.arch == "tasks"]  # tiles by default
    both = specs_from_marker({}, archs=("tiles", "tasks"))
    # tiles 96; tasks: forward 48, backward 48, one-launch backward 48
    assert [s for s in both if s.arch == "tiles"] == specs_from_marker({}) and len(both) == 96 + 3 * 48
    assert specs_from_marker({}, archs=("tasks",), foreign=True) == []  # gn_module's kernels only
    caps = specs_from_marker({"task_caps": (5,), "variants": ("capped",)}, archs=("tasks",))
    assert {s.cap for s in caps} == {5} and caps[0].id == "fwd-tasks-cap5-x1-fp16-silu"
    for bad in ((), (0,), (True,), ("2",)):
        with pytest.raises(ValueError, match="task_caps"):
            specs_from_marker({"task_caps": bad}, archs=("tasks",))
    with pytest.raises(ValueError, match="architectures"):
        specs_from_marker({}, archs=("warp",))


def test_the_sweep_gives_every_profile_24_task_cases_that_meet_every_kind() -> None:
    big = [s for s in SPECS if s.big]
    assert [s.id for s in big] == ["fwd-tasks-2_31-bf16-silu-c1024g32"]
    helpers.assert_every_scope_has_24_cases_of_every_kind(SPECS)
    alone = specs_from_marker({}, profiles=("Thor",), profile_numbers=NUMBERS, archs=("tasks",))
    assert [s for s in alone if s.profile and s.direction == "fwd"] == [
        s for s in SPECS if s.profile == "Thor"
    ]


# ------------------------------------------------------------------ every case has the ratio it claims
def assert_claim(case: GnCase) -> None:
    """The busiest member's chunks per task over the slots (`helpers.assert_chunks_claim`)."""
    helpers.assert_chunks_claim(case, scope_plan(case))


@pytest.mark.parametrize("scope", SCOPES)
def test_every_task_case_of_the_sweep_has_the_ratio_it_claims(scope: str) -> None:
    for spec in in_scope(SPECS, scope):
        assert_claim(resolve(spec))


@pytest.mark.parametrize("geometry", helpers.GEOMETRIES)
@pytest.mark.parametrize("scope", helpers.CELL_SCOPES)
def test_every_kind_and_cell_has_its_ratio(scope: str, geometry: str) -> None:
    for spec in helpers.every_cell("fwd", scope, geometry):
        assert_claim(resolve(spec))


def test_the_case_over_2_31_elements_re_reads() -> None:
    (spec,) = [s for s in SPECS if s.big]
    case = resolve(spec)
    assert case.numel > 2**31 and case.shape[0] == 1
    p = scope_plan(case)
    assert schedule.task_reread_chunks(p) > 0 and case.task.chunks == p.teams.chunks_per_member > p.slots
    assert case.bytes_needed() < 40 * 2**30


def test_a_count_no_shape_has_moves_to_the_nearest_of_its_ring() -> None:
    # Thor: 40 blocks, 6 slots of 16 KB; 2 x 6 + 1 = 13 chunks per member need 13 tiles per member of
    # one chunk (a task of > 256 tiles) or one tile of 13 chunks (teams of > 128 blocks): 14 instead
    spec = CaseSpec("fwd", Ratio(2, 1), "fp16", "silu", profile="Thor", arch="tasks")
    case = resolve(spec)
    assert (case.task.model_slots, case.task.chunks) == (6, 14)
    assert any("14 chunks (x2p2 of 6 slots) instead of 13 (x2p1)" in note for note in case.notes), case.notes
    assert_claim(case)


def test_a_shape_the_task_kernels_do_not_cover_is_unavailable() -> None:
    FORWARD.assert_unavailable_where_the_kernels_cannot_run()


# ------------------------------------------------------------------ profiles' shared memory
def test_profiles_with_less_shared_memory_get_fewer_slots_and_other_shapes() -> None:
    spec = CaseSpec("fwd", Ratio(2, 1), "fp16", "silu", arch="tasks")
    t = tasks.probe_tiling(spec)
    slots = {name: model_of(name)(t)[0] for name in BUILTIN}
    # 16 KB chunks: 100 KB per SM (sm_86, sm_89, sm_120, sm_121) keeps 2 per block, 164 KB 4, 228 KB 6
    assert {n for n, s in slots.items() if s == 2} == {"RTX3090", "A10", "L4", "RTX4090", "RTX5090", "GB10"}
    assert {n for n, s in slots.items() if s == 4} == {"A100", "Orin"}
    assert {n for n, s in slots.items() if s == 6} == {"H100", "H200", "B200", "Thor"}
    cases = {name: resolve(CaseSpec("fwd", Ratio(2, 1), "fp16", "silu", profile=name, arch="tasks"))
             for name in ("RTX3090", "L4", "RTX5090", "H200")}  # fmt: skip
    # x2p1 is 5 chunks over 2 slots, 13 over 6; with 256-byte windows (C=128: one task per sample) no
    # shape within the case's size limit gives 5 on the RTX 3090's residency: its case says it runs x2p2
    assert [cases[n].task.chunks for n in ("RTX3090", "L4", "RTX5090", "H200")] == [6, 5, 5, 13]
    assert any("instead of 5 (x2p1)" in note for note in cases["RTX3090"].notes), cases["RTX3090"].notes
    assert len({c.shape for c in cases.values()}) == 4  # each its own shape
    for case in cases.values():
        assert_claim(case)
    # the scalar path's chunks are smaller: more slots everywhere, still fewer on 100 KB SMs
    scalar = tasks.probe_tiling(CaseSpec("fwd", Ratio(1), "fp16", None, 30, 10, arch="tasks"))
    assert model_of("RTX3090")(scalar)[0] == 6 < model_of("H200")(scalar)[0] == 8


def test_a_profile_case_on_a_gpu_with_more_shared_memory_says_what_it_launches() -> None:
    spec = CaseSpec("fwd", Ratio(2, 1), "fp16", "silu", profile="RTX3090", arch="tasks")
    alone, on_h200 = resolve(spec), resolve(spec, run_on="H200")
    assert alone.shape == on_h200.shape and alone.task.chunks == on_h200.task.chunks == 6  # the profile's
    assert (on_h200.task.slots, on_h200.task.model_slots) == (6, 2)
    t = tiling_of(on_h200)
    run = schedule.make_task_plan(t, 1, 6, model_of("H200")(t)[1], on_h200.residency)  # H200, RTX3090's cap
    assert on_h200.expected_grid == run.grid and on_h200.cap == on_h200.residency
    assert tasks.expected_plan(on_h200, 1, on_h200.cap) == run
    note = on_h200.notes[-1]
    assert "shared memory not emulated: RTX3090 keeps 2 chunks per block, this GPU 6" in note
    assert f"{schedule.task_reread_chunks(run)} chunks re-read" in note


def _fake_sweep(regs: int) -> Sweep:
    fake = profiles.limits_for("Fake", (8, 6), 10)
    names = ["fwd_onepass[fp16,vec8]", "bwd_onepass[fp16,vec8]"]
    names += [f"fwd_task_onepass[{d},vec{v}]" for d, v in (("fp16", 8), ("fp16", 1), ("bf16", 8), ("bf16", 1),
                                                          ("fp32", 4), ("fp32", 1))]  # fmt: skip
    kernels = [resources.KernelReport(mangled=n, name=n, arch=fake.arch, source="x.cu", registers=regs,
                                      static_smem=16 if "task" in n else 0) for n in names]  # fmt: skip
    sweep = Sweep([fake])
    sweep._static = {fake.name: Sweep._analyse(fake, resources.ArchReport(fake.arch, "fake", "0", kernels))}
    return sweep


@pytest.mark.parametrize("regs", [64, 128])
def test_the_sweep_models_a_profiles_task_slots_and_residency(regs: int) -> None:
    sweep = _fake_sweep(regs)
    st = sweep.static("Fake")
    t = schedule.task_tiling(128, 16, 1 << 30, 2, "fwd")
    config = "fwd_task_onepass[fp16,vec8]"
    modelled = schedule.task_model(st.profile, schedule.KernelResources(regs, 16), t)
    assert (st.task_slots[config], st.task_residency[config]) == modelled
    spec = CaseSpec("fwd", Ratio(1, 1), "fp16", "silu", profile="Fake", arch="tasks")
    case = sweep.resolve_task_case(spec, None, None)
    assert case.task.model_slots == st.task_slots[spec.config] == 2 and case.task.chunks == 3
    assert case.cap == case.residency and case.variant is None
    with pytest.raises(ValueError, match="not a profile's task case"):
        sweep.resolve_task_case(CaseSpec("fwd", Ratio(1), "fp16", None, arch="tasks"), None, None)


# ------------------------------------------------------------------ the planted bug's reach
def test_the_planted_task_overflow_drop_can_fire_in_every_scope() -> None:
    """``scripts/plant_bug.py task-overflow-drop`` drops the first tile's partial of every member that
    has more chunks of a task than slots. Every scope has such cases, for every act and dtype, and
    exactly its cases outside x1 (the planting's -k "fwd and not x1-") have them, so x1 passes."""
    planting = helpers.plant_bug().PLANTINGS["task-overflow-drop"]
    assert "chunks > a.slots && tile == t0" in planting.replacement and planting.select == "fwd and not x1-"
    for scope in SCOPES:
        fires = []
        for spec in in_scope(SPECS, scope):
            case = resolve(spec)
            p = scope_plan(case)
            over = any(c > p.slots for c in schedule.task_member_chunks(tiling_of(case), p.teams.team_size))
            assert over == ("x1-" not in spec.id + "-"), spec.id
            if over:
                fires.append(spec)
        assert {s.act for s in fires} == {"silu", "relu", "gelu", "gelu_tanh", None}, scope
        assert {s.dtype for s in fires} == {"fp16", "bf16", "fp32"}, scope
        assert len(fires) == 18, scope  # every cell but x1's six


# ------------------------------------------------------------------ what the runner checks
def _case(cap: int | None = 2) -> GnCase:
    spec = CaseSpec("fwd", Ratio(2, 1), "fp16", "silu", variant="capped" if cap else "natural", cap=cap or 3,
                    arch="tasks")  # fmt: skip
    return tasks.resolve_task(spec, model_of(THIS_GPU), cap=cap)


def test_the_record_of_a_launch_must_show_the_model_plan() -> None:
    case = _case()
    plan = tasks.expected_plan(case, 1, case.cap)
    good = helpers.good_record(plan)
    assert tasks.record_problems(good, plan, "one-pass") == []
    assert good["chunks_reread"] > 0 and good["grid"] == case.expected_grid == 2
    for key, value in (("grid", 3), ("tiles_applied", plan.tiles - 1), ("chunks_reread", 0), ("arch", 1),
                       ("schedule", 2)):  # fmt: skip
        problems = tasks.record_problems({**good, key: value}, plan, "one-pass")
        assert len(problems) == 1 and problems[0].startswith(f"one-pass: {key} {value} != "), problems
    other = schedule.make_task_plan(plan.tiling, 1, plan.slots, plan.residency, 1)
    problems = tasks.record_problems({**good, "plan": other}, plan, "one-pass")
    assert problems and "the launcher planned" in problems[0]
    assert tasks.record_problems(None, plan, "two-pass") == [
        "two-pass: no launch record for the forward kernels (did the fast path run?)"
    ]
    two = tasks.expected_plan(case, 2, None)
    assert schedule.task_reread_chunks(two) == two.tiles * two.tiling.chunks_per_tile  # all read twice
    assert (other_task_cap(case), other_task_cap(_case(1)), other_task_cap(_case(None))) == (1, 2, 1)


def test_case_context_puts_the_cases_architecture_in_force(monkeypatch) -> None:
    monkeypatch.setenv("GN_ARCH", "tasks")
    tile = GnCase(CaseSpec("fwd", Ratio(1, 1), "fp16", "silu"), (1, 128, 4, 4), 3, 4, None, 3)
    with case_context(tile):
        assert os.environ["GN_ARCH"] == "tiles"  # a tile case never runs the task kernels
    assert os.environ["GN_ARCH"] == "tasks"
    monkeypatch.delenv("GN_ARCH")
    task = GnCase(CaseSpec("fwd", Ratio(1, 1), "fp16", "silu", arch="tasks"), (1, 128, 4, 4), 3, 4, None, 3)
    with case_context(task):
        assert os.environ["GN_ARCH"] == "tasks"
    assert "GN_ARCH" not in os.environ
    with case_context(task, own=False):  # a foreign implementation's case: left alone
        assert "GN_ARCH" not in os.environ
    assert ops.strip_room_enabled()
    with case_context(task):  # the case's teams as the model has them: no room for strip blocks
        assert not ops.strip_room_enabled()
    assert ops.strip_room_enabled()
    with pytest.raises(KeyError), arch_env("tasks"):
        raise KeyError
    assert "GN_ARCH" not in os.environ


def test_task_cases_survive_json_and_size_their_memory() -> None:
    case = _case()
    assert case_from_json(case_to_json(case)) == case
    assert isinstance(case.task, TaskRun)
    estimate = memory_estimate(case)
    assert estimate > 3 * case.numel * case.spec.itemsize
    summary = case.summary()
    assert summary["arch"] == "tasks" and summary["chunks"] == case.task.chunks == 13
    assert summary["slots"] == 6 and summary["over"] == 7


def test_resolution_is_quick_enough_for_a_sweep() -> None:
    gb10 = [s for s in SPECS if s.profile == "GB10"]
    assert helpers.seconds_to_resolve(resolve, gb10) < 30  # a profile's 24 cases, cold (about 1-3 s here)


def _fake_kernels(case: GnCase, monkeypatch, bug: str = "") -> list[dict]:
    """Put a CPU stand-in for gn_module's task kernels in place: y from torch's GroupNorm, and a launch
    record from the model's plan for the cap in force (what the kernels record). `bug`: "overflow-drop"
    moves the output of tasks whose members have more chunks than slots (as the planted bug does),
    "reread" records one chunk too few, "two-pass" makes the two-pass output differ in one element."""
    from gn_module import ops

    calls: list[dict] = []
    record: dict = {}

    def group_norm(x, num_groups, weight, bias, eps, act, passes):
        assert os.environ.get("GN_ARCH") == "tasks"
        plan = tasks.expected_plan(case, passes, ops.current_cap())
        y = helpers.torch_group_norm(x, num_groups, weight, bias, eps, act)
        members = schedule.task_member_chunks(plan.tiling, plan.teams.team_size)
        if bug == "overflow-drop" and max(members) > plan.slots:
            y[:, : plan.tiling.window] += 1  # a tile's partial lost: the task's statistics move
        if bug == "two-pass" and passes == 2:
            y[0, 0, 0, 0] += 1
        good = helpers.good_record(plan)
        record["fwd"] = {**good, "chunks_reread": good["chunks_reread"] - (bug == "reread")}
        calls.append({"passes": passes, "cap": ops.current_cap(), "poisoned": bool(ops._poison)})
        return y

    helpers.patch_kernels(monkeypatch, group_norm, record)
    return calls


BUGS = [
    ("", None),
    ("overflow-drop", "(fp64 reference)"),
    ("reread", "one-pass: chunks_reread"),
    ("two-pass", "y: two-pass differs from the first one-pass run"),
]


@pytest.mark.parametrize(("bug", "problem"), BUGS)
def test_the_runner_checks_a_task_case_three_ways(monkeypatch, bug: str, problem: str | None) -> None:
    pytest.importorskip("torch")
    from pytest_gn.runner import check_case

    monkeypatch.delenv("GN_MAX_RESIDENT_BLOCKS", raising=False)
    case = _case(cap=2)
    calls = _fake_kernels(case, monkeypatch, bug)
    result = check_case(case, None, 0, device="cpu")
    assert [(c["passes"], c["cap"]) for c in calls] == [(1, 2), (1, 1), (2, 2)]  # case cap, cap 1, two-pass
    assert all(c["poisoned"] for c in calls)
    assert result.record["fwd"]["grid"] == case.expected_grid and "plan" not in result.record["fwd"]
    helpers.assert_outcome(result, problem)


def test_a_profile_case_limited_by_this_gpus_grid_checks_what_it_launches(monkeypatch) -> None:
    pytest.importorskip("torch")
    from pytest_gn.runner import check_case

    small = profiles.limits_for("Small", (9, 0), 8)  # 16 blocks against Thor's 40
    spec = CaseSpec("fwd", Ratio(1, 1), "fp16", "silu", 64, 1, profile="Thor", arch="tasks")
    case = tasks.resolve_task(spec, model_of("Thor"), emulated=True,
                              run_model=lambda t: schedule.task_model(small, TASK_REGISTERS, t))  # fmt: skip
    assert case.residency == 40 and case.task.residency == 16 and case.expected_grid <= 16
    assert "grid limited by the device (16 < emulated 40)" in case.notes[-1]
    launched = tasks.expected_plan(case, 1, case.cap)
    assert launched.teams.chunks_per_member != case.task.chunks  # the profile's count is not what runs
    monkeypatch.delenv("GN_MAX_RESIDENT_BLOCKS", raising=False)
    _fake_kernels(case, monkeypatch)
    result = check_case(case, None, 0, device="cpu")
    assert result.ok, result.problems
