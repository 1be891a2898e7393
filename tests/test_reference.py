"""The fp64 oracle and its comparison: they must fail on a wrong or unwritten element."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gn_module import reference


def test_forward_backward_is_torch_in_float64():
    x, dy = torch.randn(2, 8, 5, 3), torch.randn(2, 8, 5, 3)
    w, b = torch.randn(8), torch.randn(8)
    y, dx, dw, db = reference.forward_backward(x, 4, w, b, 1e-5, "silu", dy)
    xd, wd, bd = (t.double().requires_grad_(True) for t in (x, w, b))
    want = F.silu(F.group_norm(xd, 4, wd, bd, 1e-5))
    grads = torch.autograd.grad(want, (xd, wd, bd), dy.double())
    for got, exp in zip((y, dx, dw, db), (want, *grads), strict=True):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, exp.detach(), rtol=0, atol=0)
    _, _, none_w, none_b = reference.forward_backward(x, 4, None, None, 1e-5, None, dy)
    assert none_w is None and none_b is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_compare_accepts_rounding_and_rejects_errors(dtype):
    ref = reference.forward(torch.randn(2, 16, 8, 8), 4, None, None, 1e-5, None)
    out = ref.to(dtype)
    reference.compare(out, ref, dtype)  # rounding to the output dtype is within tolerance
    wrong = out.clone()
    wrong[1, 3, 2, 2] += 0.5
    with pytest.raises(AssertionError, match=r"worst at \(1, 3, 2, 2\)"):
        reference.compare(wrong, ref, dtype)
    unwritten = out.clone()
    unwritten[0, 0, 0, 0] = float("nan")
    with pytest.raises(AssertionError, match="non-finite"):
        reference.compare(unwritten, ref, dtype)
    drift = out.double() * (1 + 2 * reference.tolerance(dtype).rel_norm)
    with pytest.raises(AssertionError):
        reference.compare(drift.to(dtype), ref, dtype)


@pytest.mark.parametrize("act", ["identity", "silu", "relu", "gelu", "gelu_tanh"])
def test_forward_backward_of_every_act_is_torch_in_float64(act):
    torch_act = {"identity": lambda y: y, "silu": F.silu, "relu": F.relu, "gelu": F.gelu,
                 "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}[act]  # fmt: skip
    x, dy = torch.randn(2, 8, 5, 3, dtype=torch.float16), torch.randn(2, 8, 5, 3)
    w, b = torch.randn(8), torch.randn(8)
    y, dx, dw, db = reference.forward_backward(x, 4, w, b, 1e-5, act, dy)
    xd, wd, bd = (t.double().requires_grad_(True) for t in (x, w, b))
    want = torch_act(F.group_norm(xd, 4, wd, bd, 1e-5))
    grads = torch.autograd.grad(want, (xd, wd, bd), dy.double())
    for got, exp in zip((y, dx, dw, db), (want, *grads), strict=True):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, exp.detach(), rtol=0, atol=0)
    torch.testing.assert_close(reference.forward(x, 4, w, b, 1e-5, act), want.detach(), rtol=0, atol=0)
