"""fp64 reference GroupNorm (+ activation) forward and backward, inputs, and dtype-aware comparison.

Imported lazily (it imports torch); the plugin module itself never imports this at load time.
The fp64 results come from torch's own GroupNorm (`gn_module.reference`), run on whole
(sample, group) blocks of the tensor at a time (`check_outputs`), so a case over 2**31
elements needs a few GiB for its reference rather than eight fp64 copies of itself.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from gn_module import reference as _project_reference
from pytest_gn.cases import CASE_ACTS, INPUT_CHUNK_ELEMENTS, reference_chunk

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
    """GroupNorm, then ``act`` (one of `gn_module.functional.ACTS`: None/"identity", "silu", "relu",
    "gelu", "gelu_tanh", applied by torch's own functions), in float64, with backward when `dy` is given."""
    if act not in CASE_ACTS:
        raise ValueError(f"reference: unsupported act {act!r}; expected one of {CASE_ACTS}")
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


class Mismatch:
    """Elementwise ``|a - e| <= atol + rtol |e|`` over many chunks of one output; `message` says
    how many elements are off and where the worst one is (a NaN counts as off where the reference has
    none; a NaN where it has one, and its very infinities, match)."""

    def __init__(self, name: str, dtype: torch.dtype, terms: int = 1) -> None:
        self.name = name
        self.rtol, atol = tolerance(dtype)
        self.atol = atol * max(1.0, float(terms) ** 0.5)
        self.bad = 0
        self.total = 0
        self.worst: tuple[float, tuple[int, ...], float, float] | None = None  # excess, index, got, want

    def add(
        self,
        actual: torch.Tensor,
        expected: torch.Tensor,
        offset: tuple[int, ...] = (),
        alternative: torch.Tensor | None = None,
        slack: torch.Tensor | None = None,
    ) -> None:
        """`alternative`: a second acceptable reference per element; `slack`: extra atol per element
        (both for ReLU's kink: `gn_module.reference.relu_kink`)."""
        a = actual.detach().double()
        e = expected.detach().double().to(a.device)
        if a.shape != e.shape:
            raise ValueError(f"{self.name}: shape {list(a.shape)} != reference {list(e.shape)}")
        if alternative is not None:
            e = _project_reference.nearer(a, e, alternative)
        excess = (a - e).abs_().sub_(e.abs().mul_(self.rtol).add_(self.atol))
        if slack is not None:
            excess.sub_(slack.double().to(a.device))
        excess.nan_to_num_(nan=float("inf"))  # NaN counts as off, unless the reference has it too:
        excess.masked_fill_((a == e) | (a.isnan() & e.isnan()), float("-inf"))  # (and equal infinities match)
        self.total += a.numel()
        nbad = int((excess > 0).sum())
        if nbad == 0:
            return
        self.bad += nbad
        flat = int(excess.flatten().argmax())
        value = float(excess.flatten()[flat])
        if self.worst is None or value > self.worst[0]:
            idx = [int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape)]
            at = tuple(i + (offset[k] if k < len(offset) else 0) for k, i in enumerate(idx))
            self.worst = (value, at, a.flatten()[flat].item(), e.flatten()[flat].item())

    def message(self) -> str | None:
        if self.bad == 0 or self.worst is None:
            return None
        _, at, got, want = self.worst
        tol = f"rtol={self.rtol}, atol={self.atol:.3g}"
        return (f"{self.name}: {self.bad} of {self.total} elements off ({tol}); "
                f"worst at {list(at)}: {got!r} vs reference {want!r}")  # fmt: skip


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
    if actual.shape != expected.shape:
        return f"{name}: shape {list(actual.shape)} != reference {list(expected.shape)}"
    m = Mismatch(name, dtype or actual.dtype, terms)
    m.add(actual, expected)
    return m.message()


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
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: Any,
    seed: int,
    with_dy: bool = True,
    dy_dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """x (channels_last), fp32 weight/bias and (with `with_dy`) dy, in `dy_dtype` (default x's: float32
    for a wide case, as y is there). x carries a mean that varies along the rows, so a tile left out of a
    reduction moves the statistics visibly. Drawn in chunks of INPUT_CHUNK_ELEMENTS, so a tensor over
    2**31 elements needs no fp32 copy of itself."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    n, c = shape[0], shape[1]
    spatial = tuple(shape[2:])
    rows = 1
    for s in spatial:
        rows *= s
    weight = torch.randn(c, generator=g, device=device) * 0.5 + 1.0
    bias = torch.randn(c, generator=g, device=device) * 0.5
    step = max(1, INPUT_CHUNK_ELEMENTS // c)  # rows of the flat (N * rows, C) view per chunk
    out = {}
    for name, scale, ramp_weight in (("x", 1.5, 1.0), ("dy", 1.0, 0.25)):
        if name == "dy" and not with_dy:
            continue
        t = torch.empty(
            (n, *spatial, c), dtype=dy_dtype if name == "dy" and dy_dtype else dtype, device=device
        )
        flat = t.view(n * rows, c)
        for r0 in range(0, n * rows, step):
            r1 = min(n * rows, r0 + step)
            within = torch.arange(r0, r1, device=device) % rows  # row inside its sample
            ramp = (within.double() * (6.0 / max(1, rows - 1)) - 3.0).float().unsqueeze(1)
            chunk = torch.randn((r1 - r0, c), generator=g, device=device).mul_(scale)
            flat[r0:r1] = chunk.add_(ramp.mul_(ramp_weight))
        out[name] = t.permute(0, len(shape) - 1, *range(1, len(shape) - 1))  # NHWC storage as NCHW
    return {**out, "weight": weight, "bias": bias}


def chunks(shape: tuple[int, ...], groups: int) -> Iterator[tuple[slice, slice]]:
    """(samples, channels) index slices that cover the tensor in whole (sample, group) blocks of
    about REF_CHUNK_ELEMENTS elements (`cases.reference_chunk`)."""
    n, c = shape[0], shape[1]
    samples, per = reference_chunk(shape, groups)
    d = c // groups
    for n0 in range(0, n, samples):
        for g0 in range(0, groups, per):
            yield slice(n0, min(n, n0 + samples)), slice(g0 * d, min(groups, g0 + per) * d)


def check_outputs(
    got: dict[str, torch.Tensor | None],
    inp: dict[str, torch.Tensor],
    num_groups: int,
    eps: float,
    act: str | None,
) -> list[str]:
    """Compare outputs with the fp64 reference, chunk by chunk; the list of problems.

    `got` holds ``y`` (forward check) or ``dx``, ``dweight``, ``dbias`` (backward check).
    GroupNorm statistics are per (sample, group), so each chunk's reference is exact on its own;
    dweight and dbias sum over samples and are compared once every chunk has been added.
    """
    x, w, b = inp["x"], inp["weight"], inp["bias"]
    shape = tuple(x.shape)
    backward = "y" not in got
    problems = [f"{k}: the implementation returned no {'gradient' if backward else 'output'}"
                for k, v in got.items() if v is None]  # fmt: skip
    for k, v in got.items():
        if v is not None and tuple(v.shape) != (shape if k in ("y", "dx") else (shape[1],)):
            problems.append(
                f"{k}: shape {list(v.shape)} != reference {list(shape if k in ('y', 'dx') else (shape[1],))}"
            )
    if problems:
        return problems
    terms = x.numel() // shape[1]
    checks = {k: Mismatch(k, got[k].dtype, terms if k in ("dweight", "dbias") else 1) for k in got}
    dw = torch.zeros(shape[1], dtype=torch.float64, device=x.device)
    db = torch.zeros_like(dw)
    slack_w, slack_b = torch.zeros_like(dw), torch.zeros_like(dw)  # ReLU's kink (relu_kink)
    d = shape[1] // num_groups
    for ns, cs in chunks(shape, num_groups):
        gs = (cs.stop - cs.start) // d
        offset = (ns.start, cs.start)
        if backward:
            ref = reference(x[ns, cs], gs, w[cs], b[cs], eps, act, inp["dy"][ns, cs])
            kink = None
            if act == "relu":  # its derivative jumps at 0: near it, either side is right
                kink = _project_reference.relu_kink(x[ns, cs], gs, w[cs], b[cs], eps, inp["dy"][ns, cs])
            if kink is None:
                checks["dx"].add(got["dx"][ns, cs], ref.dx, offset)
            else:
                checks["dx"].add(got["dx"][ns, cs], ref.dx, offset, ref.dx + kink.dx_shift, kink.dx_slack)
                slack_w[cs] += kink.dweight_slack
                slack_b[cs] += kink.dbias_slack
            dw[cs] += ref.dweight
            db[cs] += ref.dbias
        else:
            ref = reference(x[ns, cs], gs, w[cs], b[cs], eps, act)
            checks["y"].add(got["y"][ns, cs], ref.y, offset)
        del ref
    if backward:
        checks["dweight"].add(got["dweight"], dw, slack=slack_w)
        checks["dbias"].add(got["dbias"], db, slack=slack_b)
    return [m + " (fp64 reference)" for m in (c.message() for c in checks.values()) if m]
