"""A converted model checked against its unconverted copy: one training step, bitwise."""

from __future__ import annotations

import torch
from torch import nn


def assert_same_step(model: nn.Module, ref: nn.Module, x: torch.Tensor) -> None:
    """Forward and backward of `model` and `ref` on copies of `x`: the outputs, the input gradients and
    every parameter's gradient bitwise equal (torch's own ops on the CPU give the same bits)."""
    xm = x.detach().clone().requires_grad_()
    xr = x.detach().clone().requires_grad_()
    y, y_ref = model(xm), ref(xr)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    torch.testing.assert_close(xm.grad, xr.grad, rtol=0, atol=0)
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=n)
