"""GPU tests of the two launches' L2 hand-over (ops.l2_handover, GN_L2_HANDOVER): the stats launch reads
each block's last chunks with an evict_last cache policy (schedule.TaskPlan.l2_kept_chunks) and the others
evict_first, and the apply launch returns the kept lines to normal priority. Only where the data lives
changes, so: against the fp64 reference with poisoned outputs, bitwise equal to the launches without it, in
both directions, with every chunk kept (small tensors), some of them (tensors larger than the budget), and
under residency caps (other grids keep other chunks)."""

from __future__ import annotations

import pytest
import torch

from gn_module import _abi, ops

from .test_kernels import check_against_reference, make_case, run, shape_id

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# every chunk kept (2x640x32x32), a part of one task per team (1x512x256x256: 64 MiB), several tasks per
# team (8x128x64x64 under a cap), the scalar path (C=100: no 16-byte copies, so no policies), 3-D
SHAPES = [
    ((2, 640, 32, 32), 32),
    ((1, 512, 256, 256), 32),
    ((8, 128, 64, 64), 32),
    ((3, 100, 37), 10),
    ((2, 64, 8, 16, 16), 16),
]


@pytest.fixture(autouse=True)
def _task_kernels(monkeypatch):
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd")
    monkeypatch.delenv(ops.ENV_L2_HANDOVER, raising=False)
    with ops.poison_outputs():
        yield


def kept_of(direction: str, x, w, groups: int) -> int:
    launch = ops._launch(direction, x, x.get_device(), True, groups, 1e-5, 1, 2, w)
    return _abi.GnArgs.from_buffer_copy(launch.args).l2_kept_chunks


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_the_launch_asks_for_it_only_when_on(direction):
    x, w, _, _ = make_case((1, 512, 256, 256), 32, torch.float16)
    plan = ops.plan(x.shape, 32, x.dtype, direction, 2)
    assert plan.l2_kept_chunks > 0
    assert kept_of(direction, x, w, 32) == 0
    with ops.l2_handover():
        assert kept_of(direction, x, w, 32) == plan.l2_kept_chunks
    if direction == "fwd":  # (passes=1 of the default backward is its two launches)
        assert ops.plan(x.shape, 32, x.dtype, direction, 1).l2_kept_chunks == 0  # one launch: nothing


@pytest.mark.parametrize("dtype", list(DTYPES), ids=str)
@pytest.mark.parametrize(("shape", "groups"), SHAPES, ids=shape_id)
def test_against_fp64_and_bitwise_equal_without_it(shape, groups, dtype):
    x, w, b, dy = make_case(shape, groups, DTYPES[dtype], mean=2.0)
    with ops.l2_handover():
        got = check_against_reference(x, groups, w, b, "silu", 2, dy)
    with ops.l2_handover(False):
        plain = run(x, groups, w, b, "silu", 2, dy)
    for a, b_ in zip(got, plain, strict=True):
        assert torch.equal(a, b_)


@pytest.mark.parametrize("cap", [1, 5, 64])
def test_bitwise_equal_under_caps(cap):
    x, w, b, dy = make_case((8, 128, 64, 64), 32, torch.bfloat16)
    with ops.l2_handover(False):
        base = run(x, 32, w, b, None, 2, dy)
    with ops.l2_handover(), ops.max_resident_blocks(cap):
        assert ops.plan(x.shape, 32, x.dtype, "fwd", 2, cap=cap).l2_kept_chunks > 0
        got = run(x, 32, w, b, None, 2, dy)
    for a, b_ in zip(base, got, strict=True):
        assert torch.equal(a, b_)
