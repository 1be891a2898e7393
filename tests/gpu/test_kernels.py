"""GPU tests of the GroupNorm kernels: fp64 agreement, overflow, bitwise invariance, plan/launch agreement.

Every test draws fresh random inputs and runs with outputs and workspace poisoned (NaN), so an
element the kernels do not write fails the comparison.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gn_module
from gn_module import ops, reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(autouse=True)
def _poison():
    with ops.poison_outputs():
        yield


def shape_id(value: object) -> str:
    """A readable pytest id for a (shape, groups) parameter pair: "2x320x16x16", "G32"."""
    return "x".join(map(str, value)) if isinstance(value, tuple) else f"G{value}"


def make_case(shape, groups, dtype, wdtype=None, affine=True, device="cuda", mean=0.0, std=1.0):
    """Channels-last input, weight/bias and upstream gradient, all fresh random."""
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(len(shape))
    x = (torch.randn(shape, device=device) * std + mean).to(dtype)
    if fmt is not None:
        x = x.contiguous(memory_format=fmt)
    elif len(shape) == 3:  # (N, C, L) stored as (N, L, C)
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    c = shape[1]
    wdtype = wdtype or dtype
    w = (1 + 0.5 * torch.randn(c, device=device)).to(wdtype) if affine else None
    b = (0.5 * torch.randn(c, device=device)).to(wdtype) if affine else None
    dy = torch.randn(shape, device=device).to(dtype)
    if fmt is not None:
        dy = dy.contiguous(memory_format=fmt)
    return x, w, b, dy


def run(x, groups, w, b, act, passes, dy, eps=1e-5):
    """y, dx, dw, db through autograd with our op."""
    xr = x.detach().requires_grad_(True)
    wr = None if w is None else w.detach().requires_grad_(True)
    br = None if b is None else b.detach().requires_grad_(True)
    y = gn_module.group_norm(xr, groups, wr, br, eps, act, passes=passes)
    inputs = [t for t in (xr, wr, br) if t is not None]
    grads = torch.autograd.grad(y, inputs, dy)
    dw = grads[1] if wr is not None else None
    db = grads[-1] if br is not None else None
    return y.detach(), grads[0], dw, db


def check_against_reference(x, groups, w, b, act, passes, dy, eps=1e-5):
    y, dx, dw, db = run(x, groups, w, b, act, passes, dy, eps)
    ry, rdx, rdw, rdb = reference.forward_backward(x, groups, w, b, eps, act, dy)
    reference.compare(y, ry, x.dtype, "y")
    assert y.stride() == x.stride(), "output must keep the input's memory format"
    # ReLU's derivative jumps at 0: where z is within fp32 rounding of it, either side is right
    kink = reference.relu_kink(x, groups, w, b, eps, dy) if act == "relu" else None
    alt = {} if kink is None else {"alternative": rdx + kink.dx_shift, "slack": kink.dx_slack}
    reference.compare(dx, rdx, x.dtype, "dx", **alt)
    if w is not None:
        assert dw.dtype == w.dtype and db.dtype == b.dtype
        param_dtype = w.dtype if w.dtype != torch.float32 else torch.float16
        slack_w, slack_b = (None, None) if kink is None else (kink.dweight_slack, kink.dbias_slack)
        reference.compare(dw, rdw, param_dtype, "dweight", slack=slack_w)
        reference.compare(db, rdb, param_dtype, "dbias", slack=slack_b)
    return y, dx, dw, db


def natural_residency(shape, groups, dtype, direction):
    return ops.plan(shape, groups, dtype, direction, 1, cap=None).residency


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("wdtype", ["same", "fp32"])
@pytest.mark.parametrize("act", [None, "silu"])
@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("cap", [1, 7, "natural-1", "natural"])
def test_matrix_against_fp64(dtype, wdtype, act, passes, cap):
    shape, groups = (3, 64, 40, 24), 8
    x, w, b, dy = make_case(shape, groups, dtype, torch.float32 if wdtype == "fp32" else dtype)
    if isinstance(cap, str):
        nat = natural_residency(shape, groups, dtype, "fwd")
        cap = max(1, nat - 1) if cap == "natural-1" else nat
    with gn_module.max_resident_blocks(cap):
        check_against_reference(x, groups, w, b, act, passes, dy)


@pytest.mark.parametrize(
    "channels,groups",
    [(96, 32), (30, 10), (3, 1), (64, 64), (320, 32), (1280, 32), (4096, 32), (8, 1), (24, 3)],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("passes", [1, 2])
def test_channel_group_shapes(channels, groups, dtype, passes):
    x, w, b, dy = make_case((2, channels, 9, 7), groups, dtype)
    with gn_module.max_resident_blocks(3):
        check_against_reference(x, groups, w, b, "silu", passes, dy)


@pytest.mark.parametrize(
    "shape",
    [(512, 128, 8, 8), (2, 32, 4, 6, 5), (4, 64, 300), (16, 32), (1, 32, 1, 1), (2, 16, 1, 777)],
    ids=str,
)
def test_layouts_and_extremes(shape):
    x, w, b, dy = make_case(shape, 8 if shape[1] % 8 == 0 else 1, torch.bfloat16, torch.float32)
    for passes in (1, 2):
        check_against_reference(x, 8, w, b, None, passes, dy)


def test_no_affine():
    x, _, _, dy = make_case((2, 64, 17, 19), 4, torch.float16, affine=False)
    check_against_reference(x, 4, None, None, "silu", 1, dy)


def test_bitwise_invariant_across_caps_and_schedules():
    shape, groups = (2, 128, 96, 80), 16
    x, w, b, dy = make_case(shape, groups, torch.float16, torch.float32)
    baseline = run(x, groups, w, b, "silu", 2, dy)
    nat = natural_residency(shape, groups, torch.float16, "bwd")
    for passes in (1, 2):
        for cap in (1, 2, 7, 33, max(1, nat - 1), nat, None):
            if cap is None:
                got = run(x, groups, w, b, "silu", passes, dy)
            else:
                with gn_module.max_resident_blocks(cap):
                    got = run(x, groups, w, b, "silu", passes, dy)
            for name, g, ref in zip(("y", "dx", "dw", "db"), got, baseline, strict=True):
                assert torch.equal(g, ref), f"{name} differs with passes={passes} cap={cap}"


def test_repeatable():
    x, w, b, dy = make_case((4, 256, 33, 31), 32, torch.bfloat16)
    first = run(x, 32, w, b, None, "auto", dy)
    for _ in range(3):
        again = run(x, 32, w, b, None, "auto", dy)
        assert all(torch.equal(a, c) for a, c in zip(first, again, strict=True))


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("cap", [1, 5, None])
def test_launched_grid_matches_plan(direction, cap):
    shape, groups = (2, 64, 128, 64), 8
    x, w, b, dy = make_case(shape, groups, torch.float16)
    with ops.launch_record() as rec:
        if cap is None:
            run(x, groups, w, b, None, 1, dy)
        else:
            with gn_module.max_resident_blocks(cap):
                run(x, groups, w, b, None, 1, dy)
    r = rec[direction]
    p = r["plan"]
    assert r["grid"] == p.grid
    assert r["tiles_phase1"] == p.tiles == r["tiles_applied"]
    if cap is not None:
        assert p.grid == cap and p.overflow_tiles == p.tiles - cap


def test_field_reproducer_overflows_naturally():
    """The shape that broke one-pass kernels on small GPUs overflows the H200 too: the tile kernels'
    one-pass grid holds fewer blocks than the shape has tiles; the task kernels' one-pass blocks hold a
    few of their chunks on chip and read the others again."""
    shape, groups = (1, 128, 1024, 2048), 16
    x, w, b, dy = make_case(shape, groups, torch.float16, torch.float32)
    y, mean, rstd = torch.ops.gn_module.group_norm_fwd(x, w, b, groups, 1e-5, 0, 2)
    dx, dw, db = torch.ops.gn_module.group_norm_bwd(dy, x, w, b, mean, rstd, groups, 1e-5, 0, 1)
    ry, rdx, rdw, rdb = reference.forward_backward(x, groups, w, b, 1e-5, None, dy)
    for out, ref in ((dx, rdx), (dw, rdw), (db, rdb)):
        torch.testing.assert_close(out.double(), ref, atol=1e-2, rtol=1e-2)
    with ops.launch_record() as rec:
        y1, _, _ = torch.ops.gn_module.group_norm_fwd(x, w, b, groups, 1e-5, 0, 1)
    p = rec["fwd"]["plan"]
    assert p.schedule == 1 and (p.overflow_tiles > 0 or getattr(p, "reread_tiles", 0) > 0)
    assert torch.equal(y1, y)
    torch.testing.assert_close(y.double(), ry, atol=1e-2, rtol=1e-2)


def test_constant_group_gives_bias():
    x = torch.full((2, 32, 8, 8), 3.25, device="cuda").contiguous(memory_format=torch.channels_last)
    w = torch.randn(32, device="cuda")
    b = torch.randn(32, device="cuda")
    for passes in (1, 2):
        y = gn_module.group_norm(x, 8, w, b, passes=passes)
        assert torch.equal(y, b.view(1, 32, 1, 1).expand_as(y))


def test_large_mean_fp32():
    x, w, b, _ = make_case((2, 64, 64, 64), 8, torch.float32, mean=1e3, std=1.0)
    for passes in (1, 2):
        y = gn_module.group_norm(x, 8, w, b, passes=passes)
        ref = reference.forward(x, 8, w, b, 1e-5, None)
        torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-4)


def test_torch_compile_fullgraph():
    m = gn_module.GroupNorm(8, 64, act="silu").cuda()
    x = torch.randn(2, 64, 16, 16, device="cuda").contiguous(memory_format=torch.channels_last)
    compiled = torch.compile(m, fullgraph=True)
    y = compiled(x)
    torch.testing.assert_close(y, m(x), atol=0, rtol=0)
    y.sum().backward()


def test_cuda_graph_replay_bitwise():
    m = gn_module.GroupNorm(8, 64, act="silu").cuda()
    static_x = torch.randn(2, 64, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    static_x.requires_grad_(True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm up on a side stream, as graph capture requires
            m(static_x).sum().backward()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    m.zero_grad(set_to_none=True)
    static_x.grad = None
    with torch.cuda.graph(g):
        static_y = m(static_x)
        static_y.square().sum().backward()
    for _ in range(20):
        static_x.data.copy_(torch.randn_like(static_x))
        g.replay()
        xe = static_x.detach().clone().requires_grad_(True)
        ye = m(xe)
        (gx,) = torch.autograd.grad(ye.square().sum(), xe)
        assert torch.equal(static_y, ye)
        assert torch.equal(static_x.grad, gx)


def test_opcheck():
    x, w, b, _ = make_case((2, 32, 8, 8), 4, torch.float16, torch.float32)
    torch.library.opcheck(torch.ops.gn_module.group_norm_fwd.default, (x, w, b, 4, 1e-5, 1, 0))


def test_current_stream_is_used():
    x, w, b, _ = make_case((4, 128, 128, 128), 16, torch.float16)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = gn_module.group_norm(x, 16, w, b)
    s.synchronize()
    reference.compare(y, reference.forward(x, 16, w, b, 1e-5, None), torch.float16)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_second_device():
    x, w, b, dy = make_case((2, 64, 32, 32), 8, torch.float16, device="cuda:1")
    check_against_reference(x, 8, w, b, "silu", 1, dy)


def test_native_path_for_other_layouts():
    x = torch.randn(2, 32, 8, 8, device="cuda", dtype=torch.float16)  # NCHW-contiguous
    y = gn_module.group_norm(x, 4)
    torch.testing.assert_close(y, F.group_norm(x, 4))


def test_unaligned_input_uses_scalar_path():
    base = torch.randn(1 + 2 * 64 * 10 * 10, device="cuda", dtype=torch.float16)
    x = base[1:].view(2, 10, 10, 64).permute(0, 3, 1, 2)  # channels-last, 2-byte aligned
    assert x.data_ptr() % 16 != 0
    dy = torch.randn_like(x)
    check_against_reference(x, 8, None, None, None, 1, dy)


@pytest.mark.gpu_memory_hog
@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_properties(0).total_memory < 60 * 2**30,
    reason="needs a GPU with >= 60 GiB",
)
@pytest.mark.parametrize(
    "shape,dtype",
    [((1, 128, 16128, 1200), torch.bfloat16), ((1, 64, 8192, 4200), torch.float32)],
    ids=["bf16-1x128x16128x1200", "fp32-1x64x8192x4200"],
)
def test_more_than_2_31_elements(shape, dtype):
    groups = 32
    x, w, b, dy = make_case(shape, groups, dtype, torch.float32)
    assert x.numel() > 2**31
    y, dx, dw, db = run(x, groups, w, b, None, "auto", dy)
    d = shape[1] // groups
    rows = lambda t: t.permute(0, 2, 3, 1).reshape(-1, groups, d).split(1 << 21)  # noqa: E731
    # Chunked fp64 reference: group statistics, then per-channel gradient sums, then every row.
    s1 = torch.zeros(groups, dtype=torch.float64, device="cuda")
    s2 = torch.zeros_like(s1)
    for xc in rows(x):
        xd = xc.double()
        s1 += xd.sum(dim=(0, 2))
        s2 += (xd * xd).sum(dim=(0, 2))
    m = x.numel() // groups
    mean = s1 / m
    rstd = (s2 / m - mean * mean + 1e-5).rsqrt()
    wv, bv = w.double().view(groups, d), b.double().view(groups, d)
    sa = torch.zeros(groups, d, dtype=torch.float64, device="cuda")
    sb = torch.zeros_like(sa)
    for xc, gc in zip(rows(x), rows(dy), strict=True):
        xhat = (xc.double() - mean[:, None]) * rstd[:, None]
        sa += (gc.double() * xhat).sum(0)
        sb += gc.double().sum(0)
    torch.testing.assert_close(dw.double().view(groups, d), sa, rtol=1e-3, atol=1e-1)
    torch.testing.assert_close(db.double().view(groups, d), sb, rtol=1e-3, atol=1e-1)
    ga = (sa * wv).sum(1, keepdim=True) / m
    gb = (sb * wv).sum(1, keepdim=True) / m
    # Error beyond the output's own rounding (half an ulp <= |ref| * eps / 2): a bf16 y of 16 or more is
    # 0.0625 from its neighbours, so a flat 0.05 failed on rounding alone (H200, session 28: 0.0558).
    half_ulp = torch.finfo(dtype).eps / 2
    worst_y = worst_dx = 0.0
    for xc, yc, gc, dc in zip(rows(x), rows(y), rows(dy), rows(dx), strict=True):
        xhat = (xc.double() - mean[:, None]) * rstd[:, None]
        ref_y = xhat * wv + bv
        worst_y = max(worst_y, ((yc.double() - ref_y).abs() - half_ulp * ref_y.abs()).max().item())
        ref_dx = rstd[:, None] * (gc.double() * wv - gb - xhat * ga)
        worst_dx = max(worst_dx, ((dc.double() - ref_dx).abs() - half_ulp * ref_dx.abs()).max().item())
    assert worst_y < 0.05 and worst_dx < 0.05, (worst_y, worst_dx)
