"""GPU tests of the backward's strip blocks (on by default; ops.strip_blocks, GN_STRIP_BLOCKS=0): the
two-launch task backward's apply launch adds blocks of its own for the dweight/dbias strips
(schedule.TaskPlan.strip_blocks), and its dx blocks leave the strips to them. Against the fp64 reference with
poisoned outputs, bitwise equal to the launch without them (at the natural residency, where they fit, and
under caps, where they may not), and the trace shows the extra blocks ran: a launch whose strip blocks skip
their strips leaves dweight and dbias poisoned. The totals go by strip column below 2**16 samples
(schedule.column_totals), and by one word for larger batches."""

from __future__ import annotations

import pytest
import torch

import gn_module
from gn_module import _abi, ops, schedule

from .test_kernels import check_against_reference, make_case, run, shape_id

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# the small shapes whose strips fit beside the grid, a scalar-path C, and one whose strips do not fit
SHAPES = [
    ((2, 1280, 16, 16), 32),
    ((2, 320, 64, 64), 32),
    ((1, 512, 128, 128), 32),
    ((3, 100, 37), 10),
    ((32, 128, 64, 64), 32),
]


@pytest.fixture(autouse=True)
def _task_kernels(monkeypatch):
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd")
    monkeypatch.delenv(ops.ENV_STRIP_BLOCKS, raising=False)
    monkeypatch.delenv(ops.ENV_STRIP_ROOM, raising=False)
    with ops.poison_outputs():
        yield


def strip_blocks_of(x, w, groups: int) -> int:
    launch = ops._launch("bwd", x, x.get_device(), True, groups, 1e-5, 1, 2, w)
    return _abi.GnArgs.from_buffer_copy(launch.args).strip_blocks


def test_the_launch_asks_for_them_unless_turned_off():
    x, w, _, _ = make_case((2, 1280, 16, 16), 32, torch.float16)
    plan = ops.plan(x.shape, 32, x.dtype, "bwd", 2)
    assert plan.strip_blocks == plan.param_strips > 0
    assert strip_blocks_of(x, w, 32) == plan.strip_blocks
    with ops.strip_blocks(False):
        assert strip_blocks_of(x, w, 32) == 0


@pytest.mark.parametrize("dtype", list(DTYPES), ids=str)
@pytest.mark.parametrize("act", [None, "silu"], ids=lambda a: a or "noact")
@pytest.mark.parametrize(("shape", "groups"), SHAPES, ids=shape_id)
def test_against_fp64_and_bitwise_equal_without_them(shape, groups, dtype, act):
    x, w, b, dy = make_case(shape, groups, DTYPES[dtype], mean=3.0)
    with ops.strip_blocks():
        got = check_against_reference(x, groups, w, b, act, 2, dy)
    with ops.strip_blocks(False):
        plain = run(x, groups, w, b, act, 2, dy)
    for a, b_ in zip(got, plain, strict=True):
        assert torch.equal(a, b_)


@pytest.mark.parametrize(
    "batch",
    [(1 << schedule.GENERATION_BITS) - 1, 1 << schedule.GENERATION_BITS],
    ids=["by-column", "one-word"],
)
def test_totals_by_column_and_for_batches_of_2_16_samples(batch):
    # schedule.column_totals: below 2**16 samples each strip column's last strip sums its channels; from
    # there on the last block with strips sums every channel (a column's count would pass the generation)
    assert schedule.column_totals(batch) == (batch < 1 << schedule.GENERATION_BITS)
    x, w, b, dy = make_case((batch, 64, 2, 2), 16, torch.float16)
    got = check_against_reference(x, 16, w, b, "silu", 2, dy)
    with ops.max_resident_blocks(7):  # a block sums many strips, one column after another
        capped = run(x, 16, w, b, "silu", 2, dy)
    for a, b_ in zip(got, capped, strict=True):
        assert torch.equal(a, b_)


@pytest.mark.parametrize("cap", [1, 7, 100, 200])
def test_bitwise_equal_under_caps(cap):
    # cap 100: the grid fits and its strips do not (96 + 80 blocks); 200: both fit
    x, w, b, dy = make_case((2, 1280, 16, 16), 32, torch.float16)
    with ops.strip_blocks(False):
        base = run(x, 32, w, b, "silu", 2, dy)
    with ops.strip_blocks(), ops.max_resident_blocks(cap):
        got = run(x, 32, w, b, "silu", 2, dy)
    for a, b_ in zip(base, got, strict=True):
        assert torch.equal(a, b_)


