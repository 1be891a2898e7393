"""The eager forward's host path without a GPU (issue 12): the fast argument route, the launch cache
and its keys, the no-grad route, the environment settings, and scripts/host_overhead.py --cpu.

`cpu_device` (from the script) lets CPU tensors take the CUDA fast route against a stub library that
records each launch's GnArgs bytes, so the launches can be compared field by field.
"""

from __future__ import annotations

import ctypes
import importlib.util
import itertools
import json
import os
import random
from pathlib import Path

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F

import gn_module
from gn_module import _abi, functional, ops, schedule
from gn_module.functional import _fast_route, channels_last_view, check_args

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("host_overhead", ROOT / "scripts" / "host_overhead.py")
host_overhead = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(host_overhead)  # type: ignore[union-attr]

POINTERS = set(_abi.POINTER_FIELDS) | {"sync", "trace"}


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ops.ENV_CAP, raising=False)
    monkeypatch.delenv(ops.ENV_ARCH, raising=False)


@pytest.fixture
def stub():
    lib = host_overhead.PyStubLibrary()
    with host_overhead.cpu_device(lib):
        yield lib


def cl(shape=(2, 64, 8, 8), dtype=torch.float16) -> torch.Tensor:
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}[len(shape)]
    return torch.randn(shape).to(dtype).contiguous(memory_format=fmt)


def params(c=64, dtype=torch.float16) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(c).to(dtype), torch.randn(c).to(dtype)


def fields(raw: bytes) -> dict[str, object]:
    a = _abi.GnArgs.from_buffer_copy(raw)
    out = {}
    for name, kind in _abi.GnArgs._fields_:
        value = getattr(a, name)
        out[name] = list(value) if hasattr(kind, "_length_") else value
    return out


def launch_fields(stub, i=-1) -> tuple[str, dict[str, object]]:
    direction, raw, _ = stub.calls[i]
    return direction, fields(raw)


def plain(f: dict[str, object]) -> dict[str, object]:
    """The fields that are not data pointers."""
    return {k: v for k, v in f.items() if k not in POINTERS}


# ---------------------------------------------------------------- the fast route
def test_plain_calls_take_the_fast_route(stub):
    x = cl()
    w, b = params()
    assert _fast_route(x, 32, w, b, 1e-5, "silu", "auto") == (1, 0)
    assert _fast_route(x, 32, None, None, 0.0, None, 2) == (0, 2)
    assert _fast_route(x, 32, None, b.float(), 1e-5, None, 1) == (0, 1)  # float32 bias only
    assert _fast_route(x, 32, w.float(), b.float(), 1e-5, None, "auto") == (0, 0)
    pw, pb = torch.nn.Parameter(w), torch.nn.Parameter(b)
    assert _fast_route(x, 32, pw, pb, 1e-5, None, "auto") == (0, 0)
    assert _fast_route(cl((2, 16, 3, 4, 5)), 4, None, None, 1e-5, None, "auto") == (0, 0)
    nlc = torch.randn(2, 5, 16).transpose(1, 2)  # (N, C, L) stored as (N, L, C)
    assert _fast_route(nlc, 4, None, None, 1e-5, None, "auto") == (0, 0)
    assert _fast_route(torch.randn(3, 16), 4, None, None, 1e-5, None, "auto") == (0, 0)
    gn_module.group_norm(x, 32, w, b, act="silu")
    assert [c[0] for c in stub.calls] == ["fwd"]


class _Sub(torch.Tensor):
    pass


