"""GPU tests of the C++ autograd node (GN_CPP_NODE=1, gn_module/autograd_node.cpp): a training step through
it must give bitwise the Python autograd.Function's y, dx, dweight and dbias, on the same inputs, in every
precision and activation, under autocast's wide launches, with a dy of another layout or alignment, and on
a side stream. The CPU tests (tests/test_autograd_node.py) compare the launches' bytes; these compare the
kernels' results."""

from __future__ import annotations

import contextlib

import pytest
import torch

import gn_module
from gn_module import autograd_node, ops

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SHAPES = [((2, 64, 8, 8), 32), ((2, 320, 32, 32), 32), ((2, 1280, 16, 16), 32), ((1, 128, 4, 16, 16), 16)]


@pytest.fixture(scope="module", autouse=True)
def _built():
    if autograd_node.load() is None:
        pytest.fail("the C++ autograd node did not build (see the warning)")


def leaves(shape, dtype, pdtype, affine=(True, True)):
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    x = (torch.randn(shape, device="cuda") + 0.5).to(dtype).contiguous(memory_format=fmt).requires_grad_()
    c = shape[1]
    w = (1 + 0.3 * torch.randn(c, device="cuda")).to(pdtype).requires_grad_() if affine[0] else None
    b = (0.2 * torch.randn(c, device="cuda")).to(pdtype).requires_grad_() if affine[1] else None
    return x, w, b


def both_routes(monkeypatch, x, w, b, groups, act, dy_of, autocast=None):
    out = []
    dy = None  # one dy for both routes, made in the layout dy_of gives
    for use_node in ("0", "1"):
        monkeypatch.setenv(autograd_node.ENV, use_node)
        with torch.autocast("cuda", dtype=autocast) if autocast else contextlib.nullcontext():
            y = gn_module.group_norm(x, groups, w, b, act=act)
        assert ("GroupNormNode" in y.grad_fn.name()) == (use_node == "1"), y.grad_fn.name()
        inputs = [t for t in (x, w, b) if t is not None]
        dy = dy_of(y) if dy is None else dy
        grads = torch.autograd.grad(y, inputs, dy)
        out.append((y.detach(), *grads))
    for name, a, c in zip(("y", "dx", "dweight", "dbias"), *out, strict=False):
        assert a.dtype == c.dtype and a.stride() == c.stride(), name
        assert torch.equal(a, c), f"{name}: the node's bits differ from the Function's"
    return out[1]


@pytest.mark.parametrize("act", [None, "silu", "gelu"], ids=lambda a: a or "noact")
@pytest.mark.parametrize("params", ["same", "fp32", "weight only", "none"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(
    ("shape", "groups"), SHAPES, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else f"G{v}"
)
def test_bitwise_the_functions(monkeypatch, shape, groups, dtype, params, act):
    pdtype = torch.float32 if params == "fp32" else DTYPES[dtype]
    affine = {"weight only": (True, False), "none": (False, False)}.get(params, (True, True))
    x, w, b = leaves(shape, DTYPES[dtype], pdtype, affine)
    y, dx, *_ = both_routes(monkeypatch, x, w, b, groups, act, torch.randn_like)
    assert torch.isfinite(y).all() and torch.isfinite(dx).all()


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_wide_autocast(monkeypatch, dtype):
    x, w, b = leaves((2, 320, 32, 32), DTYPES[dtype], torch.float32)
    y, *_ = both_routes(monkeypatch, x, w, b, 32, "silu", torch.randn_like, autocast=DTYPES[dtype])
    assert y.dtype == torch.float32


DY = {
    "nchw": lambda y: torch.randn(y.shape, dtype=y.dtype, device=y.device),
    "misaligned": lambda y: (
        torch.randn(y.numel() + 1, dtype=y.dtype, device=y.device)[1:]
        .view(y.shape[0], *y.shape[2:], y.shape[1])
        .permute(0, 3, 1, 2)
    ),
}


@pytest.mark.parametrize("dy", list(DY))
def test_dy_of_another_layout_or_alignment(monkeypatch, dy):
    x, w, b = leaves((2, 320, 32, 32), torch.float16, torch.float16)
    both_routes(monkeypatch, x, w, b, 32, "silu", DY[dy])


def test_side_stream(monkeypatch):
    x, w, b = leaves((2, 320, 32, 32), torch.bfloat16, torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        both_routes(monkeypatch, x, w, b, 32, "silu", torch.randn_like)
    torch.cuda.current_stream().wait_stream(side)


def test_overflow_caps(monkeypatch):
    """Under residency caps (the overflow path), the node's bits are the Function's and the uncapped ones."""
    x, w, b = leaves((2, 320, 32, 32), torch.float16, torch.float16)
    dy = torch.randn_like(x)
    runs = []
    for cap in (None, 1, 3):
        with gn_module.max_resident_blocks(cap) if cap else contextlib.nullcontext():
            runs.append(both_routes(monkeypatch, x, w, b, 32, "silu", lambda y: dy))
    for run in runs[1:]:
        assert all(torch.equal(a, c) for a, c in zip(runs[0], run, strict=True))


def test_launch_records_keep_the_function(monkeypatch):
    monkeypatch.setenv(autograd_node.ENV, "1")
    x, w, b = leaves((2, 64, 8, 8), torch.float16, torch.float16)
    with ops.launch_record():
        y = gn_module.group_norm(x, 32, w, b)
    assert "GroupNormNode" not in y.grad_fn.name()
