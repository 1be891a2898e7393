"""The wide launches' overflow cases (``--gn-arch wide``, arch ``tasksw``): which cases the marker makes,
what they run under, and how they are sized (CPU only; the cases themselves need a GPU)."""

from __future__ import annotations

import pytest

from gn_module import schedule
from pytest_gn import cases, tasks, tasks_bwd
from pytest_gn.cases import CaseSpec, Ratio, specs_from_marker

# Inline pytester runs restore sys.modules afterwards, and re-importing torch in one process crashes;
# importing it here first keeps it (as in test_plugin_cli.py).
pytest.importorskip("torch")


def test_wide_cells_only_with_the_option_leaving_the_others_unchanged() -> None:
    plain = specs_from_marker({}, archs=("tiles", "tasks"))
    both = specs_from_marker({}, archs=("tiles", "tasks", "wide"))
    assert not any(s.arch == "tasksw" for s in plain)
    # the wide cells are numbered after all others: every other case, its act and cap, is unchanged
    assert [s for s in both if s.arch != "tasksw"] == plain
    wide = [s for s in both if s.arch == "tasksw"]
    assert wide and specs_from_marker({}, archs=("wide",)) == wide


def test_wide_cases_are_16_bit_on_shapes_with_a_wide_launch() -> None:
    wide = specs_from_marker({}, archs=("wide",))
    # 2 directions x 4 ratios x 2 dtypes x 2 acts (silu's cell rotates), capped and natural
    assert len(wide) == 2 * 4 * 2 * 2 * 2
    assert {s.dtype for s in wide} == {"fp16", "bf16"}
    assert {s.direction for s in wide} == {"fwd", "bwd"}
    # of the default shapes, C=100 and C=30 have no 16-byte task windows in 16 bits: no wide launch
    assert {(s.channels, s.groups) for s in wide} <= {(128, 16), (64, 1), (32, 32)}
    assert not cases.has_wide_launch(100, 20) and not cases.has_wide_launch(30, 10)
    assert all(s.id.startswith(("fwd-tasksw-", "bwd-tasksw-")) for s in wide)
    capped = [s for s in wide if s.variant == "capped"]
    assert {s.cap for s in capped} == {1, 2, 3} and all(f"-cap{s.cap}-" in s.id for s in capped)
    assert specs_from_marker({"dtypes": ("fp32",)}, archs=("wide",)) == []  # fp32 x has no wide launch
    assert specs_from_marker({"shapes": [(100, 20)]}, archs=("wide",)) == []


def test_wide_spec_runs_the_two_launch_backward_and_names_its_kernels() -> None:
    fwd = CaseSpec("fwd", Ratio(1, 1), "bf16", "silu", arch="tasksw")
    bwd = CaseSpec("bwd", Ratio(2, 1), "fp16", None, arch="tasksw")
    assert fwd.wide and bwd.wide and fwd.is_task and fwd.wide_itemsize == 4
    assert fwd.env_arch == bwd.env_arch == "tasks+bwd" and bwd.task_kind == "bwd"
    assert fwd.config == "fwd_task_onepass[bf16,vec8,wide]"
    assert bwd.config == "bwd_task_stats[fp16,vec8,wide]"
    assert CaseSpec("fwd", Ratio(1), "bf16", None, arch="tasks").wide_itemsize == 0
    with pytest.raises(ValueError, match="tasksw"):
        CaseSpec("fwd", Ratio(1), "fp32", None, arch="tasksw")
    assert tasks_bwd.resolver_of(bwd) is tasks_bwd.resolve_task_bwd


