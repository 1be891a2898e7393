"""`group_norm`: argument checks, fast-path selection, and torch's native path for everything else."""

from __future__ import annotations

import math
import operator
import os
import sys
from types import ModuleType
from typing import Literal

import torch
import torch.nn.functional as F

from gn_module import _abi

#: The fused activations: None and "identity" (the same: no activation), "silu", "relu", "gelu"
#: (erf, torch's default ``F.gelu``) and "gelu_tanh" (``F.gelu(approximate="tanh")``). Their kernel
#: codes are `gn_module._abi.ACT_CODES`; `apply_act` is their definition off the kernels.
ACTS = (None, "identity", "silu", "relu", "gelu", "gelu_tanh")
FAST_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

Passes = Literal["auto", 1, 2]
#: What a CUDA GroupNorm returns under autocast: float32, as torch's (autocast runs group_norm in
#: float32), or the input's dtype (opt-in: half the output bytes and no float32 copy of the input).
AutocastOutput = Literal["float32", "input"]
AUTOCAST_OUTPUTS = ("float32", "input")


class GroupNormError(ValueError, RuntimeError):
    """An argument `torch.nn.functional.group_norm` rejects with RuntimeError (bad shapes, groups, dims).

    Also a ValueError, the type gn_module raised before, so both kinds of ``except`` keep working.
    """


class GroupNormTypeError(TypeError, RuntimeError):
    """weight/bias dtypes torch's GroupNorm rejects with RuntimeError ("mixed dtype"); also a TypeError."""


class GroupNormDtypeError(GroupNormTypeError, NotImplementedError):
    """An input dtype GroupNorm has no kernel for (integer, bool, complex, float8): torch raises
    NotImplementedError; also a TypeError, as before."""


class GroupNormArgTypeError(ValueError, TypeError):
    """``num_groups`` that is not an integer: torch raises TypeError; also a ValueError, as before."""


class GroupNormZeroGroupsError(GroupNormError, ZeroDivisionError):
    """``num_groups=0``: torch divides by it (ZeroDivisionError); also a ValueError, as before."""


# The dtypes torch's GroupNorm kernels take; parameters match the input, or are float32 for a
# float16/bfloat16 input (torch's "mixed dtype" rule).
KERNEL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
REDUCED_DTYPES = (torch.float16, torch.bfloat16)


