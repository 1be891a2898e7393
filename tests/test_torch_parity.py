"""Parity with torch's GroupNorm on the CPU: the same bad and odd inputs through
`torch.nn.functional.group_norm` / `torch.nn.GroupNorm` and through `gn_module.group_norm` /
`gn_module.GroupNorm`.

Where torch raises, ours must raise an instance of torch's exception class (and, where gn_module
raised something else before, of that old class too); where torch computes, ours must compute the
same. On the CPU `gn_module.group_norm` validates first and then runs torch's native path, so these
tests cover the validation that the CUDA fast path shares. Each row also records what torch 2.13
raises, so a torch that changes its behaviour shows up here rather than silently.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gn_module
from gn_module.functional import GroupNormDtypeError, GroupNormError, GroupNormTypeError

C = 8


def _x(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(*shape, generator=g) * 2 + 0.5).to(dtype)


def _p(n: int = C, dtype: torch.dtype = torch.float32, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(dtype)


X = (2, C, 4, 4)


f16, bf16, f64 = torch.float16, torch.bfloat16, torch.float64


def xs(*shape: int) -> Callable[[], torch.Tensor]:
    """An input of ``shape``."""
    return lambda: _x(*shape)


def xd(dtype: torch.dtype) -> Callable[[], torch.Tensor]:
    """The default input in ``dtype``."""
    return lambda: _x(*X).to(dtype)


def pd(dtype: torch.dtype, n: int = C) -> Callable[[], torch.Tensor]:
    """A parameter of ``n`` elements in ``dtype``."""
    return lambda: _p(n, dtype)


@dataclass(frozen=True)
class Case:
    """One row: ``args()`` gives (x, num_groups, weight, bias, eps); ``torch_raises`` is what torch 2.13
    raises (None: it computes); ``also`` is gn_module's old exception type, which ours must still be."""

    id: str
    args: Callable[[], tuple[Any, Any, Any, Any, Any]]
    torch_raises: type[BaseException] | None = None
    also: type[BaseException] | None = None
    finite: bool = False  # torch's result is finite (checked, so the row tests what it claims)


def a(x=None, g=2, w=None, b=None, eps=1e-5):
    """A row's arguments: x, w and b are factories (fresh tensors per call), g and eps values."""
    return lambda: (_x(*X) if x is None else x(), g, w() if w else None, b() if b else None, eps)


