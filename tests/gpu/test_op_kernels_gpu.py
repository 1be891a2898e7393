"""The custom ops' C++ kernels (gn_module.op_kernels, what compiled graphs call) on the GPU: the bits of the
Python kernels they stand in for, whose outputs are NaN-poisoned before the launch (so an element the C++
route leaves unwritten cannot match), and a compiled training step through them that gives eager's bits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gn_module
from gn_module import op_kernels, ops

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

FWD, BWD = torch.ops.gn_module.group_norm_fwd.default, torch.ops.gn_module.group_norm_bwd.default
ACT = {"none": 0, "silu": 1, "relu": 2}

CASES = {
    "2x320x64x64 fp16 silu": ((2, 320, 64, 64), 32, torch.float16, torch.float16, "silu", False),
    "2x1280x16x16 bf16 silu": ((2, 1280, 16, 16), 32, torch.bfloat16, torch.bfloat16, "silu", False),
    "8x256x32x32 bf16 wide (autocast)": ((8, 256, 32, 32), 32, torch.bfloat16, torch.float32, "silu", True),
    "4x512x32x32 fp16 fp32 params relu": ((4, 512, 32, 32), 16, torch.float16, torch.float32, "relu", False),
    "2x100x9x7 fp32 (scalar path)": ((2, 100, 9, 7), 4, torch.float32, torch.float32, "none", False),
    "2x64x4x8x8 fp16 3-d": ((2, 64, 4, 8, 8), 8, torch.float16, torch.float16, "none", False),
    "1x512x128x128 fp16 no params": ((1, 512, 128, 128), 32, torch.float16, None, "silu", False),
}


@pytest.fixture(scope="module")
def cpp_kernels() -> None:
    if not op_kernels.enable():
        pytest.fail("the C++ op kernels did not register (see the warning)")


def _inputs(shape, dtype, pdtype):
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    x = (torch.randn(shape, device="cuda") * 2 + 0.5).to(dtype).contiguous(memory_format=fmt)
    if pdtype is None:
        return x, None, None
    c = shape[1]
    return x, torch.randn(c, device="cuda").to(pdtype), torch.randn(c, device="cuda").to(pdtype)


@pytest.mark.parametrize("passes", [0, 1, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_same_bits_as_the_python_kernels(cpp_kernels, case, passes):
    shape, groups, dtype, pdtype, act, wide = CASES[case]
    x, w, b = _inputs(shape, dtype, pdtype)
    args = (groups, 1e-5, ACT[act], passes, wide)
    with torch.no_grad():
        got = FWD(x, w, b, *args)
        with ops.poison_outputs():
            want = ops.group_norm_fwd(x, w, b, *args)
        dy = torch.randn_like(got[0])
        got_bwd = BWD(dy, x, w, b, got[1], got[2], *args)
        with ops.poison_outputs():
            want_bwd = ops.group_norm_bwd(dy, x, w, b, want[1], want[2], *args)
    names = ("y", "mean", "rstd", "dx", "dweight", "dbias")
    for name, g, h in zip(names, got + got_bwd, want + want_bwd, strict=True):
        assert (g.dtype, g.shape, g.stride()) == (h.dtype, h.shape, h.stride()), name
        assert torch.equal(g, h), name
    # not merely equal to each other: close to torch's GroupNorm
    ref = F.group_norm(
        x.float(), groups, None if w is None else w.float(), None if b is None else b.float(), 1e-5
    )
    ref = {"none": ref, "silu": F.silu(ref), "relu": F.relu(ref)}[act]
    tol = 1e-4 if dtype == torch.float32 or wide else 3e-2
    torch.testing.assert_close(got[0].float(), ref, atol=tol, rtol=tol)


def test_a_compiled_step_takes_the_cpp_kernels_and_gives_eagers_bits(cpp_kernels):
    torch.compiler.reset()
    m = gn_module.GroupNorm(32, 256, act="silu").cuda()
    compiled = torch.compile(m)
    x = torch.randn(4, 256, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = compiled(xc)
    y.square().sum().backward()
    got = (y.detach().clone(), xc.grad, m.weight.grad.clone(), m.bias.grad.clone())
    m.zero_grad(set_to_none=True)
    ye = m(xe)
    ye.square().sum().backward()
    for g, h in zip(got, (ye, xe.grad, m.weight.grad, m.bias.grad), strict=True):
        assert torch.equal(g, h)
    assert op_kernels.enabled()
    assert torch._C._dispatch_has_kernel_for_dispatch_key("gn_module::group_norm_fwd", "CUDA")
    torch.compiler.reset()
