"""fp64 reference GroupNorm (forward and backward, with SiLU) and the tolerances tests use.

Shared by the project's tests and the pytest plugin's fixtures (`gn_reference`, `gn_assert_close`).
The reference upcasts the very inputs the kernel saw, so only the kernel's own rounding counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gn_module.functional import native_group_norm


@dataclass(frozen=True)
class Tolerance:
    """Bounds for one output: elementwise |out - ref| <= atol + rtol * |ref|, and relative norm."""

    atol: float
    rtol: float
    rel_norm: float  # ||out - ref|| / ||ref||


# The 16-bit formats round each output once (fp16: 2^-11, bf16: 2^-8 relative); elementwise
# bounds allow a few of those ulps on |y| ~ 4; the norm bound catches systematic errors
# (a tile left out of a reduction moves every element of its group).
TOLERANCES = {
    torch.float32: Tolerance(atol=1e-4, rtol=1e-4, rel_norm=1e-5),
    torch.float16: Tolerance(atol=1e-2, rtol=1e-2, rel_norm=2e-3),
    torch.bfloat16: Tolerance(atol=3e-2, rtol=2e-2, rel_norm=1e-2),
}


def tolerance(dtype: torch.dtype) -> Tolerance:
    return TOLERANCES[dtype]


def _float64(t: torch.Tensor | None, grad: bool) -> torch.Tensor | None:
    return None if t is None else t.detach().double().contiguous().requires_grad_(grad)


def forward(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    act: str | None,
) -> torch.Tensor:
    """fp64 GroupNorm(+SiLU) of x (any layout), on x's device: torch's own path, upcast."""
    xd, wd, bd = (_float64(t, False) for t in (x, weight, bias))
    return native_group_norm(xd, num_groups, wd, bd, eps, act)


def forward_backward(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    act: str | None,
    dy: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """fp64 y, dx, dweight, dbias for upstream gradient dy."""
    xd, wd, bd = (_float64(t, True) for t in (x, weight, bias))
    y = native_group_norm(xd, num_groups, wd, bd, eps, act)
    inputs = [t for t in (xd, wd, bd) if t is not None]
    grads = torch.autograd.grad(y, inputs, _float64(dy, False))
    dx = grads[0]
    dw = grads[1] if wd is not None else None
    db = grads[-1] if bd is not None else None
    return y.detach(), dx, dw, db


def compare(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "output") -> None:
    """Raise AssertionError naming the worst element when `out` is not within `dtype`'s tolerance."""
    tol = tolerance(dtype)
    o = out.detach().double()
    r = ref.detach().double().to(o.device)
    if o.shape != r.shape:
        raise AssertionError(f"{what}: shape {tuple(o.shape)} != reference {tuple(r.shape)}")
    if not torch.isfinite(o).all():
        bad = (~torch.isfinite(o)).sum().item()
        raise AssertionError(f"{what}: {bad} non-finite elements (unwritten output or overflow)")
    err = (o - r).abs()
    bound = tol.atol + tol.rtol * r.abs()
    excess = err - bound
    worst = int(torch.argmax(excess).item())
    if excess.flatten()[worst] > 0:
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), o.shape))
        raise AssertionError(
            f"{what}: {(excess > 0).sum().item()} elements out of tolerance {tol}; worst at {idx}: "
            f"got {o.flatten()[worst].item():.6g}, expected {r.flatten()[worst].item():.6g}"
        )
    norm = r.norm().item()
    rel = (o - r).norm().item() / (norm if norm > 0 else 1.0)
    if rel > tol.rel_norm:
        raise AssertionError(f"{what}: relative norm error {rel:.3g} > {tol.rel_norm}")
