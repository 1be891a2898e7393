"""How much of a training step torch's GroupNorm takes: the time the swap can remove (issue 13).

Issue 13's model criterion: profile the unswapped step, sum the time of torch's GroupNorm kernels
including the layout copies torch makes for it, and require ``t_unswapped - t_swapped >= 0.7 x t_GN``.

Kernels are attributed by the CPU op that launched them, not by kernel name: everything launched inside
``aten::group_norm`` / ``aten::native_group_norm`` (forward) or the autograd node
``NativeGroupNormBackward0`` / ``aten::native_group_norm_backward`` (backward) counts, including the
``aten::contiguous``/``aten::copy_`` calls torch makes there (on CUDA a channels_last input is copied to
NCHW before the kernel; the backward copies the incoming gradient the same way) and autocast's fp32 cast
of the input. Names alone would miss those copies and would also catch LayerNorm, whose CUDA kernels share
names such as ``RowwiseMomentsCUDAKernel``; GroupNorm-looking kernels launched elsewhere are only reported
(``named_elsewhere_ms``). Not counted: copies the *next* op makes because GroupNorm returned NCHW fp32,
and the gradient's cast back to bf16 (a separate ``ToCopyBackward0`` node).

`gn_share` is pure: it takes profiler events (``torch.autograd.profiler_util.FunctionEvent`` or anything
with the same few attributes, as the CPU tests' synthetic events) and returns a `GnShare`. `profile_gn`
runs the profiler around a step function. On CUDA the time is the kernels' device time; on the CPU there
are no kernels, so it is the GroupNorm ops' CPU time instead (`GnShare.source` says which).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

#: The ops whose subtree is GroupNorm's: forward, then backward (the autograd node and the aten op).
FORWARD_OPS = frozenset({"aten::group_norm", "aten::native_group_norm"})
BACKWARD_OPS = frozenset({"NativeGroupNormBackward0", "aten::native_group_norm_backward"})
GN_OPS = FORWARD_OPS | BACKWARD_OPS
#: Ops inside a GroupNorm op that only copy: layout changes (contiguous) and autocast's dtype casts.
COPY_OPS = frozenset({"aten::contiguous", "aten::clone", "aten::copy_", "aten::to", "aten::_to_copy"})
#: Kernel names that look like torch's GroupNorm (ATen's group_norm_kernel.cu); a cross-check only.
GN_KERNEL_NAME = re.compile(
    r"group_?norm|RowwiseMoments|ComputeFusedParams|ComputeInternalGradients|ComputeBackwardFusedParams"
    r"|Compute1dBackwardFusedParams|GammaBetaBackward",
    re.IGNORECASE,
)

#: gn_module's own kernels (namespace gn): the swapped step's GroupNorm, launched outside any aten op.
OWN_KERNEL_NAME = re.compile(r"(^|[\s:(<])gn::|_ZN2gn")

#: The host side of a step: CUDA launch calls (runtime and driver API, as the profiler names them; Triton
#: launches through the driver) and gn_module's custom ops (what a torch.compile graph calls per GroupNorm).
LAUNCH_CALLS = frozenset(
    {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaLaunchCooperativeKernel",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cudaGraphLaunch",
    }
)
OWN_OPS = frozenset({"gn_module::group_norm_fwd", "gn_module::group_norm_bwd"})

DEVICE_SOURCE = "cuda kernels"  # device time of the kernels launched inside GroupNorm ops
CPU_SOURCE = "cpu ops"  # no kernels (CPU runs): the GroupNorm ops' own CPU time, children included
TOP_KERNELS = 8


class KernelRecord(Protocol):
    """A kernel attached to the CPU op that launched it (``torch.autograd.profiler_util.Kernel``)."""

    @property
    def name(self) -> str: ...

    @property
    def duration(self) -> float: ...  # microseconds


class OpEvent(Protocol):
    """The attributes of ``FunctionEvent`` that `gn_share` reads; times in microseconds."""

    @property
    def name(self) -> str: ...

    @property
    def cpu_parent(self) -> OpEvent | None: ...

    @property
    def cpu_children(self) -> Sequence[OpEvent]: ...

    @property
    def kernels(self) -> Sequence[KernelRecord]: ...

    @property
    def cpu_time_total(self) -> float: ...


@dataclass(frozen=True)
class GnShare:
    """GroupNorm's time per training step, in milliseconds, from `steps` profiled steps."""

    source: str  # DEVICE_SOURCE or CPU_SOURCE
    steps: int
    forward_ms: float  # forward GroupNorm ops, copies excluded
    backward_ms: float  # backward GroupNorm ops, copies excluded
    copy_ms: float  # layout copies and casts torch makes inside GroupNorm ops
    forward_calls: float  # GroupNorm forward calls per step
    backward_calls: float
    named_elsewhere_ms: float  # GroupNorm-looking kernels outside GroupNorm ops: not counted
    top_kernels: tuple[tuple[str, float], ...] = ()  # (kernel, ms per step), largest first
    # Of the whole trace, per step: every device event (kernels, copies, memsets) summed, an upper bound
    # of the time the GPU was busy (a step far longer than this waits on the host), and gn_module's own
    # kernels (the swapped step's GroupNorm). 0 without device events (CPU runs).
    device_ms: float = 0.0
    own_ms: float = 0.0
    own_launches: float = 0.0
    # The host side, per step: CUDA launch calls (LAUNCH_CALLS), and the calls of gn_module's custom ops
    # (OWN_OPS, outermost) with their CPU time, children included (under the profiler, so inflated).
    launch_calls: float = 0.0
    own_op_calls: float = 0.0
    own_op_host_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        """t_GN: what the criterion compares the saved time with."""
        return self.forward_ms + self.backward_ms + self.copy_ms

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "steps": self.steps,
            "total_ms": self.total_ms,
            "forward_ms": self.forward_ms,
            "backward_ms": self.backward_ms,
            "copy_ms": self.copy_ms,
            "forward_calls": self.forward_calls,
            "backward_calls": self.backward_calls,
            "named_elsewhere_ms": self.named_elsewhere_ms,
            "top_kernels": [{"name": n[:160], "ms": ms} for n, ms in self.top_kernels],
            "device_ms": self.device_ms,
            "own_ms": self.own_ms,
            "own_launches": self.own_launches,
            "launch_calls": self.launch_calls,
            "own_op_calls": self.own_op_calls,
            "own_op_host_ms": self.own_op_host_ms,
        }