def _numpy_scalar(value: object, kinds: str) -> bool:
    """``value`` is a numpy scalar whose dtype kind is in ``kinds`` (numpy is not imported for this)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(value, np.generic) and value.dtype.kind in kinds


def _autocast_enabled(x: torch.Tensor) -> bool:
    try:
        return torch.is_autocast_enabled(x.device.type)
    except RuntimeError:  # a device type autocast does not know (meta)
        return False


def as_num_groups(num_groups: object) -> int:
    """``num_groups`` as an int, accepting what torch accepts: int, numpy integer, 0-d integer tensor."""
    if type(num_groups) is int:
        return num_groups
    if isinstance(num_groups, bool) or _numpy_scalar(num_groups, "b"):
        ok = False
    elif isinstance(num_groups, torch.Tensor):
        ok = num_groups.dim() == 0 and not (num_groups.is_floating_point() or num_groups.is_complex())
        ok = ok and num_groups.dtype != torch.bool
    else:
        ok = isinstance(num_groups, int) or _numpy_scalar(num_groups, "iu")
    if not ok:
        raise GroupNormArgTypeError(
            f"group_norm(): num_groups must be an int, got {type(num_groups).__name__} {num_groups!r}"
        )
    return operator.index(num_groups)  # type: ignore[arg-type]


def as_eps(eps: object) -> float:
    """``eps`` as a float, accepting what torch accepts: any real number (0 and negative included),
    a numpy scalar, or a 0-d tensor that does not require grad."""
    if type(eps) is float:
        return eps
    if isinstance(eps, torch.Tensor):
        if eps.dim() == 0 and not eps.requires_grad:
            return float(eps.real if eps.is_complex() else eps)
    elif isinstance(eps, (int, float)) or _numpy_scalar(eps, "biuf"):
        return float(eps)  # type: ignore[arg-type]
    raise TypeError(f"group_norm(): eps must be a float, got {type(eps).__name__}")


def check_args(
    x: torch.Tensor,
    num_groups: object,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: object,
    act: str | None,
    passes: object,
) -> tuple[int, float]:
    """Raise what torch's GroupNorm raises for inputs it rejects (an exception catchable as torch's type,
    checked in torch's order), or a clear exception for our own arguments; returns the normalized
    ``(num_groups, eps)``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"group_norm(): expected input to be a Tensor, got {type(x).__name__}")
    shape = x.shape
    if len(shape) < 2:
        raise GroupNormError(
            f"group_norm(): expected input with at least 2 dimensions, got input of size {list(shape)}"
        )
    groups = as_num_groups(num_groups)
    if groups == 0:
        raise GroupNormZeroGroupsError(f"group_norm(): num_groups must be a positive int, got {groups}")
    # torch.nn.functional.group_norm's _verify_batch_size, which raises ValueError.
    if shape[0] * shape[1] // groups == 1 and math.prod(shape[2:]) == 1:
        raise ValueError(
            f"group_norm(): expected more than 1 value per channel, got input of size {list(shape)} "
            f"and num_groups={groups}"
        )
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and not isinstance(p, torch.Tensor):
            raise TypeError(f"group_norm(): {name} must be a Tensor or None, got {type(p).__name__}")
    eps = as_eps(eps)
    if groups < 0:
        raise GroupNormError(f"group_norm(): num_groups must be a positive int, got {groups}")
    channels = shape[1]
    if channels % groups:
        raise GroupNormError(
            f"group_norm(): expected number of channels in input to be divisible by num_groups, "
            f"but got input of shape {list(shape)} and num_groups={groups}"
        )
    params = [(name, p) for name, p in (("weight", weight), ("bias", bias)) if p is not None]
    for name, p in params:
        if p.shape != (channels,):
            raise GroupNormError(
                f"group_norm(): expected {name} to be a 1-D tensor of size {channels} (the number of "
                f"channels), got size {list(p.shape)}"
            )
    device, dtype = x.device, x.dtype
    for name, p in params:
        if p.device != device:
            raise RuntimeError(
                f"group_norm(): expected all tensors to be on the same device, but found input on "
                f"{device} and {name} on {p.device}"
            )
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        raise GroupNormTypeError(
            f"group_norm(): weight ({weight.dtype}) and bias ({bias.dtype}) must share a dtype"
        )
    # Under autocast the mix is let through to torch's path, which computes in the parameter dtype:
    # on CUDA torch's autocast casts group_norm's inputs to float32 before its own check, and
    # FSDP2's float16-parameter policy under bf16 autocast meets bf16 activations (on CPU too).
    if params:
        name, p_dtype = params[0][0], params[0][1].dtype
        mixed = p_dtype != dtype and not (dtype in REDUCED_DTYPES and p_dtype == torch.float32)
        if mixed and not _autocast_enabled(x):
            raise GroupNormTypeError(
                f"group_norm(): expected {name} to be floating point of the input's dtype {dtype} "
                f"(or float32 for a float16/bfloat16 input), got {p_dtype}"
            )
    if dtype not in KERNEL_DTYPES:
        raise GroupNormDtypeError(
            f"group_norm(): expected a floating-point input (float32, float64, float16 or bfloat16), "
            f"got {dtype}"
        )
    if act not in ACTS:
        raise ValueError(f"group_norm(): unsupported act {act!r}; expected one of {ACTS}")
    if passes not in ("auto", 1, 2):
        raise ValueError(f"group_norm(): passes must be 'auto', 1 or 2, got {passes!r}")
    return groups, eps


