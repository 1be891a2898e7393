"""The custom ops' C++ kernels (gn_module/op_kernels.cpp, what compiled graphs call) against the Python
kernels they stand in for, on CPU: each route is registered for CPU in turn and launches into the stub
library of test_autograd_node (C-callable entry points that record each launch's GnArgs bytes and write
what the kernels would: the statistics forward, dweight and dbias backward).

Both routes must send the same GnArgs fields but for the pointers each allocates, take the caller's
pointers where the Python route does, return tensors of the same dtypes, shapes, strides and written
values, follow the same settings (caps, environment, arch) from one call to the next, leave launch
records and calls with no wide launch to the Python body, and raise the same errors. Skips where the
extension cannot be built (no C++ compiler or ninja).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch
from test_autograd_node import DY as NODE_DY
from test_autograd_node import PARAMS, CEntries
from test_host_path import _FailingStub, _WritingStub, cl, fields, host_overhead, params

from gn_module import autograd_node, op_kernels, ops

pytestmark = pytest.mark.filterwarnings("ignore:memory leak in callback function:RuntimeWarning")

FWD, BWD = torch.ops.gn_module.group_norm_fwd.default, torch.ops.gn_module.group_norm_bwd.default
#: The GnArgs pointers of tensors each route allocates itself: its outputs and workspace, and in the
#: backward the statistics of its own forward.
ALLOCATED = {
    "fwd": {"out", "mean", "rstd", "workspace", "sync"},
    "bwd": {"out", "workspace", "dweight", "dbias", "mean", "rstd", "sync"},
}


@pytest.fixture(autouse=True)
def _defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ops.LAUNCH_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)


@contextlib.contextmanager
def cpu_kernels(node: object, route: str, autograd: bool = False) -> Iterator[None]:
    """The ops' kernels for CPU for the block: "python" (ops.group_norm_fwd / _bwd) or "cpp" (with
    `autograd`, the C++ Autograd kernels too); afterwards the C++ kernels keep no launch."""
    op_kernels.set_callbacks(node)
    if route == "python":
        lib = torch.library.Library("gn_module", "IMPL")
        lib.impl("group_norm_fwd", ops.group_norm_fwd, "CPU")
        lib.impl("group_norm_bwd", ops.group_norm_bwd, "CPU")
        try:
            yield
        finally:
            lib._destroy()
        return
    registration = node.register_op_kernels("CPU", autograd=autograd)  # type: ignore[attr-defined]
    saved, ops._op_kernels = ops._op_kernels, node
    ops._settings_changed()
    try:
        yield
    finally:
        del registration  # (takes the C++ kernels off: the Python ones are back)
        ops._op_kernels = saved
        node.op_settings_changed(False)  # type: ignore[attr-defined]


def run(node: object, route: str, call: Callable[[], object], stub_of=_WritingStub, autograd: bool = False):
    """`call` with `route`'s kernels against a fresh stub: (the launches' fields, what it returned)."""
    stub = stub_of()
    with host_overhead.cpu_device(CEntries(stub)), cpu_kernels(node, route, autograd):
        out = call()
    return [(d, fields(raw)) for d, raw, _ in stub.calls], out


def assert_same_launches(python: tuple, cpp: tuple) -> None:
    """Equal fields, but for the pointers of tensors each route allocates (both set or both null) and
    of the x and dy given, which a route either sends (then so must the other) or replaces by a copy.
    `python`, `cpp`: `run`'s results of calls that return (tensors, {name: the pointer given})."""
    (launches_py, (_, given_py)), (launches_cpp, (_, given_cpp)) = python, cpp
    assert [d for d, _ in launches_py] == [d for d, _ in launches_cpp] and launches_py
    for (direction, p), (_, q) in zip(launches_py, launches_cpp, strict=True):
        for name in p:
            if name in ALLOCATED[direction]:
                assert bool(p[name]) == bool(q[name]), (direction, name)
            elif name in given_py:  # (x too: copied to float32 where there is no wide launch)
                assert (p[name] == given_py[name]) == (q[name] == given_cpp[name]), (direction, name)
            else:
                assert p[name] == q[name], (direction, name, p[name], q[name])