def _inside(event: OpEvent, names: frozenset[str]) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in names:
            return True
        parent = parent.cpu_parent
    return False


def _inside_gn(event: OpEvent) -> bool:
    return _inside(event, GN_OPS)


def gn_roots(events: Iterable[OpEvent]) -> list[OpEvent]:
    """The outermost GroupNorm ops: autocast's aten::group_norm wraps another one, and
    NativeGroupNormBackward0 wraps aten::native_group_norm_backward; each is counted once."""
    return [e for e in events if e.name in GN_OPS and not _inside_gn(e)]


def _subtree(root: OpEvent) -> Iterator[tuple[OpEvent, bool]]:
    """Every op under `root` (itself included), with whether it is inside a copy op."""
    stack = [(root, False)]
    while stack:
        event, in_copy = stack.pop()
        yield event, in_copy
        stack += [(c, in_copy or c.name in COPY_OPS) for c in event.cpu_children]


def gn_share(events: Iterable[OpEvent], steps: int, source: str = DEVICE_SOURCE) -> GnShare:
    """GroupNorm's time per step in `events`, profiled over `steps` steps.

    With DEVICE_SOURCE, the device time of the kernels launched inside GroupNorm ops; with CPU_SOURCE,
    the GroupNorm ops' CPU time (copy ops: their own CPU time, counted once for nested copies)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if source not in (DEVICE_SOURCE, CPU_SOURCE):
        raise ValueError(f"source must be {DEVICE_SOURCE!r} or {CPU_SOURCE!r}, got {source!r}")
    events = list(events)
    us = {"forward": 0.0, "backward": 0.0, "copy": 0.0}
    calls = {"forward": 0, "backward": 0}
    kernels: Counter[str] = Counter()
    inside: set[int] = set()
    for root in gn_roots(events):
        kind = "forward" if root.name in FORWARD_OPS else "backward"
        calls[kind] += 1
        if source == CPU_SOURCE:
            copies = _outermost_copies(root)
            us["copy"] += sum(c.cpu_time_total for c in copies)
            us[kind] += root.cpu_time_total - sum(c.cpu_time_total for c in copies)
        for event, in_copy in _subtree(root):
            inside.add(id(event))
            for k in event.kernels:
                kernels[k.name] += k.duration
                if source == DEVICE_SOURCE:
                    us["copy" if in_copy else kind] += k.duration
    named_elsewhere = sum(
        k.duration for e in events if id(e) not in inside for k in e.kernels if GN_KERNEL_NAME.search(k.name)
    )
    per_step = 1e-3 / steps  # microseconds in total -> milliseconds per step
    device = [(e.name, device_us(e)) for e in events if is_device_event(e)]
    own = [us for name, us in device if OWN_KERNEL_NAME.search(name)]
    own_ops = [e for e in events if e.name in OWN_OPS and not _inside(e, OWN_OPS)]
    return GnShare(
        source=source,
        steps=steps,
        forward_ms=us["forward"] * per_step,
        backward_ms=us["backward"] * per_step,
        copy_ms=us["copy"] * per_step,
        forward_calls=calls["forward"] / steps,
        backward_calls=calls["backward"] / steps,
        named_elsewhere_ms=named_elsewhere * per_step,
        top_kernels=tuple((name, t * per_step) for name, t in kernels.most_common(TOP_KERNELS)),
        device_ms=sum(us for _, us in device) * per_step,
        own_ms=sum(own) * per_step,
        own_launches=len(own) / steps,
        launch_calls=sum(e.name in LAUNCH_CALLS for e in events) / steps,
        own_op_calls=len(own_ops) / steps,
        own_op_host_ms=sum(e.cpu_time_total for e in own_ops) * per_step,
    )


def is_device_event(event: OpEvent) -> bool:
    """A device-side event of the trace (its own FunctionEvent, device_type CUDA): kernels, copies."""
    kind = getattr(event, "device_type", None)
    return kind is not None and str(kind).rsplit(".", 1)[-1] in ("CUDA", "PrivateUse1", "XPU")


def device_us(event: Any) -> float:
    span = event.time_range
    return float(span.end - span.start)


def _outermost_copies(root: OpEvent) -> list[OpEvent]:
    """Copy ops under `root` with no copy op above them (contiguous > clone > copy_ counts once)."""
    found, stack = [], list(root.cpu_children)
    while stack:
        event = stack.pop()
        if event.name in COPY_OPS:
            found.append(event)
        else:
            stack += event.cpu_children
    return found


def profile_gn(step: Callable[[], object], steps: int, device: torch.device) -> GnShare:
    """Run `step` `steps` times under torch.profiler and return GroupNorm's share of it: kernel time on
    CUDA (CPU and CUDA activities: the CPU ops tell which kernels are GroupNorm's), op time on the CPU."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)  # every kernel finished before the trace is collected
    return gn_share(prof.events(), steps, DEVICE_SOURCE if cuda else CPU_SOURCE)