DECLINED = {
    "NCHW-contiguous x": lambda x, w, b: (x.contiguous(), 32, w, b, 1e-5, None, "auto"),
    "numpy groups": lambda x, w, b: (x, __import__("numpy").int64(32), w, b, 1e-5, None, "auto"),
    "bool groups": lambda x, w, b: (x, True, w, b, 1e-5, None, "auto"),
    "groups 0": lambda x, w, b: (x, 0, w, b, 1e-5, None, "auto"),
    "groups -32": lambda x, w, b: (x, -32, w, b, 1e-5, None, "auto"),
    "C % G": lambda x, w, b: (x, 3, w, b, 1e-5, None, "auto"),
    "int eps": lambda x, w, b: (x, 32, w, b, 0, None, "auto"),
    "tensor eps": lambda x, w, b: (x, 32, w, b, torch.tensor(1e-5), None, "auto"),
    "act relu": lambda x, w, b: (x, 32, w, b, 1e-5, "relu", "auto"),
    "passes 3": lambda x, w, b: (x, 32, w, b, 1e-5, None, 3),
    "passes True": lambda x, w, b: (x, 32, w, b, 1e-5, None, True),
    "passes '1'": lambda x, w, b: (x, 32, w, b, 1e-5, None, "1"),
    "weight (C, 1)": lambda x, w, b: (x, 32, w[:, None], b, 1e-5, None, "auto"),
    "bias of size 3": lambda x, w, b: (x, 32, w, b[:3], 1e-5, None, "auto"),
    "weight a list": lambda x, w, b: (x, 32, w.tolist(), b, 1e-5, None, "auto"),
    "weight on meta": lambda x, w, b: (x, 32, w.to("meta"), b, 1e-5, None, "auto"),
    "weight float64": lambda x, w, b: (x, 32, w.double(), b.double(), 1e-5, None, "auto"),
    "weight bf16 with fp16 x": lambda x, w, b: (x, 32, w.bfloat16(), None, 1e-5, None, "auto"),
    "weight and bias dtypes differ": lambda x, w, b: (x, 32, w, b.float(), 1e-5, None, "auto"),
    "x float64": lambda x, w, b: (x.double(), 32, None, None, 1e-5, None, "auto"),
    "x int": lambda x, w, b: (x.long(), 32, None, None, 1e-5, None, "auto"),
    "x empty": lambda x, w, b: (x[:0], 32, None, None, 1e-5, None, "auto"),
    "one value per channel": lambda x, w, b: (cl((1, 4, 1, 1)), 4, None, None, 1e-5, None, "auto"),
    "1-D x": lambda x, w, b: (torch.randn(8), 2, None, None, 1e-5, None, "auto"),
    "tensor subclass x": lambda x, w, b: (x.as_subclass(_Sub), 32, w, b, 1e-5, None, "auto"),
    "not a tensor": lambda x, w, b: (x.tolist(), 32, w, b, 1e-5, None, "auto"),
}


@pytest.mark.parametrize("name", DECLINED)
def test_fast_route_declines_everything_else(stub, name):
    x = cl()
    assert _fast_route(*DECLINED[name](x, *params())) is None


def test_fast_route_declines_off_the_device_and_while_compiling(monkeypatch):
    x = cl()
    assert _fast_route(x, 32, None, None, 1e-5, None, "auto") is None  # CPU is not CUDA
    with host_overhead.cpu_device(host_overhead.PyStubLibrary()):
        assert _fast_route(x, 32, None, None, 1e-5, None, "auto") == (0, 0)
        w = torch.ones(64, dtype=torch.float16, device="meta")
        assert _fast_route(x, 32, w, None, 1e-5, None, "auto") is None  # weight on another device
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        assert _fast_route(x, 32, None, None, 1e-5, None, "auto") is None


def _reason_past_the_device(x, weight) -> str | None:
    """`fast_path_reason` for a tensor on the (faked) device: its checks after the device one."""
    if x.dtype not in functional.FAST_DTYPES:
        return "dtype"
    if weight is not None and weight.dtype not in (torch.float32, x.dtype):
        return "weight dtype"
    if x.numel() == 0:
        return "empty"
    if channels_last_view(x) is None:
        return "layout"
    return None


def test_fast_route_accepts_only_what_the_full_checks_pass(stub):
    """Every row of the torch-parity table, NCHW and channels_last: where the fast route accepts,
    check_args returns the same (num_groups, eps) and fast_path_reason has no objection."""
    from test_torch_parity import FUNCTIONAL_CASES

    accepted = []
    for case in FUNCTIONAL_CASES:
        x, g, w, b, eps = case.args()
        variants = [x]
        if isinstance(x, torch.Tensor) and x.dim() == 4:
            variants.append(x.contiguous(memory_format=torch.channels_last))
        for xv, act, passes in itertools.product(variants, (None, "silu"), ("auto", 2)):
            codes = _fast_route(xv, g, w, b, eps, act, passes)
            if codes is None:
                continue
            accepted.append(case.id)
            got = check_args(xv, g, w, b, eps, act, passes)
            assert got == (g, eps) and type(got[0]) is int and type(got[1]) is float, case.id
            assert _reason_past_the_device(xv, w) is None, case.id
            assert codes == (ops._ACT_IDS[act], ops._PASSES[passes])
    # the route is not vacuous: the plain rows are accepted (in channels_last) ...
    for row in ("eps=0.0", "eps=inf", "fp16 x, fp32 weight and bias", "fp16 x, fp32 bias only", "2-D input"):
        assert row in accepted, row
    # ... and nothing torch rejects is
    rejected = {c.id for c in FUNCTIONAL_CASES if c.torch_raises is not None}
    assert not rejected & set(accepted)


