"""GPU tests of the wide launches under CUDA autocast (the default; GN_WIDE_AUTOCAST=0 casts): a
float16/bfloat16 x read as it is, float32 y out, float32 dy in and dx in x's dtype, which is what torch
computes from x.float() under autocast. fp64 agreement with poisoned outputs, the launch record (the wide
plan ran), bitwise invariance across residency caps and forward schedules, agreement with the cast path,
and the fallback where no wide launch exists."""

from __future__ import annotations

import pytest
import torch

import gn_module
from gn_module import functional, ops, reference

from .test_kernels import make_case, shape_id

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# (shape, groups): one-tile tasks, many tiles per task, several windows per sample, N > 1, 3-D input; rows of
# 5 column threads (odd: y stored lane by lane) and of 6 (lane pairs whose rows straddle warps)
SHAPES = [
    ((2, 64, 16, 16), 32),
    ((2, 40, 12, 20), 8),
    ((2, 48, 10, 14), 16),
    ((3, 128, 40, 24), 8),
    ((2, 320, 24, 24), 32),
    ((1, 256, 96, 80), 32),
    ((2, 512, 9, 7, 5), 16),
]


@pytest.fixture(autouse=True)
def _wide(monkeypatch):
    monkeypatch.setenv(functional.ENV_WIDE_AUTOCAST, "1")
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd")
    with ops.poison_outputs():
        yield


def run_autocast(x, groups, w, b, act, dy, passes="auto", dtype=None):
    """y, dx, dw, db of our group_norm under CUDA autocast (x's dtype), through autograd."""
    xr = x.detach().requires_grad_(True)
    wr, br = w.detach().requires_grad_(True), b.detach().requires_grad_(True)
    with torch.autocast("cuda", dtype=dtype or x.dtype):
        y = gn_module.group_norm(xr, groups, wr, br, 1e-5, act, passes=passes)
    dx, dw, db = torch.autograd.grad(y, (xr, wr, br), dy)
    return y.detach(), dx, dw, db


def wide_case(shape, groups, dtype):
    x, w, b, _ = make_case(shape, groups, dtype, torch.float32, mean=2.0)
    dy = torch.randn(shape, device="cuda").contiguous(memory_format=_format(shape))
    return x, w, b, dy


def _format(shape):
    return {4: torch.channels_last, 5: torch.channels_last_3d}[len(shape)]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("act", [None, "silu", "gelu"], ids=lambda a: a or "noact")
