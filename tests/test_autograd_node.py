"""The C++ autograd node (GN_CPP_NODE=1, gn_module/autograd_node.cpp) against the Python autograd.Function
it stands in for, on CPU: CPU tensors take the CUDA fast route (`host_overhead.cpu_device`) against stub
entry points made C-callable, which record each launch's GnArgs bytes and write what the kernels would
(the statistics forward, dweight and dbias backward; test_host_path's stubs).

For each call both routes must launch the same: equal GnArgs fields but for the pointers each allocates,
which must be set where the Python route's are; the same pointers from the caller (x, dy, weight, bias);
the same statistics read back. They must return the same gradients (which, dtypes, shapes, strides,
dweight and dbias values), raise the same launch errors, and leave records, poisoning and forward-mode AD
to the Python route. Skips where the extension cannot be built (no C++ compiler or ninja).
"""

from __future__ import annotations

import contextlib
import ctypes

import pytest
import torch
from test_host_path import _FailingStub, _leaf, _WritingStub, cl, fields, host_overhead, params

import gn_module
from gn_module import _abi, autograd_node, ops

#: The stubs' error string is a Python callback returning a char pointer, which ctypes warns about.
pytestmark = pytest.mark.filterwarnings("ignore:memory leak in callback function:RuntimeWarning")

ENTRY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
ERROR_STRING = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_int)
#: The GnArgs pointers each route allocates itself (dy too: each route's step makes its own); the rest
#: come from the caller or are null.
ALLOCATED = {
    "fwd": {"out", "mean", "rstd", "workspace"},
    "bwd": {"dy", "out", "workspace", "dweight", "dbias"},
}


class CEntries:
    """A Python stub library (test_host_path's) behind C-callable entry points, as the node needs."""

    def __init__(self, stub: host_overhead.PyStubLibrary) -> None:
        size = ctypes.sizeof(_abi.GnArgs)
        self.stub = stub
        self.gn_forward = ENTRY(lambda args, stream: stub.gn_forward(ctypes.string_at(args, size), stream))
        self.gn_backward = ENTRY(lambda args, stream: stub.gn_backward(ctypes.string_at(args, size), stream))
        self.gn_error_string = ERROR_STRING(stub.gn_error_string)

    def __getattr__(self, name: str) -> object:
        return getattr(self.stub, name)


@pytest.fixture(autouse=True)
def _defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ops.ENV_CAP, raising=False)
    monkeypatch.delenv(ops.ENV_ARCH, raising=False)
    monkeypatch.delenv(autograd_node.ENV, raising=False)


def step(monkeypatch, stub, use_node, x, w, b, act=None, dy_of=None, requires="xwb", passes="auto"):
    """One training step through the chosen route; returns (the grad_fn's name, the launches' GnArgs
    fields, the leaves' gradients)."""
    monkeypatch.setenv(autograd_node.ENV, "1" if use_node else "0")
    leaves = [_leaf(t, name in requires) for t, name in ((x, "x"), (w, "w"), (b, "b"))]
    start = len(stub.calls)
    y = gn_module.group_norm(leaves[0], 32, leaves[1], leaves[2], act=act, passes=passes)
    dy = torch.ones_like(y) if dy_of is None else dy_of(y)
    y.backward(dy)
    launches = [(d, fields(raw)) for d, raw, _ in stub.calls[start:]]
    return y.grad_fn.name(), launches, [None if t is None else t.grad for t in leaves]


def assert_same_launches(python, node):
    assert [d for d, _ in python] == [d for d, _ in node] == ["fwd", "bwd"]
    for (direction, p), (_, q) in zip(python, node, strict=True):
        for name in p:
            if name in ALLOCATED[direction]:
                assert bool(p[name]) == bool(q[name]), (direction, name)
            else:  # the caller's pointers (x, dy, weight, bias; the statistics backward), every other field
                same = p[name] == q[name] or (direction == "bwd" and name in ("mean", "rstd"))
                assert same, (direction, name, p[name], q[name])
        assert q["rstd"] - q["mean"] == p["rstd"] - p["mean"], direction