FUNCTIONAL_CASES = [
    # -- eps: every eps torch accepts ----------------------------------------------------------
    Case("eps=0.0", a(eps=0.0), finite=True),
    Case("eps=0 (int)", a(eps=0), finite=True),
    Case("eps=-1e-3 (variance > -eps)", a(eps=-1e-3), finite=True),
    Case("eps=-1e-3 affine", a(w=_p, b=lambda: _p(seed=2), eps=-1e-3), finite=True),
    Case("eps=-100 (variance < -eps: NaN)", a(eps=-100.0)),
    Case("eps=inf", a(eps=float("inf")), finite=True),
    Case("eps=nan", a(eps=float("nan"))),
    Case("eps=0, constant input (0/0)", a(x=lambda: torch.ones(X), eps=0.0)),
    Case("eps=True", a(eps=True), finite=True),
    Case("eps 0-d tensor", a(eps=torch.tensor(1e-3)), finite=True),
    Case("eps 0-d tensor 0", a(eps=torch.tensor(0.0)), finite=True),
    Case("eps 0-d float64 tensor negative", a(eps=torch.tensor(-1e-3, dtype=torch.float64)), finite=True),
    Case("eps 0-d int tensor", a(eps=torch.tensor(1)), finite=True),
    Case("eps 0-d complex tensor", a(eps=torch.tensor(1e-3 + 0j)), finite=True),
    Case("eps np.float32", a(eps=np.float32(1e-3)), finite=True),
    Case("eps np.int64", a(eps=np.int64(0)), finite=True),
    Case("eps 1-element 1-d tensor", a(eps=torch.tensor([1e-3])), TypeError),
    Case("eps 0-d tensor requiring grad", a(eps=torch.tensor(1e-3, requires_grad=True)), TypeError),
    Case("eps str", a(eps="1e-5"), TypeError),
    Case("eps None", a(eps=None), TypeError),
    Case("eps Fraction", a(eps=Fraction(1, 1000)), TypeError),
    Case("eps complex", a(eps=1e-3 + 0j), TypeError),
    Case("eps numpy 0-d array", a(eps=np.array(1e-3)), TypeError),
    # -- num_groups ----------------------------------------------------------------------------
    Case("groups np.int64", a(g=np.int64(2)), finite=True),
    Case("groups np.int32", a(g=np.int32(4)), finite=True),
    Case("groups np.uint8", a(g=np.uint8(8)), finite=True),
    Case("groups 0-d int tensor", a(g=torch.tensor(2)), finite=True),
    Case("groups float 2.0", a(g=2.0), TypeError, also=ValueError),
    Case("groups True", a(g=True), TypeError, also=ValueError),
    Case("groups np.bool_", a(g=np.bool_(True)), TypeError, also=ValueError),
    Case("groups np.float64", a(g=np.float64(2)), TypeError, also=ValueError),
    Case("groups 0-d float tensor", a(g=torch.tensor(2.0)), TypeError, also=ValueError),
    Case("groups str", a(g="2"), TypeError, also=ValueError),
    Case("groups 0", a(g=0), ZeroDivisionError, also=ValueError),
    Case("groups -1", a(g=-1), RuntimeError, also=ValueError),
    Case("C % G != 0 (G=3)", a(g=3), RuntimeError, also=ValueError),
    Case("C % G != 0 (G > C)", a(g=16), RuntimeError, also=ValueError),
    # -- shapes --------------------------------------------------------------------------------
    Case("weight of size 3", a(w=lambda: torch.ones(3)), RuntimeError, also=ValueError),
    Case("weight of shape (8, 1)", a(w=lambda: torch.ones(C, 1)), RuntimeError, also=ValueError),
    Case("weight 0-d", a(w=lambda: torch.tensor(1.0)), RuntimeError, also=ValueError),
    Case("bias of size 3", a(b=lambda: torch.ones(3)), RuntimeError, also=ValueError),
    Case("bias of shape (8, 1)", a(b=lambda: torch.ones(C, 1)), RuntimeError, also=ValueError),
    Case("weight not a tensor", a(w=lambda: [1.0] * C), TypeError),
    Case("1-D input", a(x=xs(C)), RuntimeError, also=ValueError),
    Case("0-D input", a(x=lambda: torch.tensor(1.0), g=1), RuntimeError, also=ValueError),
    Case("1-D input, groups 0", a(x=xs(C), g=0), RuntimeError, also=ValueError),
    Case("2-D input", a(x=xs(3, C)), finite=True),
    Case("3-D input", a(x=xs(2, C, 5)), finite=True),
    Case("5-D input", a(x=xs(2, C, 2, 3, 2)), finite=True),
    Case("one value per channel (1, 4, 1, 1), G=4", a(x=xs(1, 4, 1, 1), g=4), ValueError),
    Case("one value per channel (1, 2), G=2", a(x=xs(1, 2), g=2), ValueError),
    Case("one value per channel, before C % G", a(x=xs(1, 4, 1, 1), g=3), ValueError),
    Case("one value per group, batch 2", a(x=xs(2, 4, 1, 1), g=4, b=lambda: _p(4)), finite=True),
    Case(
        "channels_last input", a(x=lambda: _x(*X).contiguous(memory_format=torch.channels_last)), finite=True
    ),
    Case("non-contiguous input", a(x=lambda: _x(*X).transpose(2, 3)), finite=True),
    # -- 0-size dimensions ---------------------------------------------------------------------
    Case("N=0", a(x=xs(0, C, 4, 4), w=_p, b=_p)),
    Case("C=0, G=1", a(x=xs(2, 0, 4, 4), g=1)),
    Case("C=0, G=0", a(x=xs(2, 0, 4, 4), g=0), ZeroDivisionError, also=ValueError),
    Case("H=0", a(x=xs(2, C, 0, 4))),
    Case("H=0 affine", a(x=xs(2, C, 0, 4), w=_p, b=_p)),
    Case("N=0, C % G != 0", a(x=xs(0, C, 4, 4), g=3), RuntimeError, also=ValueError),
    Case("N=0, weight of size 3", a(x=xs(0, C, 4, 4), w=lambda: torch.ones(3)), RuntimeError),
    Case("N=0, int64 input", a(x=lambda: _x(0, C, 4, 4).long()), NotImplementedError, also=TypeError),
    Case("N=0, fp64 weight", a(x=xs(0, C, 4, 4), w=pd(f64)), RuntimeError),
    # -- input dtypes without a kernel ---------------------------------------------------------
    *[
        Case(f"{dtype} input", a(x=xd(dtype)), NotImplementedError, also=TypeError)
        for dtype in (torch.int64, torch.int32, torch.uint8, torch.bool, torch.complex64, torch.complex128)
    ],
    Case("float8_e4m3fn input", a(x=xd(torch.float8_e4m3fn)), NotImplementedError),
    Case("int64 input, int64 weight", a(x=xd(torch.int64), w=pd(torch.int64)), NotImplementedError),
    Case(
        "complex input, complex weight", a(x=xd(torch.complex64), w=pd(torch.complex64)), NotImplementedError
    ),
    # torch's "mixed dtype" check comes before its kernel lookup: a RuntimeError, not NotImplementedError.
    Case("int64 input, fp32 weight", a(x=xd(torch.int64), w=_p), RuntimeError, also=TypeError),
    Case("bool input, fp32 bias", a(x=lambda: _x(*X) > 0, b=_p), RuntimeError, also=TypeError),
    # -- parameter dtypes ----------------------------------------------------------------------
    Case("fp32 x, fp64 weight", a(w=pd(f64)), RuntimeError, also=TypeError),
    Case("fp32 x, fp64 bias", a(b=pd(f64)), RuntimeError, also=TypeError),
    Case("fp32 x, fp64 weight and bias", a(w=pd(f64), b=pd(f64)), RuntimeError),
    Case("fp32 x, fp16 weight", a(w=pd(f16)), RuntimeError, also=TypeError),
    Case("fp32 x, bf16 weight", a(w=pd(bf16)), RuntimeError, also=TypeError),
    Case("fp32 x, int32 weight", a(w=pd(torch.int32)), RuntimeError, also=TypeError),
    Case("fp64 x, fp32 weight", a(x=xd(f64), w=_p), RuntimeError, also=TypeError),
    Case("bf16 x, fp16 weight", a(x=xd(bf16), w=pd(f16)), RuntimeError),
    Case("bf16 x, fp64 weight", a(x=xd(bf16), w=pd(f64)), RuntimeError),
    Case("fp32 weight, fp64 bias", a(w=_p, b=pd(f64)), RuntimeError, also=TypeError),
    Case("fp16 x, fp32 weight, fp16 bias", a(x=xd(f16), w=_p, b=pd(f16)), RuntimeError),
    Case("weight on meta", a(w=lambda: torch.ones(C, device="meta")), RuntimeError),
    Case("fp64 x, fp64 weight", a(x=xd(f64), w=pd(f64)), finite=True),
    Case("fp16 x", a(x=xd(f16)), finite=True),
    Case("bf16 x", a(x=xd(bf16)), finite=True),
    Case("fp16 x, fp16 weight and bias", a(x=xd(f16), w=pd(f16), b=pd(f16)), finite=True),
    # torch's CPU kernel takes float32 parameters with a half input; ours upcasts x (torch's CUDA kernel
    # wants one dtype) and rounds the float32 result once, as torch does: equal at default tolerances.
    Case("fp16 x, fp32 weight and bias", a(x=xd(f16), w=_p, b=_p), finite=True),
    Case("bf16 x, fp32 weight and bias", a(x=xd(bf16), w=_p, b=_p), finite=True),
    Case("fp16 x, fp32 bias only", a(x=xd(f16), b=_p), finite=True),
]


