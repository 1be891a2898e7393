"""The eager no-grad route on a GPU (issue 12): the same results as the autograd.Function route, bit
for bit, on the stream in force, with every output element written. The training route (issue 13):
its lean forward and backward (`ops._forward_lean`, `ops._backward_lean`) give the general route's
bits (`ops.forward`, `ops.backward`, taken inside `launch_record`). CPU tests of the same paths:
tests/test_host_path.py."""

from __future__ import annotations

import contextlib

import pytest
import torch

import gn_module
from gn_module import ops, reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SHAPES = [(2, 64, 8, 8), (8, 320, 32, 32), (2, 32, 4, 4, 4), (4, 96, 50), (16, 64), (3, 30, 7, 9)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def make(shape, dtype, wdtype=None):
    x = torch.randn(shape, device="cuda").to(dtype)
    if len(shape) == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    elif len(shape) == 5:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    elif len(shape) == 3:
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    c = shape[1]
    w = (1 + 0.5 * torch.randn(c, device="cuda")).to(wdtype or dtype)
    b = (0.5 * torch.randn(c, device="cuda")).to(wdtype or dtype)
    return x, w, b


def groups_for(c: int) -> int:
    return 10 if c == 30 else 8


@pytest.mark.parametrize("arch", ["tiles", "tasks+bwd"])  # (tasks and tasks+bwd: one forward)
@pytest.mark.parametrize("passes", ["auto", 1, 2])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_nograd_route_is_bitwise_the_function_route(monkeypatch, shape, dtype, passes, arch):
    monkeypatch.setenv(ops.ENV_ARCH, arch)
    x, w, b = make(shape, dtype, torch.float32 if dtype != torch.float32 else None)
    g = groups_for(shape[1])
    for act in (None, "silu", "gelu"):  # (gelu: a code past the first two)
        try:
            y = gn_module.group_norm(x.detach().requires_grad_(), g, w, b, act=act, passes=passes)
        except RuntimeError as exc:  # e.g. a one-pass kernel that cannot run: the same error
            with torch.no_grad(), pytest.raises(RuntimeError) as got:
                gn_module.group_norm(x, g, w, b, act=act, passes=passes)
            assert str(got.value) == str(exc)
            continue
        with torch.no_grad():
            fast = gn_module.group_norm(x, g, w, b, act=act, passes=passes)
        assert y.grad_fn is not None and fast.grad_fn is None
        assert torch.equal(fast, y.detach()), (shape, dtype, passes, arch, act)
        assert fast.stride() == x.stride()


def _training_step(x, w, b, g, dy, *, general, requires="xwb", **kwargs):
    """y and the gradients of those of x, w, b in `requires`, on the lean or the general route."""
    leaves = [t.detach().requires_grad_(name in requires) for t, name in zip((x, w, b), "xwb", strict=True)]
    with ops.launch_record() if general else contextlib.nullcontext():
        y = gn_module.group_norm(leaves[0], g, leaves[1], leaves[2], **kwargs)
        grads = torch.autograd.grad(y, [t for t in leaves if t.requires_grad], dy)
    return (y.detach(), *grads)


def _assert_same(got, want, what):
    assert len(got) == len(want), what
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        assert (a.dtype, a.shape, a.stride()) == (e.dtype, e.shape, e.stride()), (what, i)
        assert torch.equal(a, e), (what, i)


@pytest.mark.parametrize("arch", ["tiles", "tasks", "tasks+bwd"])
@pytest.mark.parametrize("passes", ["auto", 1, 2])
@pytest.mark.parametrize("params", ["fp32", "x dtype"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_training_route_is_bitwise_the_general_route(monkeypatch, shape, dtype, params, passes, arch):
    if params == "x dtype" and dtype == torch.float32:
        pytest.skip("the fp32 row")
    monkeypatch.setenv(ops.ENV_ARCH, arch)
    x, w, b = make(shape, dtype, torch.float32 if params == "fp32" else None)
    g = groups_for(shape[1])
    dy = torch.randn_like(x)  # x's layout
    for act in (None, "silu", "gelu"):
        kwargs = {"act": act, "passes": passes}
        try:
            lean = _training_step(x, w, b, g, dy, general=False, **kwargs)
        except RuntimeError as exc:  # e.g. a one-pass kernel that cannot run: the same error
            with pytest.raises(RuntimeError) as got:
                _training_step(x, w, b, g, dy, general=True, **kwargs)
            assert str(got.value) == str(exc)
            continue
        _assert_same(lean, _training_step(x, w, b, g, dy, general=True, **kwargs), (act, passes, arch))


@pytest.mark.parametrize("requires", ["x", "w", "b", "wb", "xb"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: str(d).replace("torch.", ""))
def test_training_route_with_frozen_inputs_and_any_gradient_layout(requires, dtype):
    """Frozen x, weight or bias (their dweight/dbias in the scratch) and a gradient in another layout
    (copied to x's): the general route's bits."""
    x, w, b = make((4, 128, 16, 16), dtype)
    for dy in (torch.randn_like(x), torch.randn(x.shape, device="cuda").to(dtype)):  # channels_last, NCHW
        lean = _training_step(x, w, b, 8, dy, general=False, requires=requires, act="silu")
        _assert_same(
            lean, _training_step(x, w, b, 8, dy, general=True, requires=requires, act="silu"), requires
        )


def test_nograd_route_writes_every_element():
    """The allocator's blocks are NaN first, so an element the kernels skip would show."""
    x, w, b = make((8, 320, 32, 32), torch.float16)
    for _ in range(3):
        junk = torch.full((x.numel() * 4,), float("nan"), device="cuda")
        del junk
        with torch.no_grad():
            y = gn_module.group_norm(x, 32, w, b, act="silu")
        reference.compare(y, reference.forward(x, 32, w, b, 1e-5, "silu"), x.dtype, "y (no grad)")


def test_raw_stream_is_the_current_stream():
    index = torch.cuda.current_device()
    assert ops._raw_stream(index) == torch.cuda.current_stream(index).cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert ops._raw_stream(index) == side.cuda_stream != torch.cuda.default_stream(index).cuda_stream


def test_nograd_route_runs_on_the_stream_in_force():
    x, w, b = make((4, 128, 128, 128), torch.float16)
    expected = reference.forward(x, 16, w, b, 1e-5, None)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        y = gn_module.group_norm(x, 16, w, b)
    s.synchronize()
    reference.compare(y, expected, torch.float16, "y on a side stream")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_nograd_route_on_a_second_device():
    x, w, b = (t.to("cuda:1") for t in make((2, 64, 32, 32), torch.float16))
    with torch.no_grad():
        y = gn_module.group_norm(x, 8, w, b, act="silu")
    assert y.device == x.device
    reference.compare(y, reference.forward(x, 8, w, b, 1e-5, "silu"), torch.float16, "y on cuda:1")