_FAST_DTYPE_SET = frozenset(FAST_DTYPES)
_ACT_CODES = _abi.ACT_CODES
_PARAM_TYPES = (torch.Tensor, torch.nn.Parameter)
# Whether a tensor is on the device our kernels run on (CUDA); one attribute read. The CPU tests and
# scripts/host_overhead.py --cpu point it at CPU tensors to run the fast route without a GPU.
_on_device = operator.attrgetter("is_cuda")
_ops: ModuleType | None = None


def channels_last_view(x: torch.Tensor) -> torch.Tensor | None:
    """x viewed as (N, *spatial, C) when that view is dense and contiguous, else None."""
    xp = x.movedim(1, -1)
    return xp if xp.is_contiguous() else None


def fast_path_reason(x: torch.Tensor, weight: torch.Tensor | None) -> str | None:
    """Why `x` takes torch's native path (None when our CUDA kernels handle it)."""
    if x.device.type != "cuda":
        return f"input is on {x.device.type}, not CUDA"
    if x.dtype not in FAST_DTYPES:
        return f"dtype {x.dtype} is not one of float32, float16, bfloat16"
    if weight is not None and weight.dtype not in (torch.float32, x.dtype):
        return f"weight dtype {weight.dtype} is neither float32 nor the input's {x.dtype}"
    if x.numel() == 0:
        return "input is empty"
    if channels_last_view(x) is None:
        return "input memory order is not (N, *spatial, C)"
    return None


def native_group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    act: str | None,
) -> torch.Tensor:
    """torch's own GroupNorm (+ SiLU): the reference semantics, used off the fast path."""
    param = weight if weight is not None else bias
    if param is not None and param.dtype != x.dtype:
        # float32 parameters with a float16/bfloat16 input (or, under autocast, any mix): torch's CUDA
        # kernel wants one dtype, so compute in the parameter dtype and round once.
        y = F.group_norm(x.to(param.dtype), num_groups, weight, bias, eps).to(x.dtype)
    else:
        y = F.group_norm(x, num_groups, weight, bias, eps)
    return apply_act(y, act)


def apply_act(y: torch.Tensor, act: str | None) -> torch.Tensor:
    """``act`` (one of `ACTS`) applied to ``y`` with torch's own functions."""
    if act is None or act == "identity":
        return y
    if act == "silu":
        return F.silu(y)
    if act == "relu":
        return F.relu(y)
    if act == "gelu":
        return F.gelu(y)
    if act == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    raise ValueError(f"unsupported act {act!r}; expected one of {ACTS}")