def _outcome(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor | None, BaseException | None]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. casting a complex 0-d eps
            return fn(), None
    except Exception as exc:  # the row's subject
        return None, exc


def _compare(case: Case, theirs: Callable[[], Any], ours: Callable[[], Any]) -> None:
    expected, torch_exc = _outcome(theirs)
    got, our_exc = _outcome(ours)
    if case.torch_raises is None:
        assert torch_exc is None, f"torch 2.13 computed this; this torch raises {torch_exc!r}"
        assert our_exc is None, f"torch computes this, gn_module raised {our_exc!r}"
        if case.finite:
            assert torch.isfinite(expected).all()
        torch.testing.assert_close(got, expected, equal_nan=True)
        return
    assert type(torch_exc) is case.torch_raises, (
        f"torch 2.13 raised {case.torch_raises}; this torch: {torch_exc!r}"
    )
    assert our_exc is not None, f"torch raises {torch_exc!r}; gn_module returned a result"
    assert isinstance(our_exc, type(torch_exc)), f"torch raises {torch_exc!r}; gn_module raised {our_exc!r}"
    if case.also is not None:
        assert isinstance(our_exc, case.also), f"{our_exc!r} is no longer a {case.also.__name__}"


@pytest.mark.parametrize("case", FUNCTIONAL_CASES, ids=lambda c: c.id)
def test_functional_matches_torch(case):
    args = case.args()
    _compare(case, lambda: F.group_norm(*args), lambda: gn_module.group_norm(*args))


