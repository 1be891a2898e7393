"""The Python API on the CPU: argument errors in torch's wording, the native fallback, the module."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gn_module
from gn_module.functional import fast_path_reason


def test_fallback_matches_torch_with_and_without_silu():
    x = torch.randn(2, 12, 5, 7)
    w, b = torch.randn(12), torch.randn(12)
    torch.testing.assert_close(gn_module.group_norm(x, 3, w, b), F.group_norm(x, 3, w, b))
    torch.testing.assert_close(gn_module.group_norm(x, 3, w, b, act="silu"), F.silu(F.group_norm(x, 3, w, b)))


def test_fallback_with_fp32_params_and_half_input():
    x = torch.randn(2, 8, 4, 4).to(torch.bfloat16)
    w, b = torch.randn(8), torch.randn(8)
    y = gn_module.group_norm(x, 4, w, b)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), F.group_norm(x.float(), 4, w, b), atol=2e-2, rtol=2e-2)


def test_fallback_gradients():
    x = torch.randn(2, 8, 3, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: gn_module.group_norm(*a[:1], 2, *a[1:], act="silu"), (x, w, b))


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda x: gn_module.group_norm(x, 5), ValueError, "divisible by num_groups"),
        (lambda x: gn_module.group_norm(x, 0), ValueError, "num_groups"),
        (lambda x: gn_module.group_norm(x, 2, torch.ones(3)), ValueError, "weight"),
        (lambda x: gn_module.group_norm(x, 2, None, torch.ones(8, 1)), ValueError, "bias"),
        (lambda x: gn_module.group_norm(x.long(), 2), TypeError, "floating-point"),
        (lambda x: gn_module.group_norm(x[0, 0, 0], 2), ValueError, "at least 2 dimensions"),
        (lambda x: gn_module.group_norm(x, 2, act="tanh"), ValueError, "unsupported act"),
        (lambda x: gn_module.group_norm(x, 2, eps=torch.ones(2)), TypeError, "eps"),
        (lambda x: gn_module.group_norm(x, 2, passes=3), ValueError, "passes"),
        (lambda x: gn_module.group_norm(x, 2, torch.ones(8, dtype=torch.int32)), TypeError, "floating point"),
        (lambda x: gn_module.group_norm(x, 2, torch.ones(8), torch.ones(8).double()), TypeError, "share"),
        (lambda x: gn_module.group_norm(x, 2, torch.ones(8, device="meta")), RuntimeError, "same device"),
    ],
)
def test_bad_input_is_a_clear_exception(call, exc, match):
    with pytest.raises(exc, match=match):
        call(torch.randn(2, 8, 4, 4))


def test_empty_input_behaves_like_torch():
    x = torch.randn(0, 8, 4, 4)
    assert gn_module.group_norm(x, 2).shape == x.shape


def test_fast_path_reasons():
    assert "cpu" in fast_path_reason(torch.randn(2, 8, 4, 4), None)


def test_module_is_a_drop_in():
    ours = gn_module.GroupNorm(4, 16, eps=1e-6, act="silu")
    theirs = torch.nn.GroupNorm(4, 16, eps=1e-6)
    assert isinstance(ours, torch.nn.GroupNorm)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    theirs.load_state_dict(ours.state_dict(), strict=True)
    assert "act='silu'" in repr(ours) and "eps=1e-06" in repr(ours)
    x = torch.randn(2, 16, 3, 3)
    torch.testing.assert_close(ours(x), F.silu(theirs(x)))
    assert torch.equal(ours.weight, torch.ones(16)) and torch.equal(ours.bias, torch.zeros(16))
    with pytest.raises(ValueError, match="unsupported act"):
        gn_module.GroupNorm(4, 16, act="tanh")


def test_importing_the_package_does_not_import_torch_modules_eagerly():
    import subprocess
    import sys

    code = "import sys, gn_module, gn_module.schedule; print('gn_module.ops' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_module_without_bias_like_torchs():
    import inspect

    if "bias" not in inspect.signature(torch.nn.GroupNorm.__init__).parameters:
        pytest.skip("this torch's nn.GroupNorm has no bias= argument")
    ours = gn_module.GroupNorm(4, 16, bias=False)
    theirs = torch.nn.GroupNorm(4, 16, bias=False)
    assert ours.bias is None and ours.state_dict().keys() == theirs.state_dict().keys()
    x = torch.randn(2, 16, 3, 3)
    torch.testing.assert_close(ours(x), theirs(x))


# ---------------------------------------------------------------- autocast (issue 14)
def test_under_cuda_autocast_the_output_is_float32_like_torchs(monkeypatch):
    """CUDA autocast runs torch's group_norm in float32: so do we by default. (On the CPU the check
    is pointed at these CPU tensors; torch's CPU autocast itself keeps bfloat16, and so do we there.)"""
    from gn_module import functional

    x = torch.randn(2, 8, 4, 4).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(8), torch.randn(8)
    assert gn_module.group_norm(x, 4, w, b).dtype == torch.bfloat16  # no autocast: the input's dtype
    monkeypatch.setattr(functional, "_under_cuda_autocast", lambda t: True)
    y = gn_module.group_norm(x, 4, w, b.bfloat16(), act="silu")  # autocast casts the bias too
    assert y.dtype == torch.float32 and y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, F.silu(F.group_norm(x.float(), 4, w, b.bfloat16().float())))
    kept = gn_module.group_norm(x, 4, w, b, act="silu", autocast_output="input")
    assert kept.dtype == torch.bfloat16
    x64 = torch.randn(2, 8, 3, dtype=torch.float64)  # float64 is not cast, as autocast leaves it
    assert gn_module.group_norm(x64, 4).dtype == torch.float64
    module = gn_module.GroupNorm(4, 8)
    assert module(x).dtype == torch.float32
    module.autocast_output = "input"
    assert module(x).dtype == torch.bfloat16