def assert_same_grads(python, node):
    for g, h in zip(python, node, strict=True):
        assert (g is None) == (h is None)
        if g is not None:
            assert (g.dtype, g.shape, g.stride()) == (h.dtype, h.shape, h.stride())


def routes(monkeypatch, stub_of, *args, **kwargs):
    """The step through the Python route, then through the node, each on its own stub."""
    out = []
    for use_node in (False, True):
        stub = stub_of()
        with host_overhead.cpu_device(CEntries(stub)):
            out.append(step(monkeypatch, stub, use_node, *args, **kwargs))
    (name_py, launches_py, grads_py), (name_node, launches_node, grads_node) = out
    assert "GroupNormNode" not in name_py and "GroupNormNode" in name_node, (name_py, name_node)
    assert_same_launches(launches_py, launches_node)
    assert_same_grads(grads_py, grads_node)
    return grads_py, grads_node


PARAMS = {
    "fp16 x, fp16 weight and bias": (torch.float16, lambda: params()),
    "fp16 x, fp32 weight and bias": (torch.float16, lambda: params(dtype=torch.float32)),
    "bf16 x, bf16 weight, no bias": (torch.bfloat16, lambda: (params(dtype=torch.bfloat16)[0], None)),
    "fp32 x, no weight, fp32 bias": (torch.float32, lambda: (None, params(dtype=torch.float32)[1])),
    "fp32 x, no parameters": (torch.float32, lambda: (None, None)),
}


@pytest.mark.parametrize("arch", ["tasks+bwd", "tiles"])
@pytest.mark.parametrize("case", list(PARAMS))
def test_same_launches_and_gradients_as_the_function(node, monkeypatch, case, arch):
    monkeypatch.setenv(ops.ENV_ARCH, arch)
    dtype, make = PARAMS[case]
    x = cl(dtype=dtype)
    w, b = make()
    grads_py, grads_node = routes(monkeypatch, _WritingStub, x, w, b, act="silu")
    for g, h in zip(grads_py[1:], grads_node[1:], strict=True):  # dweight, dbias: what the stub wrote
        assert g is None or torch.equal(g, h)


@pytest.mark.parametrize("requires", ["x", "w", "b", "xw", "wb", "xwb"])
def test_the_gradients_asked_for(node, monkeypatch, requires):
    x = cl()
    w, b = params(dtype=torch.float32)
    routes(monkeypatch, _WritingStub, x, w, b, requires=requires)


@pytest.mark.parametrize("passes", [1, 2])
@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "identity"])
def test_activations_and_schedules(node, monkeypatch, act, passes):
    routes(monkeypatch, _WritingStub, cl(), *params(), act=act, passes=passes)


DY = {
    "NCHW dy (copied into x's layout)": lambda y: torch.ones(y.shape, dtype=y.dtype),
    "misaligned dy (the scalar launch)": lambda y: (
        torch.ones(y.numel() + 1, dtype=y.dtype)[1:]
        .view(y.shape[0], *y.shape[2:], y.shape[1])
        .permute(0, 3, 1, 2)
    ),
}


@pytest.mark.parametrize("dy", list(DY))
def test_dy_in_another_layout_or_alignment(node, monkeypatch, dy):
    routes(monkeypatch, _WritingStub, cl(), *params(), dy_of=DY[dy])


