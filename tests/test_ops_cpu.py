"""gn_module.ops without a CUDA device: clear errors instead of torch's bare AssertionError."""

from __future__ import annotations

import pytest
import torch

import gn_module


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only message")
def test_plan_without_cuda_is_a_clear_runtime_error():
    with pytest.raises(RuntimeError, match=r"gn_module\.plan\(\): needs a CUDA device .*torch sees none"):
        gn_module.plan((2, 64, 8, 8), 32, "float32", "fwd")