def _fast_route(
    x: object,
    num_groups: object,
    weight: object,
    bias: object,
    eps: object,
    act: object,
    passes: object,
) -> tuple[int, int] | None:
    """``(act code, passes code)`` when this is a plain eager call of the CUDA fast path, else None.

    A few attribute reads that accept only calls for which `check_args` raises nothing and returns
    ``(num_groups, eps)`` unchanged, and `fast_path_reason` returns None: a CUDA tensor x of a fast
    dtype, non-empty, (N, *spatial, C) dense, with an int num_groups, a float eps, weight and bias
    None or CUDA tensors of shape (C,) on x's device in x's dtype or float32, and act and passes
    spelled as documented. Everything else (odd argument types, errors, torch.compile tracing, tensor
    subclasses) returns None and takes the full checks, which decide as before.
    """
    if torch.compiler.is_compiling() or type(x) is not torch.Tensor or not _on_device(x):
        return None
    if type(num_groups) is not int or num_groups < 1 or type(eps) is not float:
        return None
    if act is None:
        act_code = 0
    elif type(act) is str:
        act_code = _ACT_CODES.get(act, -1)
        if act_code < 0:
            return None
    else:
        return None
    if type(passes) is str and passes == "auto":
        passes_code = 0
    elif type(passes) is int and (passes == 1 or passes == 2):
        passes_code = passes
    else:
        return None
    shape = x.shape
    ndim = len(shape)
    if ndim < 2:
        return None
    channels = shape[1]
    numel = x.numel()
    if channels % num_groups or numel == 0:
        return None
    # torch's "more than 1 value per channel" error (one value per group: N * C // G == 1 and no
    # spatial extent): full checks. (N = 1 with one channel per group and spatial extent is fine: the
    # plugin's c32g32 cases of one sample, which the autocast route then sent to the cast.)
    if shape[0] * channels // num_groups == 1 and numel == shape[0] * channels:
        return None
    dtype = x.dtype
    if dtype not in _FAST_DTYPE_SET:
        return None
    param_dtype = None
    if weight is not None:
        if type(weight) not in _PARAM_TYPES or not _on_device(weight) or weight.shape != (channels,):  # type: ignore[attr-defined]
            return None
        if weight.get_device() != x.get_device():  # type: ignore[attr-defined]
            return None
        param_dtype = weight.dtype  # type: ignore[attr-defined]
    if bias is not None:
        if type(bias) not in _PARAM_TYPES or not _on_device(bias) or bias.shape != (channels,):  # type: ignore[attr-defined]
            return None
        if bias.get_device() != x.get_device():  # type: ignore[attr-defined]
            return None
        if param_dtype is None:
            param_dtype = bias.dtype  # type: ignore[attr-defined]
        elif bias.dtype is not param_dtype:  # type: ignore[attr-defined]
            return None
    if param_dtype is not None and param_dtype is not dtype and param_dtype is not torch.float32:
        return None
    if ndim == 4:
        dense = x.is_contiguous(memory_format=torch.channels_last)
    elif ndim == 5:
        dense = x.is_contiguous(memory_format=torch.channels_last_3d)
    else:
        dense = channels_last_view(x) is not None
    if not dense:
        return None
    return act_code, passes_code


def _under_cuda_autocast(x: object) -> bool:
    """Whether CUDA autocast would run group_norm on `x` in float32 (a CUDA tensor, autocast on)."""
    return type(x) is torch.Tensor and x.is_cuda and torch.is_autocast_enabled("cuda")


def _float32_param(t: object) -> object:
    """What CUDA autocast does to one of group_norm's arguments: a floating tensor but float64 cast to
    float32 (autocast casts CUDA tensors; a weight elsewhere fails torch's device check either way)."""
    if isinstance(t, torch.Tensor) and t.dtype is not torch.float32 and t.is_floating_point():
        return t if t.dtype is torch.float64 else t.float()
    return t


def _autocast_float32(x: torch.Tensor, weight: object, bias: object) -> tuple[torch.Tensor, object, object]:
    """What CUDA autocast does to group_norm's arguments (`_float32_param` for each)."""
    return _float32_param(x), _float32_param(weight), _float32_param(bias)  # type: ignore[return-value]


#: Under CUDA autocast the kernels read a float16/bfloat16 x as it is and write float32 y (and take
#: float32 dy, giving dx in x's dtype) instead of running on a float32 copy of x: the same arithmetic,
#: without the two casts and the float32 copy saved for backward (the "wide" launches; H200, bf16
#: training steps: RESULTS.md session 10). GN_WIDE_AUTOCAST=0 casts as before.
ENV_WIDE_AUTOCAST = "GN_WIDE_AUTOCAST"


def wide_autocast_enabled() -> bool:
    """Whether autocast calls take the wide launches (`ENV_WIDE_AUTOCAST`, on unless "0")."""
    return os.environ.get(ENV_WIDE_AUTOCAST, "1") != "0"