def assert_same_tensors(a: tuple, b: tuple) -> None:
    for s, t in zip(a, b, strict=True):
        assert (s.dtype, s.shape, s.stride()) == (t.dtype, t.shape, t.stride())
        assert torch.equal(s, t)  # (the values the stub wrote; the stub writes no y or dx: zeros of empty)


def written(t: tuple) -> tuple:
    """y and dx are whatever the allocator held (the stub writes neither): their metadata only."""
    return tuple(torch.zeros_like(x) if i == 0 else x for i, x in enumerate(t))


def both_directions(x, w, b, *, act=1, passes=0, wide=False, dy=None):
    """The forward op, then the backward op on its statistics (no autograd: what a compiled graph does)."""

    def call():
        with torch.no_grad():
            y, mean, rstd = FWD(x, w, b, 32, 1e-5, act, passes, wide)
            g = torch.ones_like(y) if dy is None else dy(y)
            dx, dw, db = BWD(g, x, w, b, mean, rstd, 32, 1e-5, act, passes, wide)
        return written((y, mean, rstd)) + written((dx, dw, db)), {"dy": g.data_ptr(), "x": x.data_ptr()}

    return call


@pytest.mark.parametrize("arch", ["tasks+bwd", "tiles"])
@pytest.mark.parametrize("case", list(PARAMS))
def test_same_launches_and_outputs_as_the_python_kernels(node, monkeypatch, case, arch):
    """Every parameter case of the C++ node's tests, under the task and the tile kernels."""
    monkeypatch.setenv(ops.ENV_ARCH, arch)
    x_dtype, make_params = PARAMS[case]
    call = both_directions(cl(dtype=x_dtype), *make_params())
    python, cpp = run(node, "python", call), run(node, "cpp", call)
    assert_same_launches(python, cpp)
    out_py, out_cpp = python[1][0], cpp[1][0]
    assert_same_tensors(out_py, out_cpp)


@pytest.mark.parametrize("passes", [0, 1, 2])
@pytest.mark.parametrize("act", [0, 1, 2, 3, 4])
def test_activations_and_schedules(node, act, passes):
    x, (w, b) = cl(), params()
    call = both_directions(x, w, b, act=act, passes=passes)
    python, cpp = run(node, "python", call), run(node, "cpp", call)
    assert_same_launches(python, cpp)
    out_py, out_cpp = python[1][0], cpp[1][0]
    assert_same_tensors(out_py, out_cpp)


DY = {
    **NODE_DY,
    "bf16 dy for a wide call (made float32)": lambda y: torch.ones_like(y, dtype=torch.bfloat16),
}


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("dy", list(DY))
def test_dy_in_another_layout_alignment_or_dtype(node, dy, wide):
    x, (w, b) = cl(dtype=torch.bfloat16), params(dtype=torch.float32)
    call = both_directions(x, w, b, wide=wide, dy=DY[dy])
    python, cpp = run(node, "python", call), run(node, "cpp", call)
    assert_same_launches(python, cpp)
    out_py, out_cpp = python[1][0], cpp[1][0]
    assert_same_tensors(out_py, out_cpp)


@pytest.mark.parametrize("arch", ["tasks+bwd", "tiles"])
def test_wide_calls_and_the_float32_copy_where_there_is_no_wide_launch(node, monkeypatch, arch):
    """autocast's float32 y from a bf16 x: the wide launch (task kernels), or under the tile kernels,
    which have none, the Python body's launch on a float32 copy of x."""
    monkeypatch.setenv(ops.ENV_ARCH, arch)
    x, (w, b) = cl(dtype=torch.bfloat16), params(dtype=torch.float32)
    call = both_directions(x, w, b, wide=True)
    python, cpp = run(node, "python", call), run(node, "cpp", call)
    assert_same_launches(python, cpp)
    out_py, out_cpp = python[1][0], cpp[1][0]
    assert_same_tensors(out_py, out_cpp)
    assert out_cpp[0].dtype == torch.float32 and out_cpp[3].dtype == torch.bfloat16
    assert (cpp[0][0][1]["x"] == x.data_ptr()) == (arch != "tiles")  # (tiles: a float32 copy of x)