# ---------------------------------------------------------------------------------------------
# The module: construction and forward


@dataclass(frozen=True)
class ModuleCase:
    """``make(cls)`` builds the layer from torch.nn.GroupNorm or gn_module.GroupNorm; ``x()`` the input."""

    id: str
    make: Callable[[type[nn.GroupNorm]], nn.GroupNorm]
    x: Callable[[], torch.Tensor] = lambda: _x(*X)
    torch_raises: type[BaseException] | None = None
    also: type[BaseException] | None = None
    finite: bool = False


def _affine(layer: nn.GroupNorm) -> nn.GroupNorm:
    """Non-trivial, reproducible parameters (the default ones and zeros would hide a swap)."""
    with torch.no_grad():
        for i, p in enumerate(layer.parameters()):
            p.copy_(_p(p.numel(), seed=10 + i))
    return layer


MODULE_CASES = [
    ModuleCase("eps=0", lambda cls: _affine(cls(2, C, eps=0.0)), finite=True),
    ModuleCase("eps=-1e-3", lambda cls: _affine(cls(2, C, eps=-1e-3)), finite=True),
    ModuleCase("eps 0-d tensor", lambda cls: _affine(cls(2, C, eps=torch.tensor(1e-3))), finite=True),
    ModuleCase("groups np.int64", lambda cls: _affine(cls(np.int64(4), C)), finite=True),
    ModuleCase("affine=False, eps=0", lambda cls: cls(2, C, eps=0.0, affine=False), finite=True),
    ModuleCase("C % G != 0 at construction", lambda cls: cls(3, C), torch_raises=ValueError),
    ModuleCase("groups 0 at construction", lambda cls: cls(0, C), torch_raises=ZeroDivisionError),
    ModuleCase(
        "input with other channels", lambda cls: cls(2, 4), torch_raises=RuntimeError, also=ValueError
    ),
    ModuleCase("1-D input", lambda cls: cls(2, C), x=xs(C), torch_raises=RuntimeError, also=ValueError),
    ModuleCase(
        "int64 input", lambda cls: cls(2, C), x=xd(torch.int64), torch_raises=RuntimeError, also=TypeError
    ),
    ModuleCase("complex input", lambda cls: cls(2, C), x=xd(torch.complex64), torch_raises=RuntimeError),
    ModuleCase(
        "int64 input, affine=False",
        lambda cls: cls(2, C, affine=False),
        x=xd(torch.int64),
        torch_raises=NotImplementedError,
        also=TypeError,
    ),
    ModuleCase(
        "bool input, affine=False",
        lambda cls: cls(2, C, affine=False),
        x=lambda: _x(*X) > 0,
        torch_raises=NotImplementedError,
        also=TypeError,
    ),
    ModuleCase(
        "fp64 layer, fp32 input",
        lambda cls: cls(2, C, dtype=torch.float64),
        torch_raises=RuntimeError,
        also=TypeError,
    ),
    ModuleCase("fp32 layer, fp16 input", lambda cls: _affine(cls(2, C)), x=xd(f16), finite=True),
    ModuleCase(
        "fp16 layer, fp32 input", lambda cls: cls(2, C, dtype=torch.float16), torch_raises=RuntimeError
    ),
    ModuleCase("N=0", lambda cls: _affine(cls(2, C)), x=xs(0, C, 4, 4)),
]


