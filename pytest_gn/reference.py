"""fp64 reference GroupNorm (+ SiLU) forward and backward, inputs, and dtype-aware comparison.

Imported lazily (it imports torch); the plugin module itself never imports this at load time.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import torch

from gn_module import reference as _project_reference

#: Elementwise tolerances (rtol, atol) per output dtype: the project's own table
#: (gn_module.reference.TOLERANCES), so the plugin and the project's tests judge alike.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    **{dt: (tol.rtol, tol.atol) for dt, tol in _project_reference.TOLERANCES.items()},
    torch.float64: (1e-10, 1e-10),
}


@dataclass
class Reference:
    """fp64 results: y, and the gradients dx, dweight, dbias for the upstream gradient dy."""

    y: torch.Tensor
    dx: torch.Tensor | None = None
    dweight: torch.Tensor | None = None
    dbias: torch.Tensor | None = None


def reference(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    act: str | None = None,
    dy: torch.Tensor | None = None,
) -> Reference:
    """GroupNorm (then SiLU when act == "silu") in float64, with backward when `dy` is given."""
    if act not in (None, "silu"):
        raise ValueError(f"reference: unsupported act {act!r}")
    if dy is None:
        return Reference(_project_reference.forward(x, num_groups, weight, bias, eps, act))
    with torch.enable_grad():
        y, dx, dw, db = _project_reference.forward_backward(x, num_groups, weight, bias, eps, act, dy)
    return Reference(y, dx, dw, db)


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for results stored in `dtype`."""
    try:
        return TOLERANCES[dtype]
    except KeyError:
        raise TypeError(f"no gn tolerance for dtype {dtype}") from None


def compare(
    name: str,
    actual: torch.Tensor,
    expected: torch.Tensor,
    dtype: torch.dtype | None = None,
    terms: int = 1,
) -> str | None:
    """None when `actual` matches `expected` within the tolerance of `dtype`; else a message.

    `terms` is how many values each element sums (dweight/dbias: N x spatial); atol grows with
    its square root, the way rounding error of a long fp32 sum does.
    """
    rtol, atol = tolerance(dtype or actual.dtype)
    atol *= max(1.0, float(terms) ** 0.5)
    if actual.shape != expected.shape:
        return f"{name}: shape {list(actual.shape)} != reference {list(expected.shape)}"
    a = actual.detach().double()
    e = expected.detach().double()
    err = (a - e).abs()
    bad = ~(err <= atol + rtol * e.abs())  # NaN counts as bad
    nbad = int(bad.sum())
    if nbad == 0:
        return None
    worst = int(torch.nan_to_num(err, nan=float("inf")).flatten().argmax())
    return (
        f"{name}: {nbad} of {a.numel()} elements off (rtol={rtol}, atol={atol}); worst at flat index "
        f"{worst}: {a.flatten()[worst].item()!r} vs reference {e.flatten()[worst].item()!r}"
    )


def assert_close(
    actual: Any, expected: Any, dtype: torch.dtype | None = None, name: str = "output", terms: int = 1
) -> None:
    """Raise AssertionError listing every tensor outside the dtype's tolerance (see `compare`)."""
    many = isinstance(actual, (list, tuple))
    pairs = list(zip(actual, expected, strict=True)) if many else [(actual, expected)]
    problems = []
    for i, (a, e) in enumerate(pairs):
        if a is None and e is None:
            continue
        label = name if len(pairs) == 1 else f"{name}[{i}]"
        msg = compare(label, a, e, dtype, terms)
        if msg:
            problems.append(msg)
    if problems:
        raise AssertionError("; ".join(problems))


def case_seed(base: int, case_id: str) -> int:
    """A seed per case that does not depend on test order or the xdist worker."""
    return (base * 1_000_003 + zlib.crc32(case_id.encode())) % (2**63)


def make_inputs(
    shape: tuple[int, ...], dtype: torch.dtype, device: Any, seed: int
) -> dict[str, torch.Tensor]:
    """x (channels_last), fp32 weight/bias, dy. x carries a mean that varies along the rows, so a
    tile left out of a reduction moves the statistics visibly."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    n, c = shape[0], shape[1]
    spatial = shape[2:]
    nhwc = (n, *spatial, c)
    rows = 1
    for s in spatial:
        rows *= s
    ramp = torch.linspace(-3.0, 3.0, rows, device=device).reshape(1, *spatial, 1)
    x = torch.randn(nhwc, generator=g, device=device) * 1.5 + ramp
    dy = torch.randn(nhwc, generator=g, device=device) + 0.25 * ramp
    weight = torch.randn(c, generator=g, device=device) * 0.5 + 1.0
    bias = torch.randn(c, generator=g, device=device) * 0.5
    perm = (0, len(shape) - 1, *range(1, len(shape) - 1))  # NHWC storage viewed as NCHW
    return {
        "x": x.to(dtype).permute(perm),
        "dy": dy.to(dtype).permute(perm),
        "weight": weight,
        "bias": bias,
    }
