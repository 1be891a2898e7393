"""Every eps torch accepts, through the CUDA kernels (issue 14): eps = 0, a negative eps whose variance
stays above -eps, and eps as a 0-d tensor, against the fp64 reference with poisoned outputs, in both
schedules; and where torch's result is not finite (eps = 0 on a constant group: 0 * inf), ours is not
either, in the same places. tests/test_torch_parity.py covers the same inputs on the CPU, where
gn_module runs torch's own kernel after its checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gn_module
from gn_module import ops

from .test_kernels import check_against_reference, make_case

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# (variance of the input is about 1 per group: -1e-3 keeps var + eps > 0)
EPS = {"zero": 0.0, "negative": -1e-3, "tensor": torch.tensor(1e-3), "tensor-zero": torch.tensor(0.0)}


@pytest.fixture(autouse=True)
def _poisoned():
    with ops.poison_outputs():
        yield


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("act", [None, "silu"], ids=lambda a: a or "noact")
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("eps", list(EPS))
def test_eps_torch_accepts_against_fp64(eps, dtype, act, passes):
    x, w, b, dy = make_case((2, 64, 12, 10), 8, DTYPES[dtype])
    value = EPS[eps]
    # the reference takes a float; ours gets what the user passed (a tensor too)
    y, dx, dw, db = gn_module_run(x, 8, w, b, act, passes, dy, value)
    check = check_against_reference(x, 8, w, b, act, passes, dy, eps=float(value))
    for got, want in zip((y, dx, dw, db), check, strict=True):
        assert torch.equal(got, want), "a tensor eps must give the bits of the same float eps"


def gn_module_run(x, groups, w, b, act, passes, dy, eps):
    xr, wr, br = (t.detach().requires_grad_(True) for t in (x, w, b))
    y = gn_module.group_norm(xr, groups, wr, br, eps, act, passes=passes)
    dx, dw, db = torch.autograd.grad(y, (xr, wr, br), dy)
    return y.detach(), dx, dw, db


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_eps_zero_on_a_constant_group_is_not_finite_where_torch_is_not(dtype, passes):
    x, w, b, _ = make_case((2, 64, 8, 8), 8, DTYPES[dtype])
    x[0, 8:16] = 0.75  # group 1 of sample 0: constant, variance exactly 0
    with torch.no_grad():
        ours = gn_module.group_norm(x, 8, w, b, 0.0, passes=passes)
        theirs = F.group_norm(x.float(), 8, w.float(), b.float(), 0.0)
    assert torch.equal(ours.isfinite(), theirs.isfinite())
    assert not ours[0, 8:16].isfinite().any() and ours[0, :8].isfinite().all()