@pytest.mark.parametrize("case", MODULE_CASES, ids=lambda c: c.id)
def test_module_matches_torch(case):
    x = case.x()
    _compare(case, lambda: case.make(nn.GroupNorm)(x), lambda: case.make(gn_module.GroupNorm)(x))


# ---------------------------------------------------------------------------------------------
# The exception classes, and eps=0 through the gradient, convert_groupnorm and the callback


def test_exception_classes_are_both_types():
    assert issubclass(GroupNormError, ValueError) and issubclass(GroupNormError, RuntimeError)
    assert issubclass(GroupNormTypeError, TypeError) and issubclass(GroupNormTypeError, RuntimeError)
    assert issubclass(GroupNormDtypeError, TypeError) and issubclass(GroupNormDtypeError, NotImplementedError)
    assert gn_module.GroupNormError is GroupNormError


@pytest.mark.parametrize("eps", [0.0, -1e-3, torch.tensor(0.0)])
def test_gradients_with_zero_and_negative_eps_match_torch(eps):
    x = _x(*X, dtype=torch.float64).requires_grad_()
    w = _p(dtype=torch.float64).requires_grad_()
    b = _p(dtype=torch.float64, seed=2).requires_grad_()
    dy = _x(*X, dtype=torch.float64).flip(0)
    ours = torch.autograd.grad(gn_module.group_norm(x, 2, w, b, eps), (x, w, b), dy)
    theirs = torch.autograd.grad(F.group_norm(x, 2, w, b, eps), (x, w, b), dy)
    for got, expected in zip(ours, theirs, strict=True):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, expected)


def _eps_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, C, 3, padding=1),
        nn.GroupNorm(2, C, eps=0.0),
        nn.SiLU(),
        nn.GroupNorm(4, C, eps=-1e-4),
        nn.GroupNorm(np.int64(2), C, eps=torch.tensor(1e-3)),
    )


def test_convert_swaps_zero_and_negative_eps_layers():
    torch.manual_seed(0)
    model = _eps_model()
    x = _x(2, 3, 6, 6)
    expected = model(x)
    report = gn_module.convert_groupnorm(model)
    swapped = [m for m in model.modules() if isinstance(m, gn_module.GroupNorm)]
    assert len(swapped) == 3, report
    assert [float(m.eps) for m in swapped] == [0.0, -1e-4, pytest.approx(1e-3)]
    torch.testing.assert_close(model(x), expected)


def test_callback_fits_a_model_with_zero_and_negative_eps(tmp_path):
    from lightning.pytorch import LightningModule, Trainer
    from torch.utils.data import DataLoader, TensorDataset

    class Net(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _eps_model()

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            loss = self.net(batch[0]).square().mean()
            assert torch.isfinite(loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

        def train_dataloader(self) -> DataLoader:
            return DataLoader(TensorDataset(_x(4, 3, 6, 6)), batch_size=2)

    model = Net()
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[gn_module.GNSwapCallback(channels_last=False)],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model)
    assert sum(isinstance(m, gn_module.GroupNorm) for m in model.modules()) == 3
    assert trainer.global_step == 2


def test_mixed_parameter_dtypes_take_torchs_path_under_autocast():
    """The one intended difference: under autocast a weight/bias dtype torch's kernel rejects is let
    through to torch's path in the parameter dtype (on CUDA torch's autocast casts group_norm's inputs
    to float32 anyway; FSDP2's float16-parameter policy under bf16 autocast relies on it on CPU too)."""
    x, w = _x(*X).bfloat16(), _p(dtype=f16)
    with pytest.raises(RuntimeError):
        gn_module.group_norm(x, 2, w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = gn_module.group_norm(x, 2, w)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, F.group_norm(x.half(), 2, w).bfloat16())
