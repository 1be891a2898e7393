"""The torch.library registration of gn_module's two ops without a GPU: defined on a plain Library with CUDA,
fake and Autograd kernels of our own (not torch.library.custom_op, whose seven Python layers per call cost
more than the body: benchmarks/RESULTS.md, session 20). The ops run here on CPU tensors against the stub
kernel library of scripts/host_overhead.py, with their CUDA kernels registered for CPU for the test's
duration. The CUDA runs (compiled graphs, opcheck, bits) are tests/gpu/test_kernels.py and
test_compile_autocast.py."""

from __future__ import annotations

import cProfile
import pstats
from collections.abc import Iterator

import pytest
import torch
from arch_stub import ArchStub, host_overhead

from gn_module import ops

FWD, BWD = torch.ops.gn_module.group_norm_fwd.default, torch.ops.gn_module.group_norm_bwd.default


@pytest.fixture
def on_cpu() -> Iterator[ArchStub]:
    """The ops' CUDA kernels registered for CPU (removed afterwards), launching into the stub library."""
    lib = torch.library.Library("gn_module", "IMPL")
    lib.impl("group_norm_fwd", ops.group_norm_fwd, "CPU")
    lib.impl("group_norm_bwd", ops.group_norm_bwd, "CPU")
    stub = ArchStub(900)
    try:
        with host_overhead.cpu_device(stub):
            yield stub
    finally:
        lib._destroy()


def case(grad: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(2, 64, 8, 8).half().contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(64), torch.randn(64)
    return x.requires_grad_(grad), w.requires_grad_(grad), b.requires_grad_(grad)


@pytest.mark.parametrize("name", ["gn_module::group_norm_fwd", "gn_module::group_norm_bwd"])
def test_kernels_are_registered_for_cuda_and_autograd(name: str) -> None:
    for key in ("CUDA", "Autograd"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key), key
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(name, "CPU")  # (the kernels are CUDA's)
    assert "bool wide=False" in str(torch.ops.gn_module.group_norm_fwd.default._schema)


def test_no_grad_call_launches_once_without_custom_op_layers(on_cpu: ArchStub) -> None:
    x, w, b = case()
    with torch.no_grad():
        FWD(x, w, b, 32, 1e-5, 1, 0, False)  # (the launch is built and cached)
        on_cpu.calls.clear()
        prof = cProfile.Profile()
        prof.enable()
        y, mean, rstd = FWD(x, w, b, 32, 1e-5, 1, 0, False)
        prof.disable()
    assert [c[0] for c in on_cpu.calls] == ["fwd"]
    assert y.shape == x.shape and mean.shape == rstd.shape == (2, 32)
    files = {key[0] for key in pstats.Stats(prof).stats}  # type: ignore[attr-defined]
    assert not any("custom_ops" in f or "_library/autograd" in f for f in files), sorted(files)


def test_gradients_flow_through_the_backward_op(on_cpu: ArchStub) -> None:
    x, w, b = case(grad=True)
    y, mean, rstd = torch.ops.gn_module.group_norm_fwd(x, w, b, 32, 1e-5, 1, 0, False)
    assert y.grad_fn is not None and not mean.requires_grad and not rstd.requires_grad
    on_cpu.calls.clear()
    dx, dw, db = torch.autograd.grad(y, (x, w, b), torch.randn_like(y))
    assert [c[0] for c in on_cpu.calls] == ["bwd"]
    assert dx.shape == x.shape and dx.stride() == x.stride() and dw.shape == db.shape == (64,)
    # only x wanting a gradient: dweight and dbias are not returned
    x2 = x.detach().requires_grad_()
    y2, _, _ = FWD(x2, w.detach(), b.detach(), 32, 1e-5, 1, 0, False)
    (g,) = torch.autograd.grad(y2, (x2,), torch.randn_like(y2))
    assert g.shape == x.shape


def test_double_backward_is_a_clear_error(on_cpu: ArchStub) -> None:
    x, w, b = case(grad=True)
    y, mean, rstd = FWD(x, w, b, 32, 1e-5, 1, 0, False)
    dy = torch.randn_like(y, requires_grad=True)
    with pytest.raises(RuntimeError, match="double backward"):
        BWD(dy, x, w, b, mean, rstd, 32, 1e-5, 1, 0, False)


def test_fake_kernels_trace_both_ops() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w, b = case()
        y, mean, rstd = FWD(x, w, b, 32, 1e-5, 1, 0, True)
        dx, dw, _ = BWD(y, x, w, b, mean, rstd, 32, 1e-5, 1, 0, True)
    assert y.dtype == torch.float32 and dx.dtype == torch.float16 and dw.dtype == torch.float32