def _compiled_wide(
    x: torch.Tensor,
    num_groups: object,
    weight: object,
    bias: object,
    eps: object,
    act: str | None,
    passes: object,
) -> torch.Tensor | None:
    """Under torch.compile and CUDA autocast, a float16/bfloat16 x on the fast path: the custom op's
    wide form (float32 y from x as it is, as the eager wide launches), so the compiled graph holds no
    float32 copy of x and saves x itself for the backward. None where the call is not for our kernels
    (weight/bias not float32, or x off the fast path): the caller casts, as before."""
    if any(
        p is not None and (not isinstance(p, torch.Tensor) or p.dtype != torch.float32)
        for p in (weight, bias)
    ):
        return None
    groups, eps_ = check_args(x, num_groups, weight, bias, eps, act, passes)  # type: ignore[arg-type]
    if fast_path_reason(x, weight) is not None:  # type: ignore[arg-type]
        return None
    ops = _ops or _import_ops()
    return ops.group_norm_cuda(x, groups, weight, bias, eps_, act, passes, wide=True)  # type: ignore[arg-type]


def _import_ops() -> ModuleType:
    global _ops
    from gn_module import ops

    _ops = ops
    return ops


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float | torch.Tensor = 1e-5,
    act: str | None = None,
    *,
    passes: Passes = "auto",
    autocast_output: AutocastOutput = "float32",
) -> torch.Tensor:
    """GroupNorm over ``x`` of shape (N, C, *spatial), optionally followed by a fused activation
    (``act``: "silu", "relu", "gelu", "gelu_tanh", "identity" or None).

    The CUDA fast path takes tensors whose memory order is (N, *spatial, C) (channels_last,
    channels_last_3d, or (N, C, L) stored as (N, L, C)) in float32, float16 or bfloat16, with
    weight/bias in float32 or the input's dtype. Everything else runs torch's native GroupNorm.
    ``passes`` forces the one-pass (1) or two-pass (2) schedule; "auto" picks the faster.
    Differentiable in x, weight and bias.

    Arguments follow `torch.nn.functional.group_norm`: ``num_groups`` may be a numpy integer, ``eps``
    any real number (0 and negative included; the result is finite while each group's variance
    exceeds -eps) or a 0-d tensor. Inputs torch rejects raise an exception of torch's type: see
    `GroupNormError`, `GroupNormTypeError` and `GroupNormDtypeError`, which also subclass the
    ValueError/TypeError raised before.

    Under CUDA autocast it returns what torch's GroupNorm returns: float32, computed from the inputs
    cast to float32 (autocast lists group_norm among its float32 ops). ``autocast_output="input"``
    keeps the input's dtype instead (the kernels still accumulate in float32): faster and lighter,
    but the rest of the model then sees bfloat16/float16 where torch would give it float32.
    """
    if autocast_output != "float32":
        if autocast_output != "input":
            raise ValueError(
                f"group_norm(): autocast_output must be one of {AUTOCAST_OUTPUTS}, got {autocast_output!r}"
            )
    elif _under_cuda_autocast(x):
        if x.dtype in REDUCED_DTYPES and wide_autocast_enabled():  # the wide launches, where they exist
            w32, b32 = _float32_param(weight), _float32_param(bias)
            codes = _fast_route(x, num_groups, w32, b32, eps, act, passes)
            if codes is not None:
                ops = _ops or _import_ops()
                y = ops.group_norm_wide(x, num_groups, w32, b32, eps, *codes)  # type: ignore[arg-type]
                if y is not None:
                    return y
            elif torch.compiler.is_compiling():
                y = _compiled_wide(x, num_groups, w32, b32, eps, act, passes)
                if y is not None:
                    return y
        x, weight, bias = _autocast_float32(x, weight, bias)
    codes = _fast_route(x, num_groups, weight, bias, eps, act, passes)
    if codes is not None:
        return (_ops or _import_ops()).group_norm_eager(x, num_groups, weight, bias, eps, *codes)  # type: ignore[arg-type]
    num_groups, eps = check_args(x, num_groups, weight, bias, eps, act, passes)
    if fast_path_reason(x, weight) is not None:
        return native_group_norm(x, num_groups, weight, bias, eps, act)
    from gn_module import ops

    return ops.group_norm_cuda(x, num_groups, weight, bias, eps, act, passes)
