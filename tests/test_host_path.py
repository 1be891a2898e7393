"""The eager forward's host path without a GPU (issue 12): the fast argument route, the launch cache
and its keys, the no-grad route, the environment settings, and scripts/host_overhead.py --cpu.

`cpu_device` (from the script) lets CPU tensors take the CUDA fast route against a stub library that
records each launch's GnArgs bytes, so the launches can be compared field by field.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import random
import re
from pathlib import Path

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from script_loader import load_script

import gn_module
from gn_module import _abi, functional, ops, schedule
from gn_module.functional import _fast_route, channels_last_view, check_args

host_overhead = load_script("host_overhead")

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
    "act tanh": lambda x, w, b: (x, 32, w, b, 1e-5, "tanh", "auto"),
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


def test_fast_route_sends_every_fused_act_as_its_kernel_code(stub):
    x = cl()
    for act in functional.ACTS:
        assert _fast_route(x, 32, *params(), 1e-5, act, "auto") == (_abi.ACT_CODES[act], 0)
    assert sorted(set(_abi.ACT_CODES.values())) == [0, 1, 2, 3, 4]  # csrc/gn_kernels.cuh ActCode
    assert _abi.ACT_CODES["identity"] == _abi.ACT_CODES[None]


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
    """The calls that go through the autograd.Function (`ops._EagerGroupNorm.apply`, or the
    `_function_apply` below its Python wrapper)."""
    real, raw, calls = ops._EagerGroupNorm, ops._function_apply, []

    class Counting:
        @staticmethod
        def apply(*args):
            calls.append(("apply", *args))
            return real.apply(*args)

    def counting_raw(*args):
        calls.append(("raw", *args))
        return raw(*args)

    monkeypatch.setattr(ops, "_EagerGroupNorm", Counting)
    monkeypatch.setattr(ops, "_function_apply", counting_raw)
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


# ---------------------------------------------------------------- the training route
def _step(x, w, b, *, act="silu", passes="auto", dy=None, inputs=None):
    """One training step through gn_module.group_norm: y, the gradients of `inputs` (default: those of
    x, w, b that require grad) and the fields of the step's forward and backward launches."""
    start = len(_stub_calls())
    y = gn_module.group_norm(x, 32, w, b, act=act, passes=passes)
    dy = torch.randn_like(y) if dy is None else dy
    inputs = inputs or tuple(t for t in (x, w, b) if t is not None and t.requires_grad)
    grads = torch.autograd.grad(y, inputs, dy, retain_graph=True)  # the saved tensors stay readable
    calls = _stub_calls()[start:]
    assert [c[0] for c in calls] == ["fwd", "bwd"]
    return y, dy, grads, fields(calls[0][1]), fields(calls[1][1])


_STUB: list = []


def _stub_calls() -> list:
    return _STUB[-1].calls


@pytest.fixture
def train_stub(stub):
    _STUB.append(stub)
    yield stub
    _STUB.pop()


def _leaf(t, requires=True):
    return None if t is None else t.detach().requires_grad_(requires)


PARAMS = {
    "fp16 weight and bias": lambda: params(),
    "fp32 weight and bias": lambda: params(dtype=torch.float32),
    "bf16 weight, no bias": lambda: (params(dtype=torch.bfloat16)[0], None),
    "no weight, fp32 bias": lambda: (None, params(dtype=torch.float32)[1]),
    "no parameters": lambda: (None, None),
}