def calls_with_settings_between(x, w, b, monkeypatch):
    """Forward calls of one signature with the settings changed between them: a cap block, the cap's
    environment variable, the arch variable, a launch switch; each must take effect on the next call."""

    dy = torch.ones_like(x)  # (one dy for both routes: its pointer is compared)

    def call():
        steps = [
            contextlib.nullcontext,
            lambda: ops.max_resident_blocks(5),
            contextlib.nullcontext,
            lambda: ops.dependent_launches(False),
            lambda: ops.team_stagger(0),
        ]
        out = []
        with torch.no_grad():
            for step in steps:
                with step():
                    out.append(FWD(x, w, b, 32, 1e-5, 1, 0, False)[1])
            for name, value in ((ops.ENV_CAP, "3"), (ops.ENV_ARCH, "tiles"), ("GN_STRIP_BLOCKS", "0")):
                monkeypatch.setenv(name, value)
                _, mean, rstd = FWD(x, w, b, 32, 1e-5, 1, 2, False)
                out += [mean, BWD(dy, x, w, b, mean, rstd, 32, 1e-5, 1, 2, False)[1]]
            for name in (ops.ENV_CAP, ops.ENV_ARCH, "GN_STRIP_BLOCKS"):
                monkeypatch.delenv(name)
            out.append(FWD(x, w, b, 32, 1e-5, 1, 0, False)[1])
        return tuple(out), {}

    return call


def test_settings_take_effect_on_the_next_call(node, monkeypatch):
    x, (w, b) = cl((4, 256, 32, 32)), params(256)
    call = calls_with_settings_between(x, w, b, monkeypatch)
    python, cpp = run(node, "python", call), run(node, "cpp", call)
    assert_same_launches(python, cpp)
    out_py, out_cpp = python[1][0], cpp[1][0]
    changed = {tuple((k, str(v)) for k, v in f.items() if k not in ALLOCATED[d]) for d, f in cpp[0]}
    assert len(changed) >= 6  # (the settings did change the launches)
    assert_same_tensors(out_py, out_cpp)


def test_each_signature_asks_python_once(node, monkeypatch):
    asked = []
    real = ops._op_launch
    monkeypatch.setattr(ops, "_op_launch", lambda *a: asked.append(a[0]) or real(*a))
    x, (w, b) = cl(), params()

    def call():
        with torch.no_grad():
            for _ in range(3):
                FWD(x, w, b, 32, 1e-5, 1, 0, False)
            FWD(x, w, b, 32, 1e-5, 2, 0, False)  # another act: another signature
            ops._launches.clear()  # (the Python cache emptied: the C++ one too)
            FWD(x, w, b, 32, 1e-5, 1, 0, False)
        return node.op_cache_size()

    _, size = run(node, "cpp", call)
    assert asked == ["fwd", "fwd", "fwd"] and size == 1


def test_launch_records_and_poisoning_take_the_python_body(node):
    x, (w, b) = cl(), params()

    def call():
        with torch.no_grad():
            with ops.launch_record() as rec:
                y = FWD(x, w, b, 32, 1e-5, 1, 0, False)[0]
            with ops.poison_outputs():
                poisoned = FWD(x, w, b, 32, 1e-5, 1, 0, False)[0]
            plain = FWD(x, w, b, 32, 1e-5, 1, 0, False)[0]
        return rec, y, poisoned, plain

    _, (rec, y, poisoned, plain) = run(node, "cpp", call)
    assert set(rec) == {"fwd"}  # (the Python body's launch record)
    assert poisoned.isnan().all()  # (poisoned before the stub's launch, which writes no y)
    assert plain.shape == y.shape


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_launch_errors_are_the_python_kernels(node, direction):
    x, (w, b) = cl(), params()
    messages = []
    for route in ("python", "cpp"):
        with pytest.raises(RuntimeError) as info:
            run(node, route, both_directions(x, w, b), stub_of=lambda: _FailingStub(direction))
        messages.append(str(info.value).splitlines()[0])
    assert (
        messages[0] == messages[1] == f"gn_module: GroupNorm {direction} launch failed: CUDA error 7 (stub)"
    )


