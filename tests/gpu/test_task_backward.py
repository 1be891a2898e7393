"""GPU tests of the task architecture's backward (GN_ARCH=tasks+bwd, two-pass; not yet the default):
fp64 agreement with poisoned outputs, bitwise invariance across grids (residency caps), the launch
record, and the one place its dweight / dbias come from (the last sample of each window)."""

from __future__ import annotations

import pytest
import torch

from gn_module import ops

from .test_kernels import check_against_reference, make_case, run, shape_id

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# odd shapes first: the scalar path (C=100, C=30), G=1, one channel per group, partial tiles, N > 1
SHAPES = [
    ((3, 100, 37), 10),
    ((2, 96, 33, 31), 32),
    ((5, 64, 17, 19), 1),
    ((2, 64, 40, 40), 64),
    ((4, 320, 24, 24), 32),
    ((1, 128, 300, 257), 16),
    ((2, 1280, 16, 16), 32),
    ((8, 128, 96, 96), 32),
]


@pytest.fixture(autouse=True)
def _tasks_bwd(monkeypatch):
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd")
    with ops.poison_outputs():
        yield


@pytest.mark.parametrize("dtype", list(DTYPES), ids=str)
@pytest.mark.parametrize("act", [None, "silu"], ids=lambda a: a or "noact")
@pytest.mark.parametrize(("shape", "groups"), SHAPES, ids=shape_id)
def test_task_backward_against_fp64(shape, groups, dtype, act):
    x, w, b, dy = make_case(shape, groups, DTYPES[dtype], mean=3.0)
    with ops.launch_record() as rec:
        check_against_reference(x, groups, w, b, act, 2, dy)
    bwd = rec["bwd"]
    assert bwd["arch"] == 2 and bwd["schedule"] == 2
    assert bwd["grid"] == bwd["plan"].grid
    assert bwd["tiles_phase1"] == bwd["tiles_applied"] == bwd["plan"].tiles  # every tile, both launches


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_task_backward_is_bitwise_equal_across_grids(dtype):
    x, w, b, dy = make_case((3, 320, 40, 40), 32, DTYPES[dtype])
    results = []
    for cap in (1, 2, 3, 7, None):
        if cap is None:
            results.append(run(x, 32, w, b, "silu", 2, dy))
        else:
            with ops.max_resident_blocks(cap):
                results.append(run(x, 32, w, b, "silu", 2, dy))
    base = results[0]
    for got in results[1:]:
        for a, b_ in zip(base[1:], got[1:], strict=True):
            assert torch.equal(a, b_)


def test_passes_1_runs_the_task_backward_with_the_same_bits():
    # the task backward has one schedule; the tile one-pass backward would sum in another order
    x, w, b, dy = make_case((2, 64, 20, 20), 16, torch.float16)
    with ops.launch_record() as rec:
        one = run(x, 16, w, b, "silu", 1, dy)
    assert rec["bwd"]["arch"] == 2 and rec["bwd"]["schedule"] == 2 and rec["fwd"]["schedule"] == 1
    two = run(x, 16, w, b, "silu", 2, dy)
    for a, b_ in zip(one, two, strict=True):
        assert torch.equal(a, b_)


def test_no_affine_writes_no_parameter_gradients():
    x, _, _, dy = make_case((2, 128, 24, 24), 32, torch.bfloat16, affine=False)
    check_against_reference(x, 32, None, None, None, 2, dy)