@pytest.mark.parametrize("arch", ["tiles", "tasks", "tasks+bwd"])
@pytest.mark.parametrize("act, passes", [("silu", "auto"), (None, 1), (None, 2)])
@pytest.mark.parametrize("case", PARAMS)
def test_training_route_launches_as_the_general_one(train_stub, monkeypatch, case, act, passes, arch):
    """The lean forward and backward (`_forward_lean`, `_backward_lean`) against the general `forward`
    and `backward` (taken inside launch_record): the same non-pointer GnArgs fields in both
    directions, gradients of the same dtypes, shapes and strides, and the pointers of the step's
    tensors: the backward reads the mean and rstd the forward wrote, writes the dx and the dweight and
    dbias it returns where they need no cast (float32 parameters; the task backward stores them in the
    parameters' dtype, GnArgs.grad_dtype), and the forward's workspace is not among the saved tensors."""
    monkeypatch.setenv(ops.ENV_ARCH, arch)
    x = cl().bfloat16() if case.startswith("bf16") else cl()
    w, b = (_leaf(t) for t in PARAMS[case]())
    lean_x = _leaf(x)
    y, dy, grads, fwd, bwd = _step(lean_x, w, b, act=act, passes=passes)
    with ops.launch_record():
        general = _step(_leaf(x), w, b, act=act, passes=passes, dy=dy)
    assert plain(fwd) == plain(general[3]) and plain(bwd) == plain(general[4])
    assert len(grads) == len(general[2])
    for got, want in zip(grads, general[2], strict=True):
        assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    assert (fwd["x"], fwd["out"], fwd["dy"]) == (lean_x.data_ptr(), y.data_ptr(), None)
    assert (bwd["x"], bwd["dy"], bwd["out"]) == (lean_x.data_ptr(), dy.data_ptr(), grads[0].data_ptr())
    for name, p in (("weight", w), ("bias", b)):
        assert fwd[name] == bwd[name] == (None if p is None else p.data_ptr())
    assert (bwd["mean"], bwd["rstd"]) == (fwd["mean"], fwd["rstd"])
    saved = y.grad_fn.saved_tensors
    assert len(saved) == 4 and saved[3].dtype == torch.float32
    stats = saved[3].data_ptr()
    ng = x.shape[0] * 32
    assert fwd["mean"] == stats and fwd["rstd"] == stats + 4 * ops._round_up(ng, 64)
    assert saved[3].numel() == ops._round_up(ng, 64) + ng
    assert fwd["workspace"] not in range(stats, stats + 4 * saved[3].numel())
    returned = {t.data_ptr() for t in grads[1:]}
    param = w if w is not None else b
    for name, p in (("dweight", w), ("dbias", b)):
        assert bwd[name]
        as_written = p is not None and (param.dtype == torch.float32 or bwd["arch"] == 2)
        assert (bwd[name] in returned) == as_written, name
    typed = bwd["arch"] == 2 and param is not None
    assert bwd["grad_dtype"] == (_abi.DTYPE_CODES[str(param.dtype).removeprefix("torch.")] if typed else 0)
    assert bool(fwd["sync"]) == (fwd["arch"] == 2) and bool(bwd["sync"]) == (bwd["arch"] == 2)
    sync_buffers = {buf.data_ptr() for buf in ops._sync_buffers.values()}
    assert all(f["sync"] in sync_buffers for f in (fwd, bwd) if f["sync"])


class _WritingStub(host_overhead.PyStubLibrary):
    """Writes what the kernels would: forward mean = n*G + g and rstd = its negative, backward
    dweight = c and dbias = -c after checking that it reads the forward's mean and rstd."""

    def gn_forward(self, args, stream):
        super().gn_forward(args, stream)
        a = _abi.GnArgs.from_buffer_copy(self.calls[-1][1])
        ng = a.n * a.g
        (ctypes.c_float * ng).from_address(a.mean)[:] = [float(i) for i in range(ng)]
        (ctypes.c_float * ng).from_address(a.rstd)[:] = [-float(i) for i in range(ng)]
        return 0

    def gn_backward(self, args, stream):
        super().gn_backward(args, stream)
        a = _abi.GnArgs.from_buffer_copy(self.calls[-1][1])
        ng = a.n * a.g
        assert list((ctypes.c_float * ng).from_address(a.mean)) == [float(i) for i in range(ng)]
        assert list((ctypes.c_float * ng).from_address(a.rstd)) == [-float(i) for i in range(ng)]
        for ptr, sign in ((a.dweight, 1.0), (a.dbias, -1.0)):  # in the dtype GnArgs.grad_dtype names
            values = torch.arange(a.c, dtype=torch.float32) * sign
            dtype = {0: torch.float32, 1: torch.float16, 2: torch.bfloat16}[a.grad_dtype]
            data = values.to(dtype).view(torch.uint8 if dtype is torch.float32 else torch.int16)
            raw = data.numpy().tobytes()
            ctypes.memmove(ptr, raw, len(raw))
        return 0


