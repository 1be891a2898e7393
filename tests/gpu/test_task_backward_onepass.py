"""GPU tests of the task backward's one-pass kernel (GN_ARCH=tasks+bwd1, opt-in): fp64 agreement with
poisoned outputs for every act, the same bits as the two launches and across residency caps (from one
resident block up: members with more chunk pairs than slots re-read them), and the launch record against
the schedule model (tiles in both phases, chunk pairs read twice)."""

from __future__ import annotations

import pytest
import torch

from gn_module import ops, schedule

from .test_kernels import check_against_reference, make_case, run, shape_id
from .test_task_backward import DTYPES, SHAPES

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ACTS = [None, "silu", "relu", "gelu", "gelu_tanh"]


@pytest.fixture(autouse=True)
def _tasks_bwd1(monkeypatch):
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd1")
    with ops.poison_outputs():
        yield


def _check_record(bwd: dict) -> None:
    p = bwd["plan"]
    assert bwd["arch"] == 2 and bwd["schedule"] == p.schedule == 1
    assert bwd["grid"] == p.grid
    assert bwd["tiles_phase1"] == bwd["tiles_applied"] == p.tiles  # every tile in both phases
    assert bwd["chunks_reread"] == schedule.task_reread_chunks(p)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=str)
@pytest.mark.parametrize("act", ACTS, ids=lambda a: a or "noact")
@pytest.mark.parametrize(("shape", "groups"), SHAPES, ids=shape_id)
def test_onepass_backward_against_fp64(shape, groups, dtype, act):
    x, w, b, dy = make_case(shape, groups, DTYPES[dtype], mean=0.5 if act == "relu" else 3.0)
    with ops.launch_record() as rec:
        check_against_reference(x, groups, w, b, act, 1, dy)
    _check_record(rec["bwd"])


@pytest.mark.parametrize(
    "batch", [(1 << schedule.GENERATION_BITS) - 1, 1 << schedule.GENERATION_BITS], ids=["below", "at"]
)
def test_onepass_totals_for_batches_either_side_of_2_16_samples(batch):
    # the launch's last block (counted on one word) sums every channel over tens of thousands of strips;
    # under cap 7 each block walks thousands of rounds of tasks before it counts itself
    x, w, b, dy = make_case((batch, 64, 2, 2), 16, torch.float16)
    with ops.launch_record() as rec:
        got = check_against_reference(x, 16, w, b, "silu", 1, dy)
    _check_record(rec["bwd"])
    with ops.max_resident_blocks(7):
        capped = run(x, 16, w, b, "silu", 1, dy)
    for a, b_ in zip(got, capped, strict=True):
        assert torch.equal(a, b_)


@pytest.mark.parametrize("cap", [1, 2, 3, 7])
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_onepass_backward_under_caps_rereads_what_the_model_says_with_the_same_bits(dtype, cap):
    """Caps shrink the teams, so members hold more chunk pairs than slots and read the rest again."""
    x, w, b, dy = make_case((3, 320, 40, 40), 32, DTYPES[dtype])
    two = run(x, 32, w, b, "silu", 2, dy)
    with ops.max_resident_blocks(cap), ops.launch_record() as rec:
        one = run(x, 32, w, b, "silu", 1, dy)
    _check_record(rec["bwd"])
    assert rec["bwd"]["chunks_reread"] > 0 or cap > 2
    for name, a, b_ in zip(("y", "dx", "dweight", "dbias"), one, two, strict=True):
        assert torch.equal(a, b_), f"{name} differs between the one-pass and two-pass backward (cap {cap})"


def test_auto_picks_one_launch_where_a_task_fits_or_l2_keeps_its_rereads():
    # on the H200: 2x1280x16x16 runs 16 tasks in one-pass teams of 6 members, one chunk pair each (one
    # launch: it fits); 8x128x128x128's one-pass teams (4 x 66, 2 rounds) hold 4 chunk pairs a member, one
    # more than its slots, and the L2 hints keep that one for its re-read (one launch,
    # schedule.l2_backward_one_launch); 1x512x256x256's members re-read 13 of 16 pairs, 10 of them from
    # DRAM (two launches). The one-pass teams are the model's (choose_teams with the plan's slots); the
    # two-launch plan's own teams assume nothing is kept, so they never overflow.
    chosen = {}
    keep = ops._l2_keep_bytes(torch.cuda.current_device()) if schedule.L2_HINTS else 0
    for shape in ((2, 1280, 16, 16), (8, 128, 128, 128), (1, 512, 256, 256)):
        x, w, b, dy = make_case(shape, 32, torch.float16)
        with ops.launch_record() as rec:
            run(x, 32, w, b, "silu", "auto", dy)
        plan = rec["bwd"]["plan"]
        blocks = plan.residency if plan.cap is None else min(plan.residency, plan.cap)
        teams = schedule.choose_teams(plan.tiling, blocks, plan.slots)
        fits = teams.rounds == 1 and teams.overflow_chunks == 0
        kept = schedule.L2_BACKWARD_ONE_LAUNCH and schedule.l2_backward_one_launch(plan.tiling, teams, keep)
        assert rec["bwd"]["schedule"] == (1 if fits or kept else 2), (shape, teams, keep)
        chosen[shape] = rec["bwd"]["schedule"]
        if rec["bwd"]["schedule"] == 1:
            _check_record(rec["bwd"])
        if fits:
            assert rec["bwd"]["chunks_reread"] == 0
    props = torch.cuda.get_device_properties(0)
    if (props.major, props.minor, props.multi_processor_count) == (9, 0, 132):  # H100 and H200
        assert chosen == {(2, 1280, 16, 16): 1, (8, 128, 128, 128): 1, (1, 512, 256, 256): 2}, chosen


def test_no_affine_writes_no_parameter_gradients():
    x, _, _, dy = make_case((2, 128, 24, 24), 32, torch.bfloat16, affine=False)
    check_against_reference(x, 32, None, None, None, 1, dy)