@pytest.mark.parametrize("param_dtype", [torch.float32, torch.bfloat16])
def test_under_compile_autocast_calls_the_wide_custom_op_on_x_as_it_is(monkeypatch, param_dtype):
    """torch.compile + CUDA autocast: a bfloat16 x goes to the custom op's wide form uncast (float32 y;
    no float32 copy of x in the graph). bfloat16 parameters are cast to float32 as autocast would; a
    float64 one is not ours (the caller casts x and takes torch's path, as before)."""
    from gn_module import functional, ops

    calls = []

    def fake_cuda(x, groups, w, b, eps, act, passes, wide=False):
        calls.append((x.dtype, w.dtype, b.dtype, groups, eps, act, passes, wide))
        return torch.empty_like(x, dtype=torch.float32)

    monkeypatch.setattr(functional, "_under_cuda_autocast", lambda t: True)
    monkeypatch.setattr(functional, "fast_path_reason", lambda x, w: None)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(ops, "group_norm_cuda", fake_cuda)
    x = torch.randn(2, 8, 4, 4).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(8, dtype=param_dtype), torch.randn(8, dtype=param_dtype)
    y = gn_module.group_norm(x, 4, w, b, act="silu", passes=2)
    assert calls == [(torch.bfloat16, torch.float32, torch.float32, 4, 1e-5, "silu", 2, True)]
    assert y.dtype == torch.float32
    w64 = torch.randn(8, dtype=torch.float64)
    assert functional._compiled_wide(x, 4, w64, None, 1e-5, None, "auto") is None
    assert len(calls) == 1