@pytest.mark.parametrize("which", ["weight", "bias", "neither"])
def test_some_parameter_gradients(which):
    x, w, b, dy = make_case((2, 1280, 16, 16), 32, torch.bfloat16)
    outs = {}
    for on in (False, True):
        xr = x.detach().requires_grad_(True)
        wr, br = w.detach().requires_grad_(which == "weight"), b.detach().requires_grad_(which == "bias")
        with ops.strip_blocks(on):
            y = gn_module.group_norm(xr, 32, wr, br, 1e-5, "silu", passes=2)
            inputs = [t for t in (xr, wr, br) if t.requires_grad]
            outs[on] = torch.autograd.grad(y, inputs, dy)
    for a, b_ in zip(outs[False], outs[True], strict=True):
        assert torch.equal(a, b_)


def test_the_strip_blocks_ran():
    x, w, b, dy = make_case((2, 1280, 16, 16), 32, torch.float16)
    plan = ops.plan(x.shape, 32, x.dtype, "bwd", 2)
    with ops.strip_blocks(), ops.phase_trace(plan.grid + plan.strip_blocks) as trace:
        run(x, 32, w, b, "silu", 2, dy)
        torch.cuda.synchronize()
    t = trace.cpu()
    extra = t[plan.grid :]
    assert (extra[:, 8] >= 0).all() and (extra[:, 15] >= 0).all()  # every strip block started and ended
    assert (extra[:, 10] < 0).all()  # and wrote no dx
    assert (t[: plan.grid, 10] >= 0).any()


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_room_for_strips_against_fp64_and_bitwise(dtype):
    # ops.strip_room (on by default): 2x320x64x64's teams of 66 become 61, with room for its 20 strip blocks
    x, w, b, dy = make_case((2, 320, 64, 64), 32, DTYPES[dtype], mean=3.0)
    with ops.strip_room():
        plan = ops.plan(x.shape, 32, x.dtype, "bwd", 2)
        if plan.grid + plan.param_strips > plan.residency:
            pytest.skip(f"no room on this GPU ({plan.residency} resident blocks)")
        assert plan.strip_blocks == plan.param_strips
        got = check_against_reference(x, 32, w, b, "silu", 2, dy)
    with ops.strip_blocks(False):
        plain = run(x, 32, w, b, "silu", 2, dy)
    for a, b_ in zip(got, plain, strict=True):
        assert torch.equal(a, b_)


@pytest.mark.parametrize(("direction", "bad"), [("fwd", 4), ("bwd", -1), ("bwd", 1 << 16)])
def test_the_library_refuses_strip_blocks_it_cannot_run(direction, bad, monkeypatch):
    # GnArgs.strip_blocks is the backward's two-launch apply's only, and one wave of fewer than 2**16 blocks
    # with its grid: the C entry points refuse anything else (clear error, no launch)
    x, w, b, dy = make_case((2, 1280, 16, 16), 32, torch.float16)
    with torch.no_grad():
        _, mean, rstd = ops.forward(x, w, b, 32, 1e-5, 1, 2)
    prepare = ops._prepare

    def with_bad_strips(*args, **kwargs):
        p, a = prepare(*args, **kwargs)
        a.strip_blocks = bad
        return p, a

    monkeypatch.setattr(ops, "_prepare", with_bad_strips)
    with pytest.raises(RuntimeError, match="invalid argument"):
        if direction == "fwd":
            ops.forward(x, w, b, 32, 1e-5, 1, 2)
        else:
            ops.backward(dy, x, w, b, mean, rstd, 32, 1e-5, 1, 2)
        torch.cuda.synchronize()


def test_a_trace_too_small_for_the_strip_blocks_is_left_alone():
    # a trace has a row per block: one sized for the grid alone would take the strip blocks' rows out of
    # bounds, so the launch records none
    x, w, b, dy = make_case((2, 1280, 16, 16), 32, torch.float16)
    plan = ops.plan(x.shape, 32, x.dtype, "bwd", 2)
    assert plan.strip_blocks > 0
    with torch.no_grad():
        _, mean, rstd = ops.forward(x, w, b, 32, 1e-5, 1, 2)
    with ops.phase_trace(plan.grid) as trace:
        guard = torch.full((plan.strip_blocks, 16), -1, dtype=torch.int64, device="cuda")  # (likely behind)
        ops.backward(dy, x, w, b, mean, rstd, 32, 1e-5, 1, 2)
        torch.cuda.synchronize()
    assert (trace < 0).all() and (guard < 0).all()
