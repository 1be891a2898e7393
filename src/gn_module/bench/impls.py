"""What is timed for each implementation: shared by `python -m gn_module.bench` and benchmarks/.

All implementations compute ``silu(group_norm(x))`` (SiLU only where the case says) with weight and
bias in x's dtype, on the same data:

- ``ours-auto`` / ``ours-1pass`` / ``ours-2pass``: ``gn_module.group_norm(..., passes=...)`` on
  channels_last x.
- ``eager``: ``F.group_norm`` (+ ``F.silu``) on the same channels_last x.
- ``compile-cl`` / ``compile-nchw``: ``torch.compile(dynamic=False)`` of that eager function, compiled for
  this shape only, on the channels_last x and on an NCHW-contiguous copy.
- ``foreign``: a third-party GroupNorm given as a callable with pytest-gn's ``--gn-impl`` protocol,
  ``impl(x, num_groups, weight, bias, eps, act) -> y``, on the channels_last x.

Forward timing: one call under ``torch.no_grad()`` (inference forward; the compiled variants compile
an inference graph for it).

Autocast rows (``bf16-autocast``, ``fp16-autocast``): x in the 16-bit dtype, weight and bias float32,
every call (and the backward's forward) under ``torch.autocast("cuda")``: y and dy are float32, as
torch's GroupNorm returns there. Ours runs its wide launches; torch casts x to float32 first.

Backward timing: the forward runs once, outside timing, with x, weight and bias requiring grad; the timed
call is ``torch.autograd.grad(y, (x, weight, bias), dy, retain_graph=True)``. It runs exactly the backward
kernels of the graph: dx, dweight and dbias (and SiLU's backward where present). For torch.compile this is
the backward graph AOTAutograd compiled jointly with the forward (compiled lazily at the first backward,
i.e. during warm-up). Donated buffers are turned off for compiled graphs because they forbid
``retain_graph=True``; they only save memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gn_module.bench.cases import AUTOCAST_DTYPES, IMPLS, Case

EPS = 1e-5
PASSES = {"ours-auto": "auto", "ours-1pass": 1, "ours-2pass": 2}
#: A third-party implementation (``--gn-impl``); not in IMPLS, timed only when one is given.
FOREIGN = "foreign"
#: Names the launcher may give its "which schedule would auto pick" helper (looked up, never required).
AUTO_SCHEDULE_NAMES = (
    "chosen_schedule",
    "auto_schedule",
    "choose_schedule",
    "pick_schedule",
    "select_schedule",
)
PLAN_FIELDS = ("schedule", "grid", "tiles", "overflow_tiles", "reread_tiles", "residency", "waves", "cap")


@dataclass
class Prepared:
    """A zero-argument callable to time, and what our launcher planned for it (ours only)."""

    fn: Callable[[], object]
    plan: dict[str, Any] | None
    tensors: tuple[Any, ...]  # kept alive for the lifetime of `fn`


def torch_dtype(name: str) -> Any:
    import torch

    table = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    try:
        return table[AUTOCAST_DTYPES.get(name, name)]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(table)}") from None


def reference(x: Any, groups: int, weight: Any, bias: Any, act: str | None) -> Any:
    """PyTorch's GroupNorm (+ SiLU): the eager and torch.compile implementation."""
    import torch.nn.functional as F

    y = F.group_norm(x, groups, weight, bias, EPS)
    return F.silu(y) if act == "silu" else y


def make_inputs(case: Case, dtype: str, device: Any, *, seed: int = 0) -> tuple[Any, Any, Any]:
    """channels_last (or channels_last_3d) x with unit-ish statistics, and weight/bias in x's dtype
    (float32 in the autocast rows)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    td = torch_dtype(dtype)
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(len(case.shape))
    if fmt is None:
        raise ValueError(f"benchmark shapes are 4-D or 5-D, got {case.shape}")
    x = torch.empty(case.shape, dtype=td, device=device, memory_format=fmt)
    x.normal_(0.5, 2.0, generator=gen)
    c = case.shape[1]
    pd = torch.float32 if dtype in AUTOCAST_DTYPES else td
    weight = torch.empty(c, dtype=pd, device=device).normal_(1.0, 0.1, generator=gen)
    bias = torch.empty(c, dtype=pd, device=device).normal_(0.0, 0.1, generator=gen)
    return x, weight, bias


def autocast_context(dtype: str, device: Any) -> contextlib.AbstractContextManager:
    """CUDA autocast to the row's 16-bit dtype for an autocast row, else nothing."""
    import torch

    if dtype not in AUTOCAST_DTYPES:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch_dtype(dtype))