@pytest.mark.parametrize("arch", ["tiles", "tasks+bwd"])
@pytest.mark.parametrize("pdtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("route", ["lean", "general"])
def test_parameter_gradients_are_what_the_kernels_wrote(monkeypatch, pdtype, route, arch):
    """The backward reads the statistics the forward wrote and returns the dweight and dbias the
    kernels wrote, in the parameters' dtype (the tile kernels write float32, cast through the scratch
    for float16/bfloat16; the task backward writes the parameters' dtype itself)."""
    monkeypatch.setenv(ops.ENV_ARCH, arch)
    with host_overhead.cpu_device(_WritingStub()):
        x = _leaf(cl((3, 64, 4, 4)) if pdtype != torch.bfloat16 else cl((3, 64, 4, 4)).bfloat16())
        w, b = (_leaf(t) for t in params(dtype=pdtype))
        with ops.launch_record() if route == "general" else contextlib.nullcontext():
            y = gn_module.group_norm(x, 32, w, b)
            y.backward(torch.ones_like(y))
    expected = torch.arange(64, dtype=torch.float32).to(pdtype)
    assert w.grad.dtype == b.grad.dtype == pdtype
    assert torch.equal(w.grad, expected) and torch.equal(b.grad, -expected)


@pytest.mark.parametrize("requires", ["x", "w", "b", "xw", "xb", "wb", "xwb"])
@pytest.mark.parametrize("pdtype", [torch.float16, torch.float32])
def test_training_route_returns_the_gradients_asked_for(train_stub, requires, pdtype):
    """Gradients of exactly the inputs that need one, of the input's dtype, as the general route."""
    x = cl()
    w, b = params(dtype=pdtype)
    results = []
    for general in (False, True):
        tensors = [_leaf(t, name in requires) for t, name in ((x, "x"), (w, "w"), (b, "b"))]
        with ops.launch_record() if general else contextlib.nullcontext():
            y = gn_module.group_norm(*tensors[:1], 32, *tensors[1:], act="silu")
            y.backward(torch.ones_like(y))
        results.append([None if t.grad is None else (t.grad.dtype, t.grad.shape) for t in tensors])
    assert results[0] == results[1]
    assert [g is not None for g in results[0]] == [name in requires for name in "xwb"]
    assert all(g is None or g[0] == t.dtype for g, t in zip(results[0], (x, w, b), strict=True))


def test_backward_reads_the_settings_in_force_when_it_runs(train_stub, monkeypatch):
    """As before the lean backward: the cap, GN_ARCH and build variant of the backward's launch are
    those in force when the backward runs, not those of its forward (the launch cache key has them)."""
    monkeypatch.setenv(ops.ENV_ARCH, "tiles")
    x = cl((8, 64, 32, 32))
    w, b = params()

    def forward():
        return gn_module.group_norm(_leaf(x), 32, w, b, passes=1)

    y = forward()
    with ops.max_resident_blocks(3):
        y.backward(torch.ones_like(y))
    natural = launch_fields(train_stub, -2)[1]["grid"]
    assert launch_fields(train_stub)[1]["grid"] == 3 < natural
    with ops.max_resident_blocks(3):
        y = forward()
    assert launch_fields(train_stub)[1]["grid"] == 3
    y.backward(torch.ones_like(y))
    direction, f = launch_fields(train_stub)
    assert direction == "bwd" and f["grid"] > 3
    monkeypatch.setenv(ops.ENV_CAP, "2")
    forward().backward(torch.ones_like(y))
    assert launch_fields(train_stub, -2)[1]["grid"] == launch_fields(train_stub)[1]["grid"] == 2
    monkeypatch.delenv(ops.ENV_CAP)

    monkeypatch.setenv(ops.ENV_ARCH, "tiles")
    y = forward()
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd")
    y.backward(torch.ones_like(y))
    assert launch_fields(train_stub, -2)[1]["arch"] == 1 and launch_fields(train_stub)[1]["arch"] == 2
    y = forward()
    monkeypatch.setenv(ops.ENV_ARCH, "tiles")
    y.backward(torch.ones_like(y))
    assert launch_fields(train_stub, -2)[1]["arch"] == 2 and launch_fields(train_stub)[1]["arch"] == 1

    y = forward()
    with ops.build_variant("compute_80"):
        y.backward(torch.ones_like(y))
    variants = {(key[0], key[11]) for key in ops._launches}
    assert ("bwd", "compute_80") in variants and ("fwd", "compute_80") not in variants


def test_records_and_poison_at_either_end_of_a_step(train_stub):
    """A forward and backward on different routes (lean or general, as records, poisoning and traces
    are on when each runs) hand the backward the mean and rstd the forward wrote."""
    x = cl()
    w, b = params(dtype=torch.float32)
    y = gn_module.group_norm(_leaf(x), 32, w, b)  # lean
    with ops.launch_record() as rec:
        y.backward(torch.ones_like(y))  # general
    fwd, bwd = launch_fields(train_stub, -2)[1], launch_fields(train_stub)[1]
    assert rec["bwd"]["plan"].tiling.direction == "bwd" and bwd["record"] != 0
    assert (bwd["mean"], bwd["rstd"]) == (fwd["mean"], fwd["rstd"])
    with ops.launch_record():
        y = gn_module.group_norm(_leaf(x), 32, w, b)  # general
    assert len(y.grad_fn.saved_tensors) == 4  # laid out as the lean forward's
    assert launch_fields(train_stub)[1]["mean"] == y.grad_fn.saved_tensors[3].data_ptr()
    y.backward(torch.ones_like(y))  # lean
    fwd, bwd = launch_fields(train_stub, -2)[1], launch_fields(train_stub)[1]
    assert (bwd["mean"], bwd["rstd"]) == (fwd["mean"], fwd["rstd"]) and bwd["record"] is None
    xg = _leaf(x)
    with ops.poison_outputs():
        y = gn_module.group_norm(xg, 32, w, b)
        y.backward(torch.ones_like(y))
    assert torch.isnan(y).all() and torch.isnan(xg.grad).all()


def test_gradients_in_another_layout_are_copied_to_x_layout(train_stub):
    x = _leaf(cl())
    y = gn_module.group_norm(x, 32)
    dy = torch.randn(y.shape)  # NCHW-contiguous against channels_last x
    (dx,) = torch.autograd.grad(y, x, dy)
    bwd = launch_fields(train_stub)[1]
    assert bwd["dy"] != dy.data_ptr() and bwd["out"] == dx.data_ptr() and dx.stride() == x.stride()
    y = gn_module.group_norm(x, 32)
    torch.autograd.grad(y, x, torch.ones(()).expand(y.shape))  # strides 0: copied too
    assert launch_fields(train_stub)[1]["dy"] != 0


class _FailingStub(host_overhead.PyStubLibrary):
    def __init__(self, direction: str) -> None:
        super().__init__()
        self.failing = direction

    def gn_forward(self, args, stream):
        return super().gn_forward(args, stream) or (7 if self.failing == "fwd" else 0)

    def gn_backward(self, args, stream):
        return super().gn_backward(args, stream) or (7 if self.failing == "bwd" else 0)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_launch_errors_are_the_general_routes(direction):
    messages = []
    with host_overhead.cpu_device(_FailingStub(direction)):
        for general in (False, True):
            route = ops.launch_record() if general else contextlib.nullcontext()
            with route, pytest.raises(RuntimeError) as info:
                y = gn_module.group_norm(_leaf(cl()), 32)
                y.backward(torch.ones_like(y))
            messages.append(str(info.value))
    assert (
        messages[0] == messages[1] == f"gn_module: GroupNorm {direction} launch failed: CUDA error 7 (stub)"
    )


def test_saved_tensor_hooks_and_checkpointing_see_every_saved_tensor(train_stub):
    """All the step keeps goes through save_for_backward: saved-tensor hooks (CPU offload, checkpointing)
    see x, weight, bias and the statistics, and non-reentrant checkpointing recomputes the forward."""
    x = _leaf(cl())
    w, b = (_leaf(t) for t in params())
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = gn_module.group_norm(x, 32, w, b, act="silu")
    assert [p.shape for p in packed[:3]] == [x.shape, w.shape, b.shape] and len(packed) == 4
    y.backward(torch.ones_like(y))
    start = len(train_stub.calls)

    def layer(t):
        return gn_module.group_norm(t, 32, w, b)

    out = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
    out.backward(torch.ones_like(out))
    assert [c[0] for c in train_stub.calls[start:]] == ["fwd", "fwd", "bwd"]
    with ops.launch_record():  # the general forward, recomputed on the lean one: the same saved tensors
        out = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
    out.backward(torch.ones_like(out))
    assert [c[0] for c in train_stub.calls[start + 3 :]] == ["fwd", "fwd", "bwd"]


def test_the_function_below_its_python_wrapper_only_without_functorch(train_stub, function_calls):
    x = _leaf(cl())
    gn_module.group_norm(x, 32)
    assert [c[0] for c in function_calls] == ["raw"]
    leaked = []

    def inner(w):
        leaked.append(w)
        return w.sum()

    torch.func.grad(inner)(torch.ones(64, dtype=torch.float16))
    (dead,) = leaked  # a functorch wrapper outliving its transform: the wrapper unwraps it
    assert ops._is_functorch_wrapped(dead)
    y = gn_module.group_norm(x, 32, dead.requires_grad_(), None)
    assert [c[0] for c in function_calls] == ["raw", "apply"] and y.grad_fn is not None
    with pytest.raises(RuntimeError, match="setup_context"):  # as before: functorch needs setup_context
        torch.func.grad(lambda t: gn_module.group_norm(t, 32).sum())(cl())
    assert function_calls[-1][0] == "apply"


# ---------------------------------------------------------------- settings
def test_a_replacing_cap_sets_the_outer_ones_aside(monkeypatch):
    monkeypatch.setenv(ops.ENV_CAP, "4")
    with ops.max_resident_blocks(1):
        assert ops.current_cap() == 1
        with ops.max_resident_blocks(2, replace=True):
            assert ops.current_cap() == 2  # above the outer cap and the env var
            with ops.max_resident_blocks(3):
                assert ops.current_cap() == 2  # inner caps still only tighten
            with ops.max_resident_blocks(9, replace=True):
                assert ops.current_cap() == 9 and ops._settings()[0] == 9
            assert ops.current_cap() == 2
        assert ops.current_cap() == 1
        with ops.max_resident_blocks(1), ops.max_resident_blocks(5, replace=True):
            assert ops.current_cap() == 5
        assert ops.current_cap() == 1
    assert ops.current_cap() == 4 and not ops._caps
    monkeypatch.delenv(ops.ENV_CAP)
    with pytest.raises(ValueError, match="k must be an int >= 1"), ops.max_resident_blocks(0, replace=True):
        pass


def test_env_settings_are_read_on_every_call(monkeypatch):
    assert ops.current_cap() is None and ops.current_arch() == ops.DEFAULT_ARCH == "tasks+bwd"
    monkeypatch.setenv(ops.ENV_CAP, "4")
    assert ops.current_cap() == 4
    with ops.max_resident_blocks(2):
        assert ops.current_cap() == 2 and ops._settings() == (2, ops.DEFAULT_ARCH)
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
    values = ((" tasks ", "tasks"), ("", ops.DEFAULT_ARCH), ("tiles", "tiles"), ("tasks+bwd", "tasks+bwd"))
    for raw, arch in values:
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
    train = report["training"]["results"]
    for row in ("train step fp32 (group_norm + autograd.grad)", "train step bf16 params", "floor: empty"):
        assert any(label.startswith(row) for label in train), row
    assert all(r["median_us"] > 0 for r in train.values())
    assert 0 < len(report["training"]["profile_top"]) <= 18
    assert not ops._launches  # the fake device's launches are not left behind


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only message")
def test_host_overhead_gpu_mode_needs_cuda():
    with pytest.raises(SystemExit, match="no CUDA device"):
        host_overhead.main([])


# ---------------------------------------------------------------- autocast's wide launches
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("grad", [True, False], ids=["train", "nograd"])
def test_autocast_takes_the_wide_launches(train_stub, monkeypatch, dtype, grad):
    """Under CUDA autocast (faked on the CPU) a float16/bfloat16 x goes to the kernels as it is: the
    launches carry x's dtype and wide_dtype float32, y is float32, dx x's dtype; the backward's float32
    dy arrives in x's layout. GN_WIDE_AUTOCAST=0 casts x to float32 first (every dtype field float32)."""
    monkeypatch.setattr(functional, "_under_cuda_autocast", lambda x: True)
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd")
    x = _leaf(cl(dtype=dtype), grad)
    w, b = (_leaf(p, grad) for p in params(dtype=torch.float32))
    start = len(_stub_calls())
    with torch.set_grad_enabled(grad):
        y = gn_module.group_norm(x, 32, w, b, act="silu")
    assert y.dtype == torch.float32 and y.stride() == x.stride()
    direction, f = launch_fields(train_stub)
    code = _abi.DTYPE_CODES[str(dtype).replace("torch.", "")]
    assert direction == "fwd" and (f["dtype"], f["wide_dtype"], f["w_dtype"]) == (code, 0, 0)
    if grad:
        dx, dw, db = torch.autograd.grad(y, (x, w, b), torch.randn_like(y))
        assert dx.dtype == dtype and dw.dtype == db.dtype == torch.float32
        direction, f = launch_fields(train_stub)
        assert direction == "bwd" and (f["dtype"], f["wide_dtype"]) == (code, 0)
    assert len(_stub_calls()) - start == (2 if grad else 1)
    monkeypatch.setenv(functional.ENV_WIDE_AUTOCAST, "0")
    y = gn_module.group_norm(x, 32, w, b, act="silu")
    _, f = launch_fields(train_stub)
    assert y.dtype == torch.float32 and (f["dtype"], f["wide_dtype"]) == (0, 0)


def test_autocast_without_a_wide_launch_casts(train_stub, monkeypatch):
    """C=100 in bf16 has no 16-byte vectors, so no wide launch: x is cast to float32 and nothing else
    is launched for the call (the backward's wide launch is checked before the forward's kernels)."""
    monkeypatch.setattr(functional, "_under_cuda_autocast", lambda x: True)
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd")
    x = _leaf(cl((2, 100, 8, 8), torch.bfloat16))
    w, b = (_leaf(p) for p in params(100, torch.float32))
    start = len(_stub_calls())
    y = gn_module.group_norm(x, 10, w, b, act="silu")
    assert [c[0] for c in _stub_calls()[start:]] == ["fwd"]
    _, f = launch_fields(train_stub)
    assert y.dtype == torch.float32 and (f["dtype"], f["wide_dtype"]) == (0, 0)
    monkeypatch.setenv(ops.ENV_ARCH, "tiles")  # the tile kernels have no wide launch either
    x = _leaf(cl((2, 64, 8, 8), torch.bfloat16))
    w, b = (_leaf(p) for p in params(64, torch.float32))
    gn_module.group_norm(x, 32, w, b)
    _, f = launch_fields(train_stub)
    assert (f["dtype"], f["wide_dtype"], f["arch"]) == (0, 0, 1)


@pytest.mark.parametrize("grad", [True, False], ids=["train", "nograd"])
def test_autocast_one_sample_one_channel_per_group_is_wide(train_stub, monkeypatch, grad):
    """N = 1 with one channel per group (N * C // G == 1) but spatial extent is no "one value per
    channel" error: the fast route takes it, so under autocast it runs the wide launches (it used to go
    to the cast: the plugin's one-sample c32g32 wide cases measured the float32 tiling)."""
    monkeypatch.setattr(functional, "_under_cuda_autocast", lambda x: True)
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd")
    x = _leaf(cl((1, 32, 3, 4), torch.float16), grad)
    assert _fast_route(x, 32, None, None, 1e-5, None, "auto") == (0, 0)
    w, b = (_leaf(p, grad) for p in params(32, torch.float32))
    with torch.set_grad_enabled(grad):
        y = gn_module.group_norm(x, 32, w, b)
    _, f = launch_fields(train_stub)
    assert y.dtype == torch.float32 and (f["dtype"], f["wide_dtype"]) == (_abi.DTYPE_CODES["float16"], 0)


def test_task_launches_carry_their_divisors() -> None:
    t = schedule.task_tiling(1280, 32, 256, 2, "fwd", batch=2)
    p = schedule.make_task_plan(t, 1, 6, 264)
    a = ops._args(p, torch.float16, 1e-5, "silu", torch.float16, -1)
    for name in _abi.FAST_DIVISORS:
        d = getattr(a, name)
        assert d >= 1 and (getattr(a, f"{name}_mul"), getattr(a, f"{name}_shift")) == schedule.fast_divisor(d)


def test_gnargs_fields_follow_the_c_header_in_order() -> None:
    """_abi.GnArgs mirrors csrc/gn_api.h field by field: the same names in the same order (the library's
    gn_abi_size only checks the total size, which two swapped fields of one type keep)."""
    header = (Path(__file__).resolve().parents[1] / "csrc" / "gn_api.h").read_text()
    body = header[header.index("typedef struct GnArgs {") : header.index("} GnArgs;")].splitlines()[1:]
    names = []
    for line in body:
        decl = line.split("//")[0].strip()
        if not decl:
            continue
        decl = re.sub(r"\[[^\]]*\]", "", decl.rstrip(";"))
        words = [w.strip() for w in decl.split(",")]
        names.append(words[0].replace("*", " ").split()[-1])
        names += words[1:]
    assert names == [name for name, _ in _abi.GnArgs._fields_]


# ---------------------------------------------------------------- the custom op (torch.compile graphs)
@pytest.mark.parametrize("arch", ["tiles", "tasks", "tasks+bwd"])
@pytest.mark.parametrize("case", PARAMS)
def test_custom_op_route_launches_as_the_general_one(train_stub, monkeypatch, case, arch):
    """What a compiled graph runs (`_op_forward`, `_op_backward`: the cached launch bytes) against the
    general `forward` and `backward`: the same non-pointer GnArgs fields in both directions, outputs of
    the same dtypes, shapes and strides (dweight and dbias always returned, as the op's schema has
    them), and the pointers of the op's own tensors: the backward reads the mean and rstd the forward
    returned."""
    monkeypatch.setenv(ops.ENV_ARCH, arch)
    x = cl().bfloat16() if case.startswith("bf16") else cl()
    w, b = PARAMS[case]()
    start = len(_stub_calls())
    y, mean, rstd = ops._op_forward(x, w, b, 32, 1e-5, 1, 0)
    dy = torch.randn_like(y)
    dx, dw, db = ops._op_backward(dy, x, w, b, mean, rstd, 32, 1e-5, 1, 0)
    calls = _stub_calls()[start:]
    assert [c[0] for c in calls] == ["fwd", "bwd"]
    fwd, bwd = fields(calls[0][1]), fields(calls[1][1])
    with ops.launch_record():
        general = ops.forward(x, w, b, 32, 1e-5, 1, 0)
        general += ops.backward(dy, x, w, b, general[1], general[2], 32, 1e-5, 1, 0)
    assert plain(fwd) == plain(fields(_stub_calls()[-2][1])) and plain(bwd) == plain(
        fields(_stub_calls()[-1][1])
    )
    for got, want in zip((y, mean, rstd, dx, dw, db), general, strict=True):
        assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    assert (fwd["x"], fwd["out"], fwd["mean"], fwd["rstd"]) == tuple(t.data_ptr() for t in (x, y, mean, rstd))
    assert (bwd["x"], bwd["dy"], bwd["out"]) == (x.data_ptr(), dy.data_ptr(), dx.data_ptr())
    assert (bwd["mean"], bwd["rstd"]) == (mean.data_ptr(), rstd.data_ptr())
    assert fwd["workspace"] not in (mean.data_ptr(), rstd.data_ptr(), y.data_ptr())


def test_custom_op_records_and_poison_take_the_general_route(train_stub):
    x = cl()
    with ops.poison_outputs():
        y, mean, _ = ops._op_forward(x, None, None, 32, 1e-5, 0, 0)  # the stub writes nothing
    assert torch.isnan(y).all() and torch.isnan(mean).all()
    with ops.launch_record() as rec:
        ops._op_forward(x, None, None, 32, 1e-5, 0, 0)
    assert "fwd" in rec and launch_fields(train_stub)[1]["record"] != 0


@pytest.mark.parametrize(
    ("shape", "groups", "wide"), [((2, 64, 8, 8), 32, True), ((2, 100, 8, 8), 10, False)]
)
def test_custom_op_float32_form_is_wide_where_the_kernels_have_it(
    train_stub, monkeypatch, shape, groups, wide
):
    """The op's wide form (torch.compile under autocast): x as it is with wide_dtype float32 where the
    kernels have that launch, else the launch on a float32 copy of x (C=100 bf16: no 16-byte vectors);
    float32 y and float32 dy either way, dx in x's dtype."""
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd")
    x = cl(shape, torch.bfloat16)
    w, b = params(shape[1], torch.float32)
    y, mean, rstd = ops._forward_float32(x, w, b, groups, 1e-5, 1, 0)
    _, f = launch_fields(train_stub)
    code = _abi.DTYPE_CODES["bfloat16"] if wide else 0
    assert (
        y.dtype == torch.float32 and y.stride() == x.stride() and (f["dtype"], f["wide_dtype"]) == (code, 0)
    )
    dx, dw, db = ops._backward_float32(torch.randn_like(y), x, w, b, mean, rstd, groups, 1e-5, 1, 0)
    _, f = launch_fields(train_stub)
    assert (
        dx.dtype == torch.bfloat16
        and dx.stride() == x.stride()
        and (f["dtype"], f["wide_dtype"]) == (code, 0)
    )
    assert dw.dtype == db.dtype == torch.float32
