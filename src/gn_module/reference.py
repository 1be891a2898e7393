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


@dataclass
class ReluKink:
    """What ReLU's jump lets a backward differ by (`relu_kink`): where the fp64 pre-activation is within
    fp32 rounding of 0, the kernel may take either side of ReLU's derivative."""

    ambiguous: int  # elements within the band
    dx_shift: torch.Tensor  # add to the reference dx: each ambiguous element's own dx with its side flipped
    dx_slack: torch.Tensor  # per element: what the flips in its group may move it by
    dweight_slack: torch.Tensor  # per channel: sum of |dy * xhat| over the ambiguous elements
    dbias_slack: torch.Tensor  # per channel: sum of |dy| over them


#: Half-width of the band around z = 0, relative to the magnitudes z is computed from: the kernels
#: form z = x * scale + shift in fp32 from fp32 statistics, a few 2^-24 ulps of those terms.
RELU_KINK_BAND = 2.0**-17


def relu_kink(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    dy: torch.Tensor,
) -> ReluKink | None:
    """Allowances for a GroupNorm + ReLU backward at the kink; None when no element is near it.

    Flipping element i's side changes g_i = weight * dy_i * relu'(z_i) by dg_i = +-weight * dy_i. dx of a
    group of M elements is rstd * (g - mean(g) - xhat * mean(g * xhat)), so dx_i moves by
    rstd * dg_i * (1 - (1 + xhat_i^2) / M) and every dx_j of the group by at most
    rstd * (|dg_i| + |xhat_j| |dg_i xhat_i|) / M.
    """
    n, c = x.shape[:2]
    cpg = c // num_groups
    # own contiguous copies (they are changed in place below)
    f64 = dict(dtype=torch.float64, memory_format=torch.contiguous_format, copy=True)
    # (sample, group, channel of the group, position): per-channel values broadcast, never copied
    xg = x.detach().to(**f64).reshape(n, num_groups, cpg, -1)
    m = cpg * xg.shape[-1]
    rstd = (xg.var((2, 3), unbiased=False, keepdim=True) + eps).rsqrt_()
    xhat = (xg - xg.mean((2, 3), keepdim=True)).mul_(rstd)
    per_channel = (1, num_groups, cpg, 1)
    gamma = torch.ones(per_channel, dtype=torch.float64, device=x.device)
    beta = torch.zeros(per_channel, dtype=torch.float64, device=x.device)
    if weight is not None:
        gamma = weight.detach().double().reshape(per_channel)
    if bias is not None:
        beta = bias.detach().double().reshape(per_channel)
    band = xg.abs_().mul_(gamma.abs() * rstd)  # |x * scale| (xg is not needed again)
    band.add_(beta.abs()).add_(xhat * gamma.abs()).mul_(RELU_KINK_BAND)
    z = xhat * gamma + beta
    amb = z.abs() <= band
    del band, xg
    count = int(amb.sum())
    if count == 0:
        return None
    dy_g = dy.detach().to(**f64).reshape(xhat.shape)
    # dg: the reference's relu' is 1 for z > 0, else 0; the other side adds -/+ w * dy
    dg = torch.where(z > 0, -gamma, gamma).mul_(dy_g).mul_(amb)
    del z
    dy_amb = dy_g.abs_().mul_(amb)  # (dy_g is not needed again)
    del dy_g, amb
    shift = (xhat.square().add_(1.0).mul_(-1.0 / m).add_(1.0)).mul_(dg).mul_(rstd)
    s0 = dg.abs().sum((2, 3), keepdim=True)
    s1 = (dg * xhat).abs_().sum((2, 3), keepdim=True)
    del dg
    slack = xhat.abs().mul_(s1).add_(s0).mul_(rstd / m)
    dweight_slack = (dy_amb * xhat.abs()).sum((0, 3)).reshape(c)
    dbias_slack = dy_amb.sum((0, 3)).reshape(c)
    return ReluKink(
        ambiguous=count,
        dx_shift=shift.reshape(x.shape),
        dx_slack=slack.reshape(x.shape),
        dweight_slack=dweight_slack,
        dbias_slack=dbias_slack,
    )


def nearer(out: torch.Tensor, ref: torch.Tensor, alternative: torch.Tensor) -> torch.Tensor:
    """Per element, whichever of two acceptable fp64 references `out` (fp64) is closer to."""
    alt = alternative.detach().double().to(out.device)
    return torch.where((out - alt).abs() < (out - ref).abs(), alt, ref)


def compare(
    out: torch.Tensor,
    ref: torch.Tensor,
    dtype: torch.dtype,
    what: str = "output",
    alternative: torch.Tensor | None = None,
    slack: torch.Tensor | None = None,
) -> None:
    """Raise AssertionError naming the worst element when `out` is not within `dtype`'s tolerance.

    `alternative`: a second acceptable reference per element (ReLU's kink, `relu_kink`); `slack`: extra
    absolute tolerance per element (broadcast against `out`)."""
    tol = tolerance(dtype)
    o = out.detach().double()
    r = ref.detach().double().to(o.device)
    if o.shape != r.shape:
        raise AssertionError(f"{what}: shape {tuple(o.shape)} != reference {tuple(r.shape)}")
    if alternative is not None:
        r = nearer(o, r, alternative)
    if not torch.isfinite(o).all():
        bad = (~torch.isfinite(o)).sum().item()
        raise AssertionError(f"{what}: {bad} non-finite elements (unwritten output or overflow)")
    err = (o - r).abs()
    bound = tol.atol + tol.rtol * r.abs() + (0.0 if slack is None else slack.double().to(o.device))
    excess = err - bound
    worst = int(torch.argmax(excess).item())
    if excess.flatten()[worst] > 0:
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), o.shape))
        raise AssertionError(
            f"{what}: {(excess > 0).sum().item()} elements out of tolerance {tol}; worst at {idx}: "
            f"got {o.flatten()[worst].item():.6g}, expected {r.flatten()[worst].item():.6g}"
        )
    norm = r.norm().item()
    if slack is not None:  # what the slack allows counts toward neither bound
        err = (err - slack.double().to(o.device)).clamp_min(0.0)
    rel = err.norm().item() / (norm if norm > 0 else 1.0)
    if rel > tol.rel_norm:
        raise AssertionError(f"{what}: relative norm error {rel:.3g} > {tol.rel_norm}")
