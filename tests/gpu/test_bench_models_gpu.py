"""`bench models --gn-free`'s stand-in with torch's dtypes on CUDA: a cast to exactly the dtype torch's
GroupNorm returns there (float32 for a 16-bit x under autocast), and the gradient's dtype it hands back,
checked against torch's GroupNorm itself. The CPU side is in tests/test_bench_models.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gn_module.bench import models as bm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("autocast", [torch.float16, torch.bfloat16, None])
def test_torch_dtype_cast_matches_torch_group_norm_dtypes(dtype: torch.dtype, autocast: torch.dtype | None):
    # Outside autocast a model's GroupNorm holds x's dtype (torch's native kernel wants matching dtypes).
    gn = nn.GroupNorm(2, 8).cuda().to(torch.float32 if autocast is not None else dtype)
    x = torch.randn(2, 8, 4, 4, device="cuda", dtype=dtype, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    with torch.autocast("cuda", dtype=autocast or torch.float16, enabled=autocast is not None):
        y, y_ref = bm.TorchDtypeCast()(x), gn(x_ref)
    assert y.dtype == y_ref.dtype
    assert torch.equal(y.detach(), x.detach().to(y.dtype))  # a cast and nothing else
    y.float().sum().backward()
    y_ref.float().sum().backward()
    assert x.grad is not None and x_ref.grad is not None and x.grad.dtype == x_ref.grad.dtype == dtype