def test_autograd_kernels(node):
    """With the C++ Autograd kernels: a call that needs a gradient takes the Python route (a graph and
    the backward op), one that does not goes straight below autograd, and the backward op refuses a
    gradient of its own."""
    x, (w, b) = cl(), params()

    def call():
        xg = x.clone().requires_grad_()
        y, mean, rstd = FWD(xg, w, b, 32, 1e-5, 1, 0, False)
        (dx,) = torch.autograd.grad(y, (xg,), torch.ones_like(y))
        with torch.no_grad():
            y_plain = FWD(xg, w, b, 32, 1e-5, 1, 0, False)[0]
        dy = torch.ones_like(y).requires_grad_()
        with pytest.raises(RuntimeError, match="double backward"):
            BWD(dy, x, w, b, mean, rstd, 32, 1e-5, 1, 0, False)
        return y.grad_fn is not None, dx.shape, y_plain.grad_fn

    launches, (graph, shape, plain_fn) = run(node, "cpp", call, autograd=True)
    assert graph and shape == x.shape and plain_fn is None
    assert [d for d, _ in launches] == ["fwd", "bwd", "fwd"]


class _Node:
    """A stand-in for the extension in `enable`'s tests."""

    def __init__(self) -> None:
        self.registered: list[tuple] = []

    def set_op_callbacks(self, *args: object) -> None:
        self.callbacks = args

    def register_op_kernels(self, backend: str, autograd: bool) -> object:
        self.registered.append((backend, autograd))
        return object()

    def op_settings_changed(self, python_only: bool) -> None:
        self.python_only = python_only


@pytest.mark.parametrize("setting", [None, "1", "0"])
def test_enable_registers_once_unless_switched_off(monkeypatch, setting):
    fake = _Node()
    monkeypatch.setattr(autograd_node, "load", lambda: fake)
    monkeypatch.setattr(op_kernels, "_registration", None)
    monkeypatch.setattr(op_kernels, "_failed", False)
    monkeypatch.setattr(op_kernels, "_callbacks_set", False)
    monkeypatch.setattr(ops, "_op_kernels", None)
    if setting is None:
        monkeypatch.delenv(autograd_node.ENV, raising=False)
    else:
        monkeypatch.setenv(autograd_node.ENV, setting)
    on = setting != "0"
    assert op_kernels.enable() is on and op_kernels.enable() is on
    assert fake.registered == ([("CUDA", True)] if on else [])
    assert (ops._op_kernels is fake) is on
    if on:
        assert list(fake.callbacks[-1]) == list(ops.LAUNCH_ENVIRONMENT) and fake.python_only is False


def test_enable_keeps_the_python_kernels_where_the_extension_does_not_build(monkeypatch):
    monkeypatch.setattr(autograd_node, "load", lambda: None)
    monkeypatch.setattr(op_kernels, "_registration", None)
    monkeypatch.setattr(op_kernels, "_failed", False)
    monkeypatch.delenv(autograd_node.ENV, raising=False)
    assert op_kernels.enable() is False and not op_kernels.enabled()


def test_tracing_on_cpu_does_not_build_the_extension(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(op_kernels, "enable", lambda: pytest.fail("enable() on a CPU trace"))
    with FakeTensorMode():
        x, (w, b) = cl(), params()
        FWD(x, w, b, 32, 1e-5, 1, 0, False)
