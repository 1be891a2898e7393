"""Hardening on the GPU: streams and concurrency, odd inputs, NaN/Inf, out-of-memory (issue 7)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gn_module
from gn_module import reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def cl(shape, dtype=torch.float16, device="cuda"):
    return torch.randn(shape, device=device, dtype=dtype).contiguous(memory_format=torch.channels_last)


def test_onepass_waits_for_room_behind_a_kernel_that_fills_the_gpu():
    """A cooperative launch issued while another stream's long kernel occupies every SM must wait
    for room and finish correctly, not deadlock."""
    x = cl((4, 128, 128, 128))
    w, b = torch.randn(128, device="cuda"), torch.randn(128, device="cuda")
    expected = reference.forward(x, 16, w, b, 1e-5, None)
    busy = torch.cuda.Stream()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    with torch.cuda.stream(busy):
        for _ in range(8):  # a few hundred ms of matrix work spread over all SMs
            a = a @ a
            a = a / a.abs().amax().clamp_min(1)
    y = gn_module.group_norm(x, 16, w, b, passes=1)
    torch.cuda.synchronize()
    reference.compare(y, expected, x.dtype, "y behind a busy stream")


def test_two_streams_at_once_match_sequential_results():
    xs = [cl((2, 256, 96, 96)) for _ in range(2)]
    seq = [gn_module.group_norm(x, 32, act="silu", passes=p) for x, p in zip(xs, (1, 2), strict=True)]
    streams = [torch.cuda.Stream() for _ in xs]
    torch.cuda.synchronize()
    out = []
    for x, s, p in zip(xs, streams, (1, 2), strict=True):
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            out.append(gn_module.group_norm(x, 32, act="silu", passes=p))
    torch.cuda.synchronize()
    for got, want in zip(out, seq, strict=True):
        assert torch.equal(got, want)


def test_nan_and_inf_propagate_like_torch():
    x = cl((2, 32, 8, 8), torch.float32)
    x[0, 0, 3, 3] = float("nan")  # group 0 of sample 0
    x[1, 31, 0, 0] = float("inf")  # group 7 of sample 1
    for passes in (1, 2):
        y = gn_module.group_norm(x, 8, passes=passes)
        ref = F.group_norm(x, 8)
        finite = torch.isfinite(ref)
        assert torch.equal(torch.isfinite(y), finite)  # the two poisoned groups, nothing else
        torch.testing.assert_close(y[finite], ref[finite], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(1, 32, 1, 1, device="cuda").expand(2, 32, 8, 8),  # overlapping (stride 0)
        lambda: cl((2, 64, 8, 8))[:, ::2],  # channel slice: not dense
        lambda: cl((2, 32, 9, 9))[:, :, 1:],  # spatial slice
        lambda: torch.randn(2, 32, 8, 8, device="cuda"),  # NCHW contiguous
        lambda: cl((0, 32, 8, 8)),  # empty batch
        lambda: cl((2, 32, 0, 8)),  # empty spatial
    ],
    ids=["expanded", "channel-slice", "spatial-slice", "nchw", "empty-batch", "empty-spatial"],
)
def test_layouts_off_the_fast_path_match_torch(make):
    x = make()
    w = torch.randn(32, device="cuda", dtype=x.dtype)
    y = gn_module.group_norm(x, 8, w, None)
    torch.testing.assert_close(y, F.group_norm(x, 8, w, None))


def test_requires_grad_on_some_inputs_only():
    x = cl((2, 64, 16, 16), torch.float32).requires_grad_(True)
    w = torch.randn(64, device="cuda")  # no grad wanted
    b = torch.randn(64, device="cuda", requires_grad=True)
    y = gn_module.group_norm(x, 8, w, b, act="silu")
    y.square().sum().backward()
    assert w.grad is None and x.grad is not None and b.grad is not None
    xr = x.detach().double().requires_grad_(True)
    br = b.detach().double().requires_grad_(True)
    F.silu(F.group_norm(xr, 8, w.double(), br)).square().sum().backward()
    torch.testing.assert_close(x.grad.double(), xr.grad, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(b.grad.double(), br.grad, atol=1e-2, rtol=1e-3)


def test_weight_on_another_device_is_a_clear_error():
    x = cl((2, 32, 4, 4))
    with pytest.raises(RuntimeError, match="same device"):
        gn_module.group_norm(x, 8, torch.ones(32))


@pytest.mark.gpu_memory_hog
def test_out_of_memory_is_torchs_error_and_the_process_survives():
    free, _ = torch.cuda.mem_get_info()
    elements = int(free * 0.7) // 2  # x fits; y, the workspace and the rest do not
    shape = (1, 128, elements // (128 * 1024), 1024)
    try:
        x = torch.empty(shape, device="cuda", dtype=torch.float16, memory_format=torch.channels_last)
    except torch.OutOfMemoryError:
        pytest.skip("could not allocate the input itself")
    x.normal_()
    with pytest.raises(torch.OutOfMemoryError):
        gn_module.group_norm(x, 16)
    del x
    torch.cuda.empty_cache()
    y = gn_module.group_norm(cl((2, 32, 8, 8)), 8)  # the process and the library still work
    assert torch.isfinite(y).all()
