"""GPU tests of the programmatic dependent launches (default; ops.dependent_launches): the two-launch task
schedules' apply launch starts while the stats launch drains and waits on the device for its writes.
Against the fp64 reference with poisoned outputs, bitwise equal to the plain launches at every residency
cap, and over back-to-back calls on fresh inputs (a wait in the wrong place reads the previous call's
statistics). On a GPU below sm_90 the flag stays off and the same checks hold trivially."""

from __future__ import annotations

import pytest
import torch

from gn_module import _abi, ops

from .test_kernels import check_against_reference, make_case, run, shape_id

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# small (the launch gap matters most), a scalar-path C, a batch of teams, one large team
SHAPES = [((2, 320, 16, 16), 32), ((3, 100, 37), 10), ((4, 256, 24, 24), 32), ((1, 128, 256, 200), 16)]


@pytest.fixture(autouse=True)
def _task_kernels(monkeypatch):
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd")
    monkeypatch.delenv(ops.ENV_DEPENDENT, raising=False)
    with ops.poison_outputs():
        yield


def sm90_code() -> bool:
    return ops.runtime_cuda_arch() >= 900


def test_the_launches_ask_for_it_where_the_code_has_the_wait():
    x, w, _, _ = make_case((2, 320, 16, 16), 32, torch.float16)
    with ops.dependent_launches():
        for direction in ("fwd", "bwd"):
            launch = ops._launch(direction, x, x.get_device(), True, 32, 1e-5, 1, 2, w)
            assert launch.plan.schedule == 2
            assert _abi.GnArgs.from_buffer_copy(launch.args).dependent_launch == int(sm90_code())


@pytest.mark.parametrize("dtype", list(DTYPES), ids=str)
@pytest.mark.parametrize("act", [None, "silu"], ids=lambda a: a or "noact")
@pytest.mark.parametrize(("shape", "groups"), SHAPES, ids=shape_id)
def test_against_fp64_and_bitwise_equal_to_plain_launches(shape, groups, dtype, act):
    x, w, b, dy = make_case(shape, groups, DTYPES[dtype], mean=3.0)
    with ops.dependent_launches(), ops.launch_record() as rec:
        got = check_against_reference(x, groups, w, b, act, 2, dy)
    for direction in ("fwd", "bwd"):
        r = rec[direction]
        assert r["schedule"] == 2 and r["tiles_phase1"] == r["tiles_applied"] == r["plan"].tiles
    with ops.dependent_launches(False):
        plain = run(x, groups, w, b, act, 2, dy)
    for a, b_ in zip(got, plain, strict=True):
        assert torch.equal(a, b_)


@pytest.mark.parametrize("cap", [1, 3, 7])
def test_overflow_tiles_bitwise_equal(cap):
    x, w, b, dy = make_case((2, 320, 40, 40), 32, torch.float16)
    with ops.dependent_launches(False):
        base = run(x, 32, w, b, "silu", 2, dy)
    with ops.dependent_launches(), ops.max_resident_blocks(cap):
        got = run(x, 32, w, b, "silu", 2, dy)
    for a, b_ in zip(base, got, strict=True):
        assert torch.equal(a, b_)


def test_back_to_back_calls_read_their_own_statistics():
    # no synchronisation between the calls: each apply launch must wait for its own stats launch
    shape, groups = (1, 128, 256, 200), 16
    cases = [make_case(shape, groups, torch.float16, mean=float(i)) for i in range(8)]
    with ops.dependent_launches():
        got = [run(x, groups, w, b, "silu", 2, dy) for x, w, b, dy in cases]
    torch.cuda.synchronize()
    for (x, w, b, dy), outs in zip(cases, got, strict=True):
        with ops.dependent_launches(False):
            plain = run(x, groups, w, b, "silu", 2, dy)
        for a, b_ in zip(outs, plain, strict=True):
            assert torch.equal(a, b_)
