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


def _on_the_kink(channels_last: bool):
    """x, w, b, dy of a GroupNorm + ReLU whose element (1, 5, 2, 3) has |z| < 1e-7 (within fp32
    rounding of ReLU's kink), with a large dy and |xhat| there, so the side taken shows in dx, dweight
    and dbias."""
    torch.manual_seed(3)
    x, dy = torch.randn(2, 8, 5, 4), torch.randn(2, 8, 5, 4)
    x[1, 5, 2, 3] = 2.5
    w, b = torch.randn(8), torch.randn(8)
    xhat = F.group_norm(x.double(), 2, None, None, 1e-5)
    b[5] = -(w[5].double() * xhat[1, 5, 2, 3]).item()  # z = 0 up to b's fp32 rounding
    dy[1, 5, 2, 3] = 5.0
    if channels_last:
        x, dy = (t.contiguous(memory_format=torch.channels_last) for t in (x, dy))
    return x, w, b, dy


def _backward_taking(x, w, b, dy, mask):
    """fp64 dx, dweight, dbias of GroupNorm then z * mask (mask: relu' as the kernel chose it)."""
    xd, wd, bd = (t.double().requires_grad_(True) for t in (x, w, b))
    z = F.group_norm(xd, 2, wd, bd, 1e-5)
    return torch.autograd.grad(z, (xd, wd, bd), dy.double() * mask)


@pytest.mark.parametrize("channels_last", [False, True])
def test_relu_kink_allows_the_other_side_and_nothing_else(channels_last):
    x, w, b, dy = _on_the_kink(channels_last)
    _, rdx, rdw, rdb = reference.forward_backward(x, 2, w, b, 1e-5, "relu", dy)
    kink = reference.relu_kink(x, 2, w, b, 1e-5, dy)
    assert kink is not None and kink.ambiguous == 1
    z = F.group_norm(x.double(), 2, w.double(), b.double(), 1e-5)
    mask = (z > 0).double()
    mask[1, 5, 2, 3] = 1.0 - mask[1, 5, 2, 3]  # a kernel whose fp32 z came out on the other side
    dx, dw, db = _backward_taking(x, w, b, dy, mask)
    # without the allowance, the other side is an error in all three outputs
    for got, want in ((dx, rdx), (dw, rdw), (db, rdb)):
        with pytest.raises(AssertionError):
            reference.compare(got, want, torch.float32)
    reference.compare(dx, rdx, torch.float32, "dx", rdx + kink.dx_shift, kink.dx_slack)
    reference.compare(dw, rdw, torch.float32, "dweight", slack=kink.dweight_slack)
    reference.compare(db, rdb, torch.float32, "dbias", slack=kink.dbias_slack)
    # a second flip away from the kink (z well above 0) is still caught
    far = torch.where(z > 0.5, dy.double().abs(), 0.0).argmax()  # with the largest dy there
    mask[torch.unravel_index(far, z.shape)] = 0.0
    dx2, _, _ = _backward_taking(x, w, b, dy, mask)
    with pytest.raises(AssertionError):
        reference.compare(dx2, rdx, torch.float32, "dx", rdx + kink.dx_shift, kink.dx_slack)


def test_relu_kink_is_none_away_from_the_kink():
    x, dy = torch.randn(2, 8, 5, 4), torch.randn(2, 8, 5, 4)
    w, b = torch.ones(8), torch.full((8,), 10.0)  # every z near 10
    assert reference.relu_kink(x, 2, w, b, 1e-5, dy) is None


def test_plugin_check_outputs_allows_the_kink_and_catches_a_far_flip():
    from pytest_gn.reference import check_outputs

    x, w, b, dy = _on_the_kink(True)
    z = F.group_norm(x.double(), 2, w.double(), b.double(), 1e-5)
    mask = (z > 0).double()
    mask[1, 5, 2, 3] = 1.0 - mask[1, 5, 2, 3]
    inp = {"x": x, "weight": w, "bias": b, "dy": dy}
    got = dict(
        zip(("dx", "dweight", "dbias"), [t.float() for t in _backward_taking(x, w, b, dy, mask)], strict=True)
    )
    assert check_outputs(got, inp, 2, 1e-5, "relu") == []
    far = torch.where(z > 0.5, dy.double().abs(), 0.0).argmax()
    mask[torch.unravel_index(far, z.shape)] = 0.0
    got = dict(
        zip(("dx", "dweight", "dbias"), [t.float() for t in _backward_taking(x, w, b, dy, mask)], strict=True)
    )
    problems = check_outputs(got, inp, 2, 1e-5, "relu")
    assert any(p.startswith("dx:") for p in problems), problems


def test_relu_kink_leaves_fp64_inputs_alone():
    x, w, b, dy = (t.double() for t in _on_the_kink(True))
    saved = x.clone(), dy.clone()
    assert reference.relu_kink(x, 2, w, b, 1e-5, dy) is not None
    assert torch.equal(x, saved[0]) and torch.equal(dy, saved[1])