def _strided_tensors(rng: random.Random):
    for _ in range(400):
        ndim = rng.choice((2, 3, 4, 5))
        shape = [rng.choice((1, 2, 3, 4)) for _ in range(ndim)]
        base = torch.empty(shape).permute(*rng.sample(range(ndim), ndim))
        kind = rng.choice(("permute", "slice", "expand", "format"))
        if kind == "slice":
            d = rng.randrange(ndim)
            base = base.narrow(d, 0, max(1, base.shape[d] // 2)) if base.shape[d] > 1 else base
        elif kind == "expand":
            d = rng.randrange(ndim)
            base = base.narrow(d, 0, 1).expand(*base.shape)
        elif kind == "format" and ndim in (4, 5):
            fmt = torch.channels_last if ndim == 4 else torch.channels_last_3d
            base = torch.empty(base.shape).contiguous(memory_format=fmt)
        yield base


def test_layout_check_matches_the_moved_view(stub):
    """The fast route's (N, *spatial, C) test (the channels_last flags for 4-D/5-D) agrees with
    channels_last_view on permuted, sliced, expanded and size-1-dimension tensors."""
    seen = {True: 0, False: 0}
    for x in _strided_tensors(random.Random(0)):
        if x.shape[0] * x.shape[1] == 1:  # N * C / G == 1 (G = 1): the full checks decide
            continue
        expected = channels_last_view(x) is not None
        assert (_fast_route(x, 1, None, None, 1e-5, None, "auto") is not None) == expected, (
            tuple(x.shape),
            x.stride(),
        )
        seen[expected] += 1
    assert seen[True] > 50 and seen[False] > 50


# ---------------------------------------------------------------- the launch cache
def _launch(x, w, *, aligned=True, groups=32, eps=1e-5, act=1, passes=0, direction="fwd"):
    return ops._launch(direction, x, x.get_device(), aligned, groups, eps, act, passes, w)


def test_launch_cache_hits_and_keys(stub, monkeypatch):
    x = cl()
    w, _ = params()
    base = _launch(x, w)
    assert _launch(x, w) is base
    assert _launch(x.clone(memory_format=torch.channels_last), w.clone()) is base  # same signature

    with ops.max_resident_blocks(3):
        capped = _launch(x, w)
    assert capped is not base and capped.plan.cap == 3 and base.plan.cap is None
    monkeypatch.setenv(ops.ENV_CAP, "5")
    assert _launch(x, w).plan.cap == 5
    monkeypatch.delenv(ops.ENV_CAP)
    assert _launch(x, w) is base

    monkeypatch.setenv(ops.ENV_ARCH, "tiles")  # the default is tasks
    tiles = _launch(x, w)
    assert isinstance(base.plan, schedule.TaskPlan) and not isinstance(tiles.plan, schedule.TaskPlan)
    assert fields(base.args)["arch"] == 2 and fields(tiles.args)["arch"] == 1
    monkeypatch.delenv(ops.ENV_ARCH)
    assert _launch(x, w) is base

    with ops.build_variant("compute_80"):
        assert _launch(x, w) is not base
    base_fields = plain(fields(base.args))
    others = {
        "dtype": _launch(x.bfloat16(), w.bfloat16()),
        "shape": _launch(cl((4, 64, 8, 8)), w),
        "alignment": _launch(x, w, aligned=False),
        "groups": _launch(x, w, groups=16),
        "eps": _launch(x, w, eps=1e-3),
        "act": _launch(x, w, act=0),
        "passes": _launch(x, w, passes=2 if base.plan.schedule == 1 else 1),
        "parameter dtype": _launch(x, w.float()),
        "no parameters": _launch(x, None),
        "direction": _launch(x, w, direction="bwd"),
    }
    changed = {
        "dtype": "dtype",
        "shape": "n",
        "alignment": "vec",
        "groups": "g",
        "eps": "eps",
        "act": "act",
        "passes": "schedule",
        "parameter dtype": "w_dtype",
    }
    for what, launch in others.items():
        assert launch is not base, what
        if what in changed:
            assert plain(fields(launch.args))[changed[what]] != base_fields[changed[what]], what
    assert len({id(v) for v in others.values()}) == len(others)


def test_a_cap_takes_effect_on_the_next_call(stub, monkeypatch):
    x = cl((8, 64, 32, 32))
    w, b = params()

    def grid() -> int:
        gn_module.group_norm(x, 32, w, b, passes=1)
        return launch_fields(stub)[1]["grid"]

    natural = grid()
    assert natural > 3
    with ops.max_resident_blocks(3):
        assert grid() == 3
        with ops.max_resident_blocks(2):
            assert grid() == 2
        assert grid() == 3
    assert grid() == natural
    monkeypatch.setenv(ops.ENV_CAP, "4")
    assert grid() == 4
    monkeypatch.setenv(ops.ENV_CAP, "")
    assert grid() == natural


def test_cached_launch_sends_the_uncached_fields(stub, monkeypatch):
    """First call (cache miss), second call (hit), the general `ops.forward` and a GnArgs built from
    the plan by hand: the same non-pointer fields; the pointers are the call's tensors. (The tile
    kernels: task plans also get sync words, test_task_plans_get_their_sync_words.)"""
    monkeypatch.setenv(ops.ENV_ARCH, "tiles")
    x = cl()
    w, b = params(dtype=torch.float32)
    for _ in range(2):
        y = gn_module.group_norm(x, 32, w, b, act="silu")
    first, second = fields(stub.calls[0][1]), fields(stub.calls[1][1])
    p = ops.plan(x.shape, 32, x.dtype, "fwd", "auto", -1)
    by_hand = fields(bytes(ops._args(p, x.dtype, 1e-5, "silu", w.dtype, -1)))
    ops.forward(x, w, b, 32, 1e-5, 1, 0)
    general = fields(stub.calls[2][1])
    assert plain(first) == plain(second) == plain(by_hand) == plain(general)

    assert (second["x"], second["out"]) == (x.data_ptr(), y.data_ptr())
    assert (
        (second["weight"], second["bias"])
        == (w.data_ptr(), b.data_ptr())
        == (general["weight"], general["bias"])
    )
    for name in ("dy", "dweight", "dbias", "record", "sync", "trace"):
        assert not second[name], name
    ws, mean, rstd = second["workspace"], second["mean"], second["rstd"]
    stats = 4 * 2 * 32
    assert ws + 4 * sum(p.workspace_floats.values()) <= mean and mean + stats <= rstd
    assert mean % 256 == rstd % 256 == ws % 256


def test_task_plans_get_their_sync_words(stub, monkeypatch):
    monkeypatch.setenv(ops.ENV_ARCH, "tasks")
    x = cl()
    gn_module.group_norm(x, 32)
    f = launch_fields(stub)[1]
    assert f["arch"] == 2 and f["sync"] != 0 and f["x"] == x.data_ptr()


def test_gradient_route_sends_the_same_fields(stub):
    x = cl().requires_grad_()
    w, b = params()
    with torch.no_grad():
        gn_module.group_norm(x, 32, w, b, act="silu")
    y = gn_module.group_norm(x, 32, w, b, act="silu")
    assert y.grad_fn is not None
    assert plain(fields(stub.calls[0][1])) == plain(fields(stub.calls[1][1]))
    y.backward(torch.ones_like(y))
    assert [c[0] for c in stub.calls] == ["fwd", "fwd", "bwd"]


# ---------------------------------------------------------------- no-grad route
@pytest.fixture
def function_calls(monkeypatch):
    """The calls that go through the autograd.Function (`ops._EagerGroupNorm.apply`)."""
    real, calls = ops._EagerGroupNorm, []

    class Counting:
        @staticmethod
        def apply(*args):
            calls.append(args)
            return real.apply(*args)

    monkeypatch.setattr(ops, "_EagerGroupNorm", Counting)
    return calls


@pytest.mark.parametrize(
    "grad, requires, function",
    [(True, "", False), (False, "xwb", False), (True, "x", True), (True, "w", True), (True, "b", True)],
)
def test_autograd_function_only_where_autograd_needs_it(stub, function_calls, grad, requires, function):
    x = cl().requires_grad_("x" in requires)
    w, b = params()
    w.requires_grad_("w" in requires)
    b.requires_grad_("b" in requires)
    with torch.set_grad_enabled(grad):
        y = gn_module.group_norm(x, 32, w, b, act="silu")
    assert len(function_calls) == int(function)
    assert (y.grad_fn is not None) == function and y.requires_grad == function
    assert len(stub.calls) == 1


def test_inference_mode_takes_the_nograd_route(stub, function_calls):
    x = cl().requires_grad_()
    with torch.inference_mode():
        y = gn_module.group_norm(x, 32)
    assert not function_calls and y.is_inference()


def test_forward_ad_and_functorch_take_the_function(stub):
    x = cl()
    assert not ops._needs_autograd(x, None, None)
    with fwAD.dual_level():
        assert ops._needs_autograd(x, None, None)
        dual = fwAD.make_dual(x, torch.ones_like(x))
        with pytest.raises(RuntimeError, match="jvp"):
            gn_module.group_norm(dual, 32)  # as before: the Function has no forward-mode rule
    seen = []

    def probe(t):
        seen.append(ops._needs_autograd(t, None, None))
        return t

    torch.func.vmap(probe)(torch.randn(3, 4))
    assert seen == [True]


def test_records_poison_and_traces_take_the_general_forward(stub):
    x = cl()
    with torch.no_grad(), ops.poison_outputs():
        y = gn_module.group_norm(x, 32)  # the stub writes nothing: NaN shows the poisoned forward
    assert torch.isnan(y).all()
    with ops.launch_record() as rec:
        gn_module.group_norm(x, 32)
    assert isinstance(rec["fwd"]["plan"], (schedule.Plan, schedule.TaskPlan))
    assert launch_fields(stub)[1]["record"] != 0


# ---------------------------------------------------------------- settings
def test_env_settings_are_read_on_every_call(monkeypatch):
    assert ops.current_cap() is None and ops.current_arch() == ops.DEFAULT_ARCH == "tasks"
    monkeypatch.setenv(ops.ENV_CAP, "4")
    assert ops.current_cap() == 4
    with ops.max_resident_blocks(2):
        assert ops.current_cap() == 2 and ops._settings() == (2, "tasks")
    with ops.max_resident_blocks(9):
        assert ops.current_cap() == 4
    monkeypatch.setenv(ops.ENV_CAP, " 6 ")
    assert ops.current_cap() == 6
    monkeypatch.setenv(ops.ENV_CAP, "")
    assert ops.current_cap() is None
    for bad in ("x", "0", "-2", "1.5"):
        monkeypatch.setenv(ops.ENV_CAP, bad)
        for _ in range(2):  # a bad value is not cached as a good one
            with pytest.raises(ValueError, match="GN_MAX_RESIDENT_BLOCKS must be an integer >= 1"):
                ops.current_cap()
    monkeypatch.setenv(ops.ENV_ARCH, "nope")
    with pytest.raises(ValueError, match="GN_MAX_RESIDENT_BLOCKS"):
        ops._settings()  # both wrong: the cap's error first, as before
    monkeypatch.delenv(ops.ENV_CAP)
    for _ in range(2):
        with pytest.raises(ValueError, match="GN_ARCH must be one of"):
            ops.current_arch()
    for raw, arch in ((" tasks ", "tasks"), ("", "tasks"), ("tiles", "tiles"), ("tasks+bwd", "tasks+bwd")):
        monkeypatch.setenv(ops.ENV_ARCH, raw)
        assert ops.current_arch() == arch and ops._settings() == (None, arch)
    monkeypatch.setattr(os, "environ", {ops.ENV_CAP: "7", ops.ENV_ARCH: "tasks"})
    assert ops._settings() == (7, "tasks") and ops.current_cap() == 7


# ---------------------------------------------------------------- ABI
def test_pointer_prefix_is_the_leading_gnargs_fields():
    a = _abi.GnArgs()
    values = [0x1000 * (i + 1) + 16 for i in range(len(_abi.POINTER_FIELDS))]
    for name, value in zip(_abi.POINTER_FIELDS, values, strict=True):
        setattr(a, name, value)
    assert bytes(a)[: _abi.POINTERS_SIZE] == _abi.POINTERS.pack(*values)
    assert _abi.GnArgs.record.offset + ctypes.sizeof(ctypes.c_void_p) == _abi.POINTERS_SIZE


def test_no_grad_output_matches_torch_layout(stub):
    x = cl()
    with torch.no_grad():
        y = gn_module.group_norm(x, 32)
    assert y.shape == x.shape and y.stride() == x.stride() and y.dtype == x.dtype
    assert F.group_norm(x.float(), 32).shape == y.shape


# ---------------------------------------------------------------- the script
def test_host_overhead_cpu_mode(tmp_path):
    out = tmp_path / "host.json"
    assert host_overhead.main(["--cpu", "--calls", "20", "--rounds", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["mode"] == "cpu" and report["shape"] == [2, 64, 8, 8]
    rows = report["results"]
    assert "group_norm (ours, whole call)" in rows and "torch.empty_like (floor)" in rows
    assert all(r["median_us"] > 0 for r in rows.values())
    assert 0 < len(report["profile_top"]) <= 18
    assert not ops._launches  # the fake device's launches are not left behind


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only message")
def test_host_overhead_gpu_mode_needs_cuda():
    with pytest.raises(SystemExit, match="no CUDA device"):
        host_overhead.main([])