def test_the_custom_ops_wide_form_has_float32_y_and_x_dtype_dx():
    """The fake (meta) kernels torch.compile traces with: y float32 in x's memory format for wide=True,
    dx in x's dtype; the schema keeps wide optional (graphs traced before it still bind)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from gn_module import ops  # noqa: F401  (registers the ops)

    with FakeTensorMode():
        x = torch.empty(2, 64, 8, 8, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        w, b = torch.empty(64), torch.empty(64)
        y, mean, rstd = torch.ops.gn_module.group_norm_fwd(x, w, b, 32, 1e-5, 0, 0, True)
        assert y.dtype == torch.float32 and y.stride() == x.stride() and mean.shape == (2, 32)
        assert torch.ops.gn_module.group_norm_fwd(x, w, b, 32, 1e-5, 0, 0)[0].dtype == torch.bfloat16
        dx, dw, _ = torch.ops.gn_module.group_norm_bwd(y, x, w, b, mean, rstd, 32, 1e-5, 0, 0, True)
        assert dx.dtype == torch.bfloat16 and dx.stride() == x.stride() and dw.dtype == torch.float32
    assert "bool wide=False" in str(torch.ops.gn_module.group_norm_fwd.default._schema)


def test_autocast_output_is_checked_and_shown():
    x = torch.randn(2, 8, 3)
    with pytest.raises(
        ValueError, match=r"autocast_output must be one of \('float32', 'input'\), got 'bf16'"
    ):
        gn_module.group_norm(x, 4, autocast_output="bf16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="GroupNorm: autocast_output must be one of"):
        gn_module.GroupNorm(4, 8, autocast_output=None)  # type: ignore[arg-type]
    default, kept = gn_module.GroupNorm(4, 8), gn_module.GroupNorm(4, 8, act="silu", autocast_output="input")
    assert default.autocast_output == "float32" and "autocast_output" not in vars(default)
    assert "autocast_output" not in repr(default) and "act=" not in repr(default)
    assert repr(kept).endswith("act='silu', autocast_output='input')")
    assert set(kept.state_dict()) == {"weight", "bias"}


# ------------------------------------------------------------------ every activation (issue 14)
TORCH_ACTS = {
    None: lambda y: y,
    "identity": lambda y: y,
    "silu": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
}


def test_every_act_has_a_torch_definition():
    assert set(TORCH_ACTS) == set(gn_module.functional.ACTS)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("act", list(TORCH_ACTS), ids=str)
def test_native_path_of_every_act_is_torchs(act, dtype):
    x = torch.randn(3, 12, 5, 7, dtype=dtype)
    w, b = torch.randn(12, dtype=dtype), torch.randn(12, dtype=dtype)
    want = TORCH_ACTS[act](F.group_norm(x, 3, w, b, 1e-5))
    torch.testing.assert_close(gn_module.group_norm(x, 3, w, b, act=act), want, rtol=0, atol=0)
    layer = gn_module.GroupNorm(3, 12, act=act, dtype=dtype)
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(b)
    torch.testing.assert_close(layer(x), want, rtol=0, atol=0)
    # The CPU runs torch's path for channels_last too: torch's channels_last kernel (another summation
    # order than the contiguous one: equal to `want` only to rounding), so compare with that bitwise.
    cl = x.contiguous(memory_format=torch.channels_last)
    want_cl = TORCH_ACTS[act](F.group_norm(cl, 3, w, b, 1e-5))
    torch.testing.assert_close(gn_module.group_norm(cl, 3, w, b, act=act), want_cl, rtol=0, atol=0)
    torch.testing.assert_close(want_cl, want)  # (torch's default tolerances of the dtype)


@pytest.mark.parametrize("act", list(TORCH_ACTS), ids=str)
def test_native_path_gradients_of_every_act(act):
    x = torch.randn(2, 8, 3, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: gn_module.group_norm(a[0], 2, *a[1:], act=act), (x, w, b))
    # fp32: the same gradients as torch's GroupNorm followed by torch's activation, bit for bit
    xf, wf, bf = (t.detach().float().requires_grad_() for t in (x, w, b))
    dy = torch.randn(2, 8, 3, 3)
    ours = torch.autograd.grad(gn_module.group_norm(xf, 2, wf, bf, act=act), (xf, wf, bf), dy)
    theirs = torch.autograd.grad(TORCH_ACTS[act](F.group_norm(xf, 2, wf, bf)), (xf, wf, bf), dy)
    for a, e in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=0)


def test_module_takes_every_act_and_shows_it():
    for act in gn_module.functional.ACTS:
        text = repr(gn_module.GroupNorm(8, 32, act=act))
        assert text.startswith("GroupNorm(8, 32, eps=1e-05, affine=True")
        assert (f"act={act!r}" in text) == (act is not None)
    with pytest.raises(ValueError, match=r"unsupported act 'GELU'; expected one of \(None, 'identity'"):
        gn_module.GroupNorm(8, 32, act="GELU")
    with pytest.raises(ValueError, match="unsupported act 'tanh'"):
        gn_module.functional.apply_act(torch.zeros(1), "tanh")