def make_op(
    impl: str,
    case: Case,
    *,
    compile_mode: str | None = None,
    foreign: Callable[..., Any] | None = None,
) -> Callable[[Any, Any, Any], Any]:
    """y = op(x, weight, bias) for an implementation name (`foreign` is the callable of FOREIGN)."""
    groups, act = case.groups, case.act
    if impl == FOREIGN:
        if foreign is None:
            raise ValueError(f"implementation {FOREIGN!r} needs the callable (foreign=...)")
        return lambda x, w, b: foreign(x, groups, w, b, EPS, act)
    if impl not in IMPLS:
        raise ValueError(f"unknown implementation {impl!r}; expected one of {(*IMPLS, FOREIGN)}")
    if impl in PASSES:
        import gn_module

        passes = PASSES[impl]
        return lambda x, w, b: gn_module.group_norm(x, groups, w, b, EPS, act, passes=passes)
    if impl == "eager":
        return lambda x, w, b: reference(x, groups, w, b, act)
    import torch
    import torch._functorch.config as functorch_config

    # donated buffers forbid retain_graph=True in the timed backward (see module docstring).
    if hasattr(functorch_config, "donated_buffer"):
        functorch_config.donated_buffer = False
    # one compile per shape: drop earlier graphs so dynamo's recompile limit never falls back to eager.
    torch.compiler.reset()

    def fn(x: Any, w: Any, b: Any) -> Any:
        return reference(x, groups, w, b, act)

    return torch.compile(fn, dynamic=False, mode=compile_mode)


def prepare(
    impl: str,
    case: Case,
    dtype: str,
    direction: str,
    device: Any,
    *,
    compile_mode: str | None = None,
    seed: int = 0,
    foreign: Callable[..., Any] | None = None,
) -> Prepared:
    """Build inputs and the callable that the timer calls (see the module docstring for what it covers)."""
    import torch

    if direction not in ("fwd", "bwd"):
        raise ValueError(f"direction must be 'fwd' or 'bwd', got {direction!r}")
    x, weight, bias = make_inputs(case, dtype, device, seed=seed)
    if impl == "compile-nchw":
        x = x.contiguous()
    op = make_op(impl, case, compile_mode=compile_mode, foreign=foreign)
    plan = plan_info(impl, case, dtype, direction, x.device) if impl in PASSES else None
    if direction == "fwd":

        def forward() -> object:
            with torch.no_grad(), autocast_context(dtype, x.device):
                return op(x, weight, bias)

        return Prepared(forward, with_launch(plan, forward, direction), (x, weight, bias))
    leaves = tuple(t.requires_grad_() for t in (x, weight, bias))
    with autocast_context(dtype, x.device):
        y = op(*leaves)
    # the same logical dy for every impl (drawn channels_last), stored with y's strides
    gen = torch.Generator(device=y.device).manual_seed(seed + 1)
    drawn = torch.empty(x.shape, dtype=y.dtype, device=y.device, memory_format=_cl(x)).normal_(generator=gen)
    dy = torch.empty_like(y).copy_(drawn)

    def backward() -> object:
        return torch.autograd.grad(y, leaves, dy, retain_graph=True)

    return Prepared(backward, with_launch(plan, backward, direction), (*leaves, y, dy))


def with_launch(
    plan: dict[str, Any] | None, fn: Callable[[], object], direction: str
) -> dict[str, Any] | None:
    """Add what the kernels really launched for one call of `fn` (ours only; via ops.launch_record).

    Counts as a warm-up call. Errors are left for the timing to report.
    """
    if plan is None:
        return None
    try:
        from gn_module import ops

        with ops.launch_record() as record:
            fn()
        entry = record.get(direction)
    except Exception:
        return plan
    if isinstance(entry, dict):
        plan = {
            **plan,
            "launched": {k: v for k, v in entry.items() if isinstance(v, (int, float, str, bool))},
        }
    return plan


def _cl(x: Any) -> Any:
    import torch

    return torch.channels_last if x.dim() == 4 else torch.channels_last_3d


def _plan_dict(plan: Any) -> dict[str, Any]:
    return {f: getattr(plan, f) for f in PLAN_FIELDS if hasattr(plan, f)}


def plan_info(impl: str, case: Case, dtype: str, direction: str, device: Any) -> dict[str, Any] | None:
    """The launch plan our launcher uses for this call, or None when the launcher does not expose it.

    Defensive on purpose: `gn_module.ops` is written in parallel with this module. Tries
    ``ops.plan(shape, groups, dtype, direction, passes, device=...)`` (passes may be "auto"); when the
    planner rejects "auto", asks a schedule chooser named in AUTO_SCHEDULE_NAMES, then plans that.
    """
    try:
        from gn_module import ops
    except Exception:  # no extension, no toolkit: the timing itself reports the real error
        return None
    planner = getattr(ops, "plan", None)
    if planner is None:
        return None
    td = torch_dtype(dtype)

    wide = {"wide": torch_dtype("fp32")} if dtype in AUTOCAST_DTYPES else {}

    def make(schedule: Any) -> dict[str, Any]:
        return _plan_dict(planner(case.shape, case.groups, td, direction, schedule, device=device, **wide))

    passes = PASSES[impl]
    try:
        return make(passes)
    except Exception as exc:
        if passes != "auto":
            return {"schedule": passes, "plan_error": f"{type(exc).__name__}: {exc}"}
    for name in AUTO_SCHEDULE_NAMES:
        chooser = getattr(ops, name, None)
        if chooser is None:
            continue
        try:
            chosen = chooser(case.shape, case.groups, td, direction, device=device)
            if hasattr(chosen, "grid"):  # the chooser returned the plan itself
                return _plan_dict(chosen)
            return make(getattr(chosen, "schedule", chosen))
        except Exception:
            continue
    return None