def test_wide_backward_cases_are_sized_with_float32_dy_slots() -> None:
    """A wide backward case's tiling holds float32 dy chunks of half the rows; its forward's is x's."""
    bwd = CaseSpec("bwd", Ratio(1, 1), "bf16", None, arch="tasksw")
    plain = CaseSpec("bwd", Ratio(1, 1), "bf16", None, arch="tasks")
    t_wide, t_plain = tasks.probe_tiling(bwd), tasks.probe_tiling(plain)
    assert t_wide.wide_itemsize == 4 and t_plain.wide_itemsize == 0
    assert t_wide.chunk_rows * 2 == t_plain.chunk_rows
    assert t_wide.slot_bytes == 3 * t_wide.chunk_bytes == (t_plain.slot_bytes + t_plain.chunk_bytes) // 2
    budget = schedule.smem_budget(233472, 232448, 1024)

    def model(t: schedule.TaskTiling) -> tuple[int, int]:  # an H200-like GPU: 132 SMs x 2 blocks
        return schedule.task_slots(t, budget), 264

    case = tasks_bwd.resolve_task_bwd(bwd, model)
    assert case.task is not None and case.task.slots == schedule.task_slots(t_wide, budget)
    assert tasks.tiling_of(bwd, case.shape).wide_itemsize == 4
    fwd = tasks.FORWARD.resolve(CaseSpec("fwd", Ratio(1, 1), "bf16", "silu", arch="tasksw"), model)
    assert fwd.task is not None and fwd.task.chunks == fwd.task.model_slots + 1  # x1p1: one chunk re-read


def test_every_wide_case_resolves_on_an_h200_like_gpu() -> None:
    """Every wide case, natural and capped, has a shape on 132 SMs x 2 blocks (the partial backward
    cases too: their half-height chunks end whole where the rows end half a full chunk short)."""
    budget = schedule.smem_budget(233472, 232448, 1024)

    def model(t: schedule.TaskTiling) -> tuple[int, int]:
        return schedule.task_slots(t, budget), 264

    wide = specs_from_marker({}, archs=("wide",))
    for spec in wide:
        case = tasks_bwd.resolver_of(spec)(spec, model, cap=spec.cap)  # raises CaseUnavailable
        assert case.task is not None, spec.id
    assert {s.geometry for s in wide if s.direction == "bwd"} >= {"partial"}


def test_wide_inputs_have_a_float32_dy() -> None:
    import torch

    from pytest_gn import reference

    inp = reference.make_inputs((2, 32, 4, 4), torch.bfloat16, "cpu", 0, True, torch.float32)
    assert inp["x"].dtype == torch.bfloat16 and inp["dy"].dtype == torch.float32
    same = reference.make_inputs((2, 32, 4, 4), torch.bfloat16, "cpu", 0, True)
    assert same["dy"].dtype == torch.bfloat16 and torch.equal(same["x"], inp["x"])


MARKED = """
import pytest

@pytest.mark.overflow_grid(dtypes=("bf16",), acts=("silu",), ratios=("x1p1",), shapes=[(128, 16)],
                           geometries=("even",))
def test_case(gn_case):
    pass
"""


def test_the_option_collects_the_wide_cases_and_says_so(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MARKED)
    result = pytester.runpytest("-rs", "-v", "--gn-arch", "wide")
    result.stdout.fnmatch_lines([
        "gn: --gn-arch=wide: the wide launches' cases (fwd-tasksw-..., bwd-tasksw-...: fp16/bf16 x under "
        "CUDA autocast, float32 y and dy); no tile kernel cases",
        "*test_case?fwd-tasksw-cap1-x1p1-bf16-silu? SKIPPED*",
        "*test_case?bwd-tasksw-cap2-x1p1-bf16-silu? SKIPPED*",
        "*test_case?fwd-tasksw-x1p1-bf16-silu? SKIPPED*",
        "*test_case?bwd-tasksw-x1p1-bf16-silu? SKIPPED*",
        "*gn summary*",
        "overflow cases: 4 collected: 0 passed, 0 failed, 4 skipped",
        "  this GPU: 4 (2 natural, 2 capped; 4 wide-launch cases (2 forward, 2 backward)): 0 passed, 0 "
        "failed, 4 skipped",
    ])  # fmt: skip
    result.assert_outcomes(skipped=4)
    ids = pytester.runpytest("--co", "-q", "--gn-arch", "all").stdout.str()
    assert "fwd-tasksw-x1p1-bf16-silu" in ids and "fwd-tasks-x1p1-bf16-silu" in ids
    assert "fwd-onepass-x1p1-bf16-silu" in ids
