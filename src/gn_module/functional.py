"""`group_norm`: argument checks, fast-path selection, and torch's native path for everything else."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

ACTS = (None, "silu")
FAST_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

Passes = Literal["auto", 1, 2]


def check_args(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    act: str | None,
    passes: object,
) -> None:
    """Raise a clear exception for any input torch's GroupNorm or ours would reject."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"group_norm(): expected input to be a Tensor, got {type(x).__name__}")
    if x.dim() < 2:
        raise ValueError(
            f"group_norm(): expected input with at least 2 dimensions, got input of size {list(x.shape)}"
        )
    if not (x.is_floating_point()):
        raise TypeError(f"group_norm(): expected a floating-point input, got {x.dtype}")
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"group_norm(): num_groups must be a positive int, got {num_groups!r}")
    channels = x.shape[1]
    if channels % num_groups:
        raise ValueError(
            f"group_norm(): expected number of channels in input to be divisible by num_groups, "
            f"but got input of shape {list(x.shape)} and num_groups={num_groups}"
        )
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"group_norm(): {name} must be a Tensor or None, got {type(p).__name__}")
        if p.shape != (channels,):
            raise ValueError(
                f"group_norm(): expected {name} to be a 1-D tensor of size {channels} (the number of "
                f"channels), got size {list(p.shape)}"
            )
        if not p.is_floating_point():
            raise TypeError(f"group_norm(): expected {name} to be floating point, got {p.dtype}")
        if p.device != x.device:
            raise RuntimeError(
                f"group_norm(): expected all tensors to be on the same device, but found input on "
                f"{x.device} and {name} on {p.device}"
            )
    if weight is not None and bias is not None and weight.dtype != bias.dtype:
        raise TypeError(f"group_norm(): weight ({weight.dtype}) and bias ({bias.dtype}) must share a dtype")
    if act not in ACTS:
        raise ValueError(f"group_norm(): unsupported act {act!r}; expected one of {ACTS}")
    if passes not in ("auto", 1, 2):
        raise ValueError(f"group_norm(): passes must be 'auto', 1 or 2, got {passes!r}")
    if not isinstance(eps, (int, float)) or not eps > 0:
        raise ValueError(f"group_norm(): eps must be a positive number, got {eps!r}")


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
    if weight is not None and weight.dtype != x.dtype:
        # torch requires matching dtypes; compute in the parameter dtype like autocast would not.
        y = F.group_norm(x.to(weight.dtype), num_groups, weight, bias, eps).to(x.dtype)
    else:
        y = F.group_norm(x, num_groups, weight, bias, eps)
    return F.silu(y) if act == "silu" else y


def group_norm(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    act: str | None = None,
    *,
    passes: Passes = "auto",
) -> torch.Tensor:
    """GroupNorm over ``x`` of shape (N, C, *spatial), optionally followed by SiLU.

    The CUDA fast path takes tensors whose memory order is (N, *spatial, C) (channels_last,
    channels_last_3d, or (N, C, L) stored as (N, L, C)) in float32, float16 or bfloat16, with
    weight/bias in float32 or the input's dtype. Everything else runs torch's native GroupNorm.
    ``passes`` forces the one-pass (1) or two-pass (2) schedule; "auto" picks the faster.
    Differentiable in x, weight and bias.
    """
    check_args(x, num_groups, weight, bias, eps, act, passes)
    if fast_path_reason(x, weight) is not None:
        return native_group_norm(x, num_groups, weight, bias, eps, act)
    from gn_module import ops

    return ops.group_norm_cuda(x, num_groups, weight, bias, float(eps), act, passes)