def test_wide_autocast_launches(node, monkeypatch):
    """ops.group_norm_wide (what CUDA autocast takes): float32 y and dy for a bfloat16 x."""
    x, (w, b) = cl(dtype=torch.bfloat16), params(dtype=torch.float32)
    out = []
    for use_node in (False, True):
        monkeypatch.setenv(autograd_node.ENV, "1" if use_node else "0")
        stub = _WritingStub()
        with host_overhead.cpu_device(CEntries(stub)):
            leaves = [_leaf(t) for t in (x, w, b)]
            y = ops.group_norm_wide(leaves[0], 32, leaves[1], leaves[2], 1e-5, 1, 0)
            assert y is not None and y.dtype == torch.float32
            y.backward(torch.ones_like(y))
            out.append(
                (y.grad_fn.name(), [(d, fields(r)) for d, r, _ in stub.calls], [t.grad for t in leaves])
            )
    assert "GroupNormNode" in out[1][0] and "GroupNormNode" not in out[0][0]
    assert_same_launches(out[0][1], out[1][1])
    assert_same_grads(out[0][2], out[1][2])


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_launch_errors_are_the_functions(node, monkeypatch, direction):
    messages = []
    for use_node in (False, True):
        monkeypatch.setenv(autograd_node.ENV, "1" if use_node else "0")
        with host_overhead.cpu_device(CEntries(_FailingStub(direction))), pytest.raises(RuntimeError) as info:
            y = gn_module.group_norm(_leaf(cl()), 32)
            y.backward(torch.ones_like(y))
        messages.append(str(info.value).splitlines()[0])
    assert (
        messages[0] == messages[1] == f"gn_module: GroupNorm {direction} launch failed: CUDA error 7 (stub)"
    )


@pytest.mark.parametrize("context", ["launch_record", "poison_outputs"])
def test_records_and_poisoning_keep_the_python_route(node, monkeypatch, context):
    monkeypatch.setenv(autograd_node.ENV, "1")
    loads = []
    monkeypatch.setattr(autograd_node, "load", lambda: loads.append(1) or node)
    stub = _WritingStub()
    with host_overhead.cpu_device(CEntries(stub)), getattr(ops, context)():
        y = gn_module.group_norm(_leaf(cl()), 32, *(_leaf(t) for t in params()))
    assert "GroupNormNode" not in y.grad_fn.name()
    assert not loads, "records and poisoning must not build the node (the plugin's checks run under them)"


def test_saved_tensor_hooks_see_what_the_function_saves(node, monkeypatch):
    seen = []
    for use_node in (False, True):
        monkeypatch.setenv(autograd_node.ENV, "1" if use_node else "0")
        packed: list[torch.Tensor] = []

        def pack(t: torch.Tensor, packed: list[torch.Tensor] = packed) -> torch.Tensor:
            packed.append(t)
            return t

        with host_overhead.cpu_device(CEntries(_WritingStub())):
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                y = gn_module.group_norm(_leaf(cl()), 32, *(_leaf(t) for t in params()))
            y.backward(torch.ones_like(y))
        seen.append([(t.dtype, t.shape) for t in packed])
    assert seen[0] == seen[1] and len(seen[0]) == 4


def test_not_requested_or_python_entry_points_keep_the_function(node, monkeypatch):
    with host_overhead.cpu_device(host_overhead.PyStubLibrary()):  # Python entry points: no C address
        monkeypatch.setenv(autograd_node.ENV, "1")
        y = gn_module.group_norm(_leaf(cl()), 32)
        assert "GroupNormNode" not in y.grad_fn.name()
    with host_overhead.cpu_device(CEntries(_WritingStub())), contextlib.ExitStack():
        monkeypatch.setenv(autograd_node.ENV, "0")
        y = gn_module.group_norm(_leaf(cl()), 32)
        assert "GroupNormNode" not in y.grad_fn.name()


@pytest.mark.parametrize(("setting", "takes_node"), [(None, True), ("1", True), ("0", False)])
def test_the_node_is_the_default(node, monkeypatch, setting, takes_node):
    if setting is None:
        monkeypatch.delenv(autograd_node.ENV, raising=False)
    else:
        monkeypatch.setenv(autograd_node.ENV, setting)
    with host_overhead.cpu_device(CEntries(_WritingStub())):
        y = gn_module.group_norm(_leaf(cl()), 32, *(_leaf(t) for t in params()))
    assert ("GroupNormNode" in y.grad_fn.name()) == takes_node, y.grad_fn.name()