@pytest.mark.parametrize(("shape", "groups"), SHAPES, ids=shape_id)
def test_wide_against_fp64(shape, groups, dtype, act):
    x, w, b, dy = wide_case(shape, groups, DTYPES[dtype])
    with ops.launch_record() as rec:
        y, dx, dw, db = run_autocast(x, groups, w, b, act, dy)
    for direction in ("fwd", "bwd"):  # the wide launches ran, over every tile
        entry = rec[direction]
        assert entry["arch"] == 2 and entry["plan"].tiling.wide_itemsize == 4, direction
        assert entry["tiles_phase1"] == entry["tiles_applied"] == entry["plan"].tiles
    # what torch computes under autocast: float32 arithmetic on x.float(), float32 y, dx in x's dtype
    assert y.dtype == torch.float32 and dx.dtype == x.dtype and dw.dtype == db.dtype == torch.float32
    assert y.stride() == x.stride() and dx.stride() == x.stride()
    ry, rdx, rdw, rdb = reference.forward_backward(x, groups, w, b, 1e-5, act, dy)
    reference.compare(y, ry, torch.float32, "y")
    reference.compare(dx, rdx, x.dtype, "dx")
    reference.compare(dw, rdw, torch.float16, "dweight")  # (sums over N*S elements: fp32 rounding grows)
    reference.compare(db, rdb, torch.float16, "dbias")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_wide_is_bitwise_equal_across_caps_and_schedules(dtype):
    """Every tile in every reduction at every ratio of tiles to resident blocks: the bits do not move."""
    x, w, b, dy = wide_case((3, 320, 40, 40), 32, DTYPES[dtype])
    base = run_autocast(x, 32, w, b, "silu", dy)
    runs = {}
    for cap in (1, 2, 3, 7):
        for passes in (1, 2):
            with ops.max_resident_blocks(cap), ops.launch_record() as rec:
                runs[(cap, passes)] = run_autocast(x, 32, w, b, "silu", dy, passes=passes)
            assert rec["fwd"]["grid"] <= cap and rec["bwd"]["grid"] <= cap
    runs[("again", "auto")] = run_autocast(x, 32, w, b, "silu", dy)
    for key, got in runs.items():
        for name, a, c in zip(("y", "dx", "dw", "db"), base, got, strict=True):
            assert torch.equal(a, c), f"{name} differs at cap/passes {key}"


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_wide_agrees_with_the_cast_path(dtype, monkeypatch):
    """The same arithmetic as running on x.float() (the cast path): fp32 rounding apart (the tilings
    differ, so the sums' order does), and dx within one rounding of x's dtype."""
    x, w, b, dy = wide_case((2, 256, 48, 40), 32, DTYPES[dtype])
    wide = run_autocast(x, 32, w, b, "silu", dy)
    monkeypatch.setenv(functional.ENV_WIDE_AUTOCAST, "0")
    with ops.launch_record() as rec:
        cast = run_autocast(x, 32, w, b, "silu", dy)
    assert rec["fwd"]["plan"].tiling.itemsize == 4 and rec["fwd"]["plan"].tiling.wide_itemsize == 0
    for name, a, c in zip(
        ("y", "dw", "db"), (wide[0], wide[2], wide[3]), (cast[0], cast[2], cast[3]), strict=True
    ):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4, msg=name)
    torch.testing.assert_close(wide[1].float(), cast[1].float(), **_one_rounding(x.dtype))


def _one_rounding(dtype):
    return {"rtol": 2 * torch.finfo(dtype).eps, "atol": 1e-3}


def test_wide_falls_back_where_no_wide_launch_exists():
    """C=100 (the scalar path) has no wide launch: autocast's cast path runs, with torch's dtypes."""
    x, w, b, dy = wide_case((2, 100, 12, 12), 10, torch.bfloat16)
    with ops.launch_record() as rec:
        y, dx, _, _ = run_autocast(x, 10, w, b, "silu", dy)
    assert rec["fwd"]["plan"].tiling.itemsize == 4  # the float32 copy of x
    assert y.dtype == torch.float32 and dx.dtype == torch.bfloat16
    ry, rdx, _, _ = reference.forward_backward(x, 10, w, b, 1e-5, "silu", dy)
    reference.compare(y, ry, torch.float32, "y")
    reference.compare(dx, rdx, torch.bfloat16, "dx")


def test_wide_without_grad_and_with_misaligned_dy():
    x, w, b, dy = wide_case((2, 128, 20, 20), 32, torch.float16)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16), ops.launch_record() as rec:
        y = gn_module.group_norm(x, 32, w, b, 1e-5, "silu")
    assert y.dtype == torch.float32 and rec["fwd"]["plan"].tiling.wide_itemsize == 4
    reference.compare(y, reference.forward(x, 32, w, b, 1e-5, "silu"), torch.float32, "y")
    # a float32 upstream gradient that is a view 4 bytes into its storage (not 16-byte aligned)
    storage = torch.randn(dy.numel() + 1, device="cuda")
    odd = storage[1:].view(2, 20, 20, 128).permute(0, 3, 1, 2)
    assert odd.data_ptr() % 16 and odd.stride() == x.stride()
    got = run_autocast(x, 32, w, b, "silu", odd)
    ref = run_autocast(x, 32, w, b, "silu", odd.clone(memory_format=torch.channels_last))
    for name, a, c in zip(("y", "dx", "dw", "db"), got, ref, strict=True):
        assert torch.equal(a, c), name
