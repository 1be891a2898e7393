"""`python -m gn_module.bench models`: a full training step, with and without `convert_groupnorm`.

One training step is: forward, loss, backward, optimizer step (AdamW), zero_grad. For each model and
precision (fp32, or bf16 autocast) three configurations run, each on a fresh model built with the same
seed and fed the same batch:

* ``channels_last`` and ``contiguous`` (NCHW): torch's own GroupNorm, model and inputs in that layout.
  The faster of the two is the *baseline*: what a user would run without us. The report says which.
  ``--baseline-layouts`` may name one of them (the settings record it): a compile row then compiles one
  baseline fewer.
* ``swapped``: ``convert_groupnorm(model)`` (``fuse_calls=True`` with ``--fuse-calls``), channels_last.

Each configuration runs W warm-up steps, then N timed steps in R rounds (``--rounds``). Eager rows keep
the three models alive and alternate them round by round (the configuration that goes first rotates), so
a drift of the GPU's clocks, of the host's speed or of its neighbours hits all three alike; compile rows
compile their configurations one after another (each cold: Inductor's caches off, one
``torch.compiler.reset()`` before the first), then alternate them in the same way (a recompile inside the
timed rounds is reported in the row). The step time is the median of the round medians; an eager row's speedup
criterion also gives the range and median of its per-round speedups (baseline / swapped of the same
round, a paired sample), which show how far a noisy host moved the verdict. On CUDA every step is
bracketed by CUDA events (a round's steps are queued back to back, as in training) and the peak memory is
``torch.cuda.max_memory_allocated`` over the configuration's timed steps, less the tensors (parameters,
AdamW state, batch) of the other configurations kept alive beside it; on the CPU (smoke tests) steps are
timed with ``time.perf_counter`` and there is no peak memory. With ``--compile`` the model is
``torch.compile``d (Inductor's caches off) and the wall time of the first step, which compiles the
forward and backward graphs, is reported as the compile time.

GroupNorm's share (``--profile-gn N``, default 3 steps; 0: off): after the timed rounds of an eager row,
the baseline runs N more steps under torch.profiler and `gn_module.bench.gn_share` sums torch's GroupNorm
time per step (t_GN: on CUDA the device time of the kernels launched inside GroupNorm's forward and
backward ops, their layout copies included; on the CPU the ops' CPU time). Issue 13's criterion is
``t_baseline - t_swapped >= 0.7 x t_GN``; the report checks it with the other model criteria (swap >= 1x
in eager, peak memory never above the baseline's, the ``vae`` model >= 1.6x in bf16 eager): PASS/MISS on
CUDA, "reported" (not judged) on the CPU. Compile rows are not profiled (Inductor fuses GroupNorm away).

Errors (an OOM, a model that fails to build or to compile) are caught per configuration and reported
in its row; the run goes on. Models whose package is missing are skipped with the reason.

Exit status: 0 after a run in which at least one row was measured (rows with errors included), criteria
missed or not; 1 when nothing could be measured; 2 for bad arguments; 3 when --device is CUDA and there
is none, or GN_EXPECT_GPU names another GPU (nothing is measured).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import json
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from gn_module import functional
from gn_module.bench.cli import EXIT_NO_CUDA, _csv
from gn_module.bench.gn_share import CPU_SOURCE, GnShare, profile_gn
from gn_module.bench.model_zoo import MODEL_NAMES, MODELS, Batch, ModelSpec, _error_text
from gn_module.bench.targets import TargetCheck, summarize_checks

EXIT_NOTHING_MEASURED = 1
PRECISIONS = ("fp32", "bf16")
#: Configurations measured for every row, in run order.
BASELINE_LAYOUTS = ("channels_last", "contiguous")
SWAPPED = "swapped"
CONFIGS = (*BASELINE_LAYOUTS, SWAPPED)
#: --gn-free: the swapped model (channels_last) with every GroupNorm replaced by identity, together with
#: the activation the swap fused into it; an activation the swap left alone stays. No GroupNorm, ours
#: included, can make the swapped step faster than this one.
GN_FREE = "gn_free"
#: --gn-free, bf16 rows whose swap keeps torch's dtypes (the defaults: float32 output under autocast): the
#: same with a cast to the dtype torch's GroupNorm returns in place of identity. Any GroupNorm with torch's
#: dtypes reads x and writes a float32 y there, so none can beat this step.
GN_FREE_DTYPES = "gn_free_dtypes"
GN_FREE_CONFIGS = (GN_FREE, GN_FREE_DTYPES)
LAYOUT_LABEL = {"channels_last": "CL", "contiguous": "NCHW"}
#: A baseline step this many times its GPU busy time or more waits on the host (`Row.host_bound`).
HOST_BOUND_RATIO = 1.5
DEFAULTS = {"steps": 20, "warmup": 5, "rounds": 5, "profile_gn": 3}
TINY_DEFAULTS = {"steps": 2, "warmup": 1, "rounds": 2, "profile_gn": 1}
SEED = 0
LR = 1e-4

#: Issue 13's model criteria. The swap must remove at least this fraction of torch's GroupNorm time:
#: (t_baseline - t_swapped) / t_GN.
GN_REMOVED_MIN = 0.7
#: Swapped step at least as fast as the baseline, every model and precision, eager.
EAGER_SPEEDUP_MIN = 1.0
#: Swapped step at least as fast as the baseline under torch.compile (issue 13: at least the UNet, bf16).
COMPILE_SPEEDUP_MIN = 1.0
#: The AutoencoderKL-style VAE (`vae`), bf16 eager.
VAE_BF16_SPEEDUP_MIN = 1.6
#: Peak memory with the swap / without it: never higher.
PEAK_RATIO_MAX = 1.0
#: Issue 13: where a measured physical limit is below a target, the target becomes this fraction of the
#: limit. The limit here is the GN-free bound (--gn-free): baseline ms / GN-free channels_last ms.
LIMIT_FRACTION = 0.9


# ---------------------------------------------------------------------------------------------
# Results


@dataclass
class Measurement:
    """One configuration of one row: times in milliseconds, memory in MiB."""

    config: str  # channels_last | contiguous | swapped
    median_ms: float | None = None
    q1_ms: float | None = None
    q3_ms: float | None = None
    min_ms: float | None = None
    times_ms: list[float] = field(default_factory=list)
    round_ms: list[float] = field(default_factory=list)  # each round's median; median_ms is their median
    peak_mib: float | None = None
    first_step_s: float | None = None  # wall time of the first step; with --compile, the compile time
    first_loss: float | None = None
    last_loss: float | None = None
    conversion: dict[str, int] | None = None  # swapped/fused/already/skipped counts (swapped config)
    rewritten: int | None = None  # forwards rewritten by fuse_calls
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.median_ms is not None


def choose_baseline(measurements: Mapping[str, Measurement]) -> str | None:
    """The faster of the measured baseline layouts (ties: channels_last); None when neither ran."""
    timed = [
        (m.median_ms, BASELINE_LAYOUTS.index(layout))
        for layout, m in measurements.items()
        if layout in BASELINE_LAYOUTS and m.ok
    ]
    return BASELINE_LAYOUTS[min(timed)[1]] if timed else None


@dataclass
class Row:
    model: str
    precision: str
    compiled: bool
    batch: int
    measurements: dict[str, Measurement] = field(default_factory=dict)
    gn: GnShare | None = None  # torch's GroupNorm in the baseline's step (eager rows, --profile-gn)
    gn_error: str | None = None  # why profiling failed
    recompiled: bool = False  # compile rows: dynamo compiled a graph inside the timed rounds
    # the swapped step profiled the same way: gn_module's own kernel time and the GPU's busy time
    gn_swapped: GnShare | None = None
    # compile rows (--profile-gn): each configuration's compiled step profiled, for its GPU busy time
    busy: dict[str, GnShare] = field(default_factory=dict)
    # (--profile-gn) the host's time to issue one step, per configuration (`host_submit_ms`)
    host_ms: dict[str, float] = field(default_factory=dict)

    @property
    def baseline_busy(self) -> GnShare | None:
        """The baseline step's profile: `gn` (eager rows), or the compiled baseline layout's."""
        if self.gn is not None:
            return self.gn
        layout = self.baseline_layout
        return self.busy.get(layout) if layout else None

    @property
    def baseline_layout(self) -> str | None:
        return choose_baseline(self.measurements)

    @property
    def baseline(self) -> Measurement | None:
        layout = self.baseline_layout
        return self.measurements[layout] if layout else None

    @property
    def swapped(self) -> Measurement | None:
        m = self.measurements.get(SWAPPED)
        return m if m is not None and m.ok else None

    @property
    def speedup(self) -> float | None:
        base, ours = self.baseline, self.swapped
        if base is None or ours is None or not ours.median_ms:
            return None
        return base.median_ms / ours.median_ms

    @property
    def round_speedups(self) -> list[float]:
        """baseline / swapped of each round (the configurations take turns round by round, compile rows
        too since session 37, so a round's two medians were measured moments apart). Their spread shows
        how far the host's or the GPU's noise moved the row; empty for rows that did not finish."""
        base, ours = self.baseline, self.swapped
        if base is None or ours is None or len(base.round_ms) != len(ours.round_ms):
            return []
        return [b / s for b, s in zip(base.round_ms, ours.round_ms, strict=True) if s]

    def _bound(self, config: str) -> float | None:
        base, free = self.baseline, self.measurements.get(config)
        if base is None or free is None or not free.ok or not free.median_ms:
            return None
        return base.median_ms / free.median_ms

    @property
    def gn_free_bound(self) -> float | None:
        """baseline ms / GN-free ms: the most a GroupNorm swapped in on channels_last can give (--gn-free).
        The lower of the measured bounds: the one with torch's dtypes is only measured where the swap keeps
        them, and there it is the limit."""
        limit = self.gn_free_limit
        return None if limit is None else self._bound(limit)

    @property
    def gn_free_limit(self) -> str | None:
        """Which GN-free configuration sets `gn_free_bound`."""
        bounds = [(b, c) for c in GN_FREE_CONFIGS if (b := self._bound(c)) is not None]
        return min(bounds)[1] if bounds else None

    @property
    def saved_ms(self) -> float | None:
        """t_baseline - t_swapped: the time the swap saves per step."""
        base, ours = self.baseline, self.swapped
        return None if base is None or ours is None else base.median_ms - ours.median_ms

    @property
    def gn_share(self) -> float | None:
        """t_GN / t_baseline: the fraction of the baseline's step in torch's GroupNorm."""
        base = self.baseline
        if self.gn is None or base is None or not base.median_ms:
            return None
        return self.gn.total_ms / base.median_ms

    @property
    def gn_removed(self) -> float | None:
        """saved / t_GN: the fraction of torch's GroupNorm time the swap removed (criterion: >= 0.7)."""
        saved = self.saved_ms
        return None if saved is None or self.gn is None or not self.gn.total_ms else saved / self.gn.total_ms

    @property
    def busy_speedup(self) -> float | None:
        """GPU busy time of the baseline step / of the swapped step: what the swap does to the device's
        work, whatever the host adds (the wall-time speedup of a host-bound step compares host time)."""
        base = self.baseline_busy
        if base is None or self.gn_swapped is None or not self.gn_swapped.device_ms:
            return None
        return base.device_ms / self.gn_swapped.device_ms

    @property
    def host_bound(self) -> bool | None:
        """Whether the baseline step takes HOST_BOUND_RATIO times its GPU busy time or more (it waits on
        the host: its wall-time speedup says little about the kernels)."""
        base, busy = self.baseline, self.baseline_busy
        if base is None or busy is None or not busy.device_ms:
            return None
        return base.median_ms >= HOST_BOUND_RATIO * busy.device_ms

    @property
    def errors(self) -> dict[str, str]:
        return {k: m.error for k, m in self.measurements.items() if m.error}

    def as_dict(self) -> dict[str, Any]:
        base, ours = self.baseline, self.swapped
        conv = (self.measurements.get(SWAPPED) or Measurement(SWAPPED)).conversion or {}
        return {
            "model": self.model,
            "precision": self.precision,
            "mode": "compile" if self.compiled else "eager",
            "batch": self.batch,
            "baseline_layout": self.baseline_layout,
            "baseline_ms": base.median_ms if base else None,
            "swapped_ms": ours.median_ms if ours else None,
            "speedup": self.speedup,
            "round_speedups": self.round_speedups,
            "busy_speedup": self.busy_speedup,
            "host_bound": self.host_bound,
            "gn_free_ms": (self.measurements[GN_FREE].median_ms if GN_FREE in self.measurements else None),
            "gn_free_dtypes_ms": (
                self.measurements[GN_FREE_DTYPES].median_ms if GN_FREE_DTYPES in self.measurements else None
            ),
            "gn_free_bound": self.gn_free_bound,
            "gn_free_limit": self.gn_free_limit,
            "baseline_peak_mib": base.peak_mib if base else None,
            "swapped_peak_mib": ours.peak_mib if ours else None,
            "baseline_compile_s": base.first_step_s if base and self.compiled else None,
            "swapped_compile_s": ours.first_step_s if ours and self.compiled else None,
            "swapped": conv.get("swapped"),
            "fused": conv.get("fused"),
            "gn_ms": self.gn.total_ms if self.gn else None,
            "gn_share": self.gn_share,
            "saved_ms": self.saved_ms,
            "saved_over_gn": self.gn_removed,
            "gn_source": self.gn.source if self.gn else None,
            "gn_profile": self.gn.as_dict() if self.gn else None,
            "gn_error": self.gn_error,
            "recompiled": self.recompiled,
            "baseline_device_ms": self.baseline_busy.device_ms if self.baseline_busy else None,
            "swapped_device_ms": self.gn_swapped.device_ms if self.gn_swapped else None,
            "ours_gn_ms": self.gn_swapped.own_ms if self.gn_swapped else None,
            "swapped_profile": self.gn_swapped.as_dict() if self.gn_swapped else None,
            "host_ms": dict(self.host_ms),
            "errors": self.errors,
            "measurements": {k: asdict(m) for k, m in self.measurements.items()},
        }


# ---------------------------------------------------------------------------------------------
# Timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step: Callable[[], object], n: int, device: torch.device) -> list[float]:
    """Milliseconds of each of ``n`` consecutive calls of ``step``: CUDA events around each call on
    CUDA (queued back to back, one synchronize at the end), ``time.perf_counter`` elsewhere."""
    if device.type == "cuda":
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)
        ]
        for start, end in events:
            start.record()
            step()
            end.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) for start, end in events]
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def host_submit_ms(step: Callable[[], object], n: int, device: torch.device) -> float:
    """The host's time to issue one step: the median over ``n`` steps of the wall time from an idle GPU
    (synchronized) until ``step`` returns, before its kernels finish. A step that takes longer than its
    GPU busy time and about this long waits on the host. (A step that fills the launch queue or
    synchronizes inside would wait on the GPU here too; the training steps do neither.)"""
    times = []
    for _ in range(max(1, n)):
        _sync(device)
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    _sync(device)
    return statistics.median(times)


def _quartiles(values: Sequence[float]) -> tuple[float, float]:
    from gn_module.bench.timing import quantile

    ordered = sorted(values)
    return quantile(ordered, 0.25), quantile(ordered, 0.75)


def round_sizes(steps: int, rounds: int) -> list[int]:
    """``steps`` timed steps split into at most ``rounds`` rounds, as evenly as possible."""
    rounds = min(rounds, steps)
    base, extra = divmod(steps, rounds)
    return [base + (i < extra) for i in range(rounds)]


@dataclass(frozen=True)
class Settings:
    steps: int = DEFAULTS["steps"]
    warmup: int = DEFAULTS["warmup"]
    rounds: int = DEFAULTS["rounds"]
    profile_gn: int = DEFAULTS["profile_gn"]  # profiled steps of the baseline per eager row; 0: off
    tiny: bool = False
    fuse_calls: bool = False
    autocast_output: str = "float32"  # convert_groupnorm's: "input" keeps bf16 under autocast
    batch: int | None = None  # None: each model's own
    gn_free: bool = False  # eager rows also time GN_FREE (and GN_FREE_DTYPES where `gn_free_configs` says)
    compile_backend: str = "inductor"
    compile_mode: str | None = None
    seed: int = SEED
    # torch's layouts timed as baselines (--baseline-layouts): both by default; one saves a cold compile
    baseline_layouts: tuple[str, ...] = BASELINE_LAYOUTS


def gn_free_configs(settings: Settings, precision: str) -> tuple[str, ...]:
    """The GN-free configurations an eager row times: none without --gn-free; GN_FREE; and GN_FREE_DTYPES in
    the bf16 rows whose swap keeps torch's dtypes (in fp32 the cast is identity)."""
    if not settings.gn_free:
        return ()
    keeps_dtypes = settings.autocast_output == "float32"
    return (GN_FREE, GN_FREE_DTYPES) if keeps_dtypes and precision == "bf16" else (GN_FREE,)


def batch_size(spec: ModelSpec, settings: Settings) -> int:
    if settings.batch is not None:
        return settings.batch
    return spec.tiny_batch if settings.tiny else spec.batch


def _to_device(batch: Batch, device: torch.device, fmt: torch.memory_format) -> Batch:
    return {
        k: v.to(device).contiguous(memory_format=fmt) if v.dim() == 4 else v.to(device)
        for k, v in batch.items()
    }


@contextlib.contextmanager
def _compile_context(compiled: bool) -> Iterator[None]:
    if not compiled:
        yield
        return
    torch.compiler.reset()
    import torch._inductor.config as inductor_config

    # Cold compiles for every configuration: no FX-graph/autotune cache hits from earlier ones or runs.
    with inductor_config.patch(force_disable_caches=True), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")
        yield
    torch.compiler.reset()


def _storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


@dataclass
class Trainer:
    """One configuration of a row, built and warmed up, and what its timed rounds found."""

    m: Measurement
    step: Callable[[], torch.Tensor] | None = None  # None once it failed (or before it was built)
    own_bytes: int = 0  # its parameters, AdamW state and batch: held while the others run
    peak_bytes: int = 0  # max_memory_allocated over its rounds, less the others' own_bytes
    last_loss: torch.Tensor | None = None


def prepare(
    spec: ModelSpec,
    config: str,
    precision: str,
    compiled: bool,
    batch_cpu: Batch,
    device: torch.device,
    settings: Settings,
) -> Trainer:
    """Build a fresh model (seeded) for ``config`` and run its first and warm-up steps. Any exception
    becomes the measurement's error and leaves the trainer without a step."""
    t = Trainer(Measurement(config))
    try:
        t.step, t.own_bytes = _build(spec, t.m, precision, compiled, batch_cpu, device, settings)
    except Exception as exc:  # OOM, build or compile failures: reported in the row
        t.m.error = _error_text(exc)
        _free(device)  # before the next configuration is built beside it
    return t


def _build(
    spec: ModelSpec,
    m: Measurement,
    precision: str,
    compiled: bool,
    batch_cpu: Batch,
    device: torch.device,
    settings: Settings,
) -> tuple[Callable[[], torch.Tensor], int]:
    from gn_module.convert import convert_groupnorm

    torch.manual_seed(settings.seed)
    model = spec.build(settings.tiny)
    model.train()
    if m.config == SWAPPED:
        model, report = convert_groupnorm(
            model, fuse_calls=settings.fuse_calls, autocast_output=settings.autocast_output
        )
        m.conversion, m.rewritten = report.summary(), len(report.rewritten)
    elif m.config in GN_FREE_CONFIGS:
        model = gn_free_model(model, settings, torch_dtypes=m.config == GN_FREE_DTYPES)
    fmt = torch.contiguous_format if m.config == "contiguous" else torch.channels_last
    model = model.to(device).to(memory_format=fmt)
    batch = _to_device(batch_cpu, device, fmt)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    dtype = torch.bfloat16 if precision == "bf16" else None
    run = (
        torch.compile(model, backend=settings.compile_backend, mode=settings.compile_mode)
        if compiled
        else model
    )

    def step() -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = spec.loss(run, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    _sync(device)
    t0 = time.perf_counter()
    m.first_loss = float(step())  # synchronizes
    m.first_step_s = time.perf_counter() - t0
    for _ in range(settings.warmup - 1):
        step()
    _sync(device)
    state = (v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    own = _storage_bytes([*model.parameters(), *model.buffers(), *state, *batch.values()])
    return step, own


class TorchDtypeCast(torch.nn.Module):
    """x in the dtype torch's GroupNorm would return, and nothing else: CUDA's autocast runs group_norm
    in float32, so there a float16/bfloat16 x becomes float32; otherwise (the CPU's autocast has no
    float32 rule for it) x itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in (torch.float16, torch.bfloat16) and x.is_cuda and torch.is_autocast_enabled("cuda"):
            return x.float()
        return x


def gn_free_model(model: torch.nn.Module, settings: Settings, torch_dtypes: bool = False) -> torch.nn.Module:
    """The swapped model (`convert_groupnorm` with ``settings``' options) with its GroupNorms costing
    nothing (`without_groupnorm`): an activation the swap fused into a GroupNorm goes with it, since
    the swapped step runs it in the GroupNorm's kernel; one the swap left alone stays."""
    from gn_module.convert import convert_groupnorm

    model, _ = convert_groupnorm(
        model, fuse_calls=settings.fuse_calls, autocast_output=settings.autocast_output
    )
    return without_groupnorm(model, torch_dtypes)


def without_groupnorm(model: torch.nn.Module, torch_dtypes: bool = False) -> torch.nn.Module:
    """``model`` with every GroupNorm (subclasses included) replaced by identity (``torch_dtypes``: by
    `TorchDtypeCast`), followed by its own activation module where it has one (timm's GroupNormAct:
    ``.act``), in place. On a converted model ours go with the activations fused into them: their ``act``
    is a name, not a module, and the slot the swap left is an identity."""
    for name, child in list(model.named_children()):
        if isinstance(child, torch.nn.GroupNorm):
            act = getattr(child, "act", None)
            stand_in: list[torch.nn.Module] = [TorchDtypeCast()] if torch_dtypes else []
            stand_in += [act] if isinstance(act, torch.nn.Module) else []
            if len(stand_in) > 1:
                setattr(model, name, torch.nn.Sequential(*stand_in))
            else:
                setattr(model, name, stand_in[0] if stand_in else torch.nn.Identity())
        else:
            without_groupnorm(child, torch_dtypes)
    return model


def _timed_round(t: Trainer, n: int, others_bytes: int, device: torch.device) -> None:
    assert t.step is not None
    step = t.step
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses: list[torch.Tensor] = []
    times = time_steps(lambda: losses.append(step()), n, device)
    if device.type == "cuda":
        t.peak_bytes = max(t.peak_bytes, torch.cuda.max_memory_allocated(device) - others_bytes)
    t.m.times_ms += times
    t.m.round_ms.append(statistics.median(times))
    t.last_loss = losses[-1]


def time_rounds(trainers: Sequence[Trainer], settings: Settings, device: torch.device) -> None:
    """The timed steps of every trainer with a step, in rounds: in each round every trainer runs its
    share of the steps back to back, and the trainer that goes first rotates. A trainer that fails
    drops out with its error; the others go on."""
    for r, n in enumerate(round_sizes(settings.steps, settings.rounds)):
        live = [t for t in trainers if t.step is not None]
        first = r % len(live) if live else 0
        for t in live[first:] + live[:first]:
            others = sum(o.own_bytes for o in trainers if o is not t and o.step is not None)
            try:
                _timed_round(t, n, others, device)
            except Exception as exc:  # an OOM: reported in the row
                t.m.error, t.step = _error_text(exc), None
                gc.collect()


def finish(t: Trainer, device: torch.device) -> Measurement:
    """The trainer's measurement with its statistics; frees its model."""
    m = t.m
    if m.error is None and m.round_ms:
        m.median_ms = statistics.median(m.round_ms)
        m.q1_ms, m.q3_ms = _quartiles(m.times_ms)
        m.min_ms = min(m.times_ms)
        m.last_loss = float(t.last_loss) if t.last_loss is not None else None
        m.peak_mib = t.peak_bytes / 2**20 if device.type == "cuda" else None
    else:
        m.times_ms, m.round_ms = [], []
    t.step, t.last_loss = None, None
    return m


def _compiled_graphs() -> int:
    """How many graphs dynamo has compiled in this process (its counters)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_row(
    spec: ModelSpec,
    precision: str,
    compiled: bool,
    device: torch.device,
    settings: Settings,
    log: Callable[[str], None] = print,
) -> Row:
    """The three configurations of one (model, precision, mode), on the same seeded batch: eager rows
    interleaved round by round, then the baseline profiled (--profile-gn); compile rows compiled one by
    one, then interleaved too."""
    n = batch_size(spec, settings)
    gen = torch.Generator().manual_seed(settings.seed)
    batch_cpu = spec.make_batch(settings.tiny, n, gen)
    row = Row(spec.name, precision, compiled, n)
    mode = "compile" if compiled else "eager"

    def done(t: Trainer) -> None:
        row.measurements[t.m.config] = m = finish(t, device)
        log(f"{spec.name:24} {precision} {mode:7} {m.config:13} {_measurement_text(m, compiled)}")

    if compiled:
        # Each configuration compiles cold (Inductor's caches off, one torch.compiler.reset() before the
        # first), then they take turns as the eager rows do: a compiled step that waits on the host
        # moves with the host's speed, which drifts over the minutes of compiling (session 37).
        with _compile_context(True):
            configs = (*settings.baseline_layouts, SWAPPED)
            trainers = [prepare(spec, c, precision, True, batch_cpu, device, settings) for c in configs]
            graphs = _compiled_graphs()
            time_rounds(trainers, settings, device)
            row.recompiled = _compiled_graphs() != graphs  # (then the rounds timed a compile)
            if row.recompiled:
                log(f"{spec.name:24} {precision} {mode:7} WARNING: recompiled during the timed rounds")
            for t in trainers:
                config = t.m.config
                if settings.profile_gn and t.step is not None:  # GPU busy: does the step wait on the host?
                    try:
                        row.busy[config] = profile_gn(t.step, settings.profile_gn, device)
                        row.host_ms[config] = host_submit_ms(t.step, settings.profile_gn, device)
                    except Exception as exc:
                        row.gn_error = f"{config} step: {_error_text(exc)}"
                done(t)
            del trainers
        _free(device)
        row.gn_swapped = row.busy.get(SWAPPED)
        if row.baseline_busy is not None and row.gn_swapped is not None:
            log(f"{spec.name:24} {precision} {mode:7} {'GPU busy':13} {_busy_text(row)}")
        return row

    configs = (*settings.baseline_layouts, SWAPPED, *gn_free_configs(settings, precision))
    trainers = [prepare(spec, c, precision, False, batch_cpu, device, settings) for c in configs]
    time_rounds(trainers, settings, device)
    steps = {t.m.config: t.step for t in trainers}  # finish() drops them; profiling needs one
    for t in trainers:
        done(t)
    layout = row.baseline_layout
    if settings.profile_gn and layout is not None and steps[layout] is not None:
        try:
            row.gn = profile_gn(steps[layout], settings.profile_gn, device)
            log(f"{spec.name:24} {precision} {mode:7} {'GroupNorm':13} {_gn_text(row)}")
        except Exception as exc:  # the profiler itself failing: reported, the timings stand
            row.gn_error = _error_text(exc)
            log(f"{spec.name:24} {precision} {mode:7} {'GroupNorm':13} ERROR {row.gn_error}")
        # The swapped step too: is it waiting on the host (GPU busy far below the step) or on kernels?
        if row.gn is not None and steps.get(SWAPPED) is not None:
            try:
                row.gn_swapped = profile_gn(steps[SWAPPED], settings.profile_gn, device)
                for config in (layout, SWAPPED):
                    row.host_ms[config] = host_submit_ms(steps[config], settings.profile_gn, device)
                log(f"{spec.name:24} {precision} {mode:7} {'GPU busy':13} {_busy_text(row)}")
            except Exception as exc:
                row.gn_error = f"swapped step: {_error_text(exc)}"
    del trainers, steps
    _free(device)
    return row


def _busy_text(row: Row) -> str:
    base, ours = row.baseline_busy, row.gn_swapped
    assert base is not None and ours is not None
    torch_gn = f" (torch's GroupNorm {base.total_ms:.2f})" if row.gn is not None else ""
    text = (
        f"baseline {base.device_ms:.2f} ms of device time per step{torch_gn}, "
        f"swapped {ours.device_ms:.2f} ms (gn_module's kernels {ours.own_ms:.2f} ms, "
        f"{ours.own_launches:g} launches)"
    )
    host = _host_text(row)
    return f"{text}; {host}" if host else text


def _host_text(row: Row) -> str:
    """The host side: each step's issue time, launch calls, and the custom ops' calls and CPU time."""
    base, ours = row.baseline_busy, row.gn_swapped
    layout = row.baseline_layout
    if base is None or ours is None or layout not in row.host_ms or SWAPPED not in row.host_ms:
        return ""
    ops = f", {ours.own_op_calls:g} custom op calls {ours.own_op_host_ms:.2f} ms" if ours.own_op_calls else ""
    return (
        f"host issues the baseline step in {row.host_ms[layout]:.2f} ms "
        f"({base.launch_calls:g} launch calls), the swapped in {row.host_ms[SWAPPED]:.2f} ms "
        f"({ours.launch_calls:g}{ops})"
    )


def _gn_text(row: Row) -> str:
    gn = row.gn
    assert gn is not None
    text = (
        f"{gn.total_ms:9.2f} ms per step ({gn.source}: fwd {gn.forward_ms:.2f}, bwd {gn.backward_ms:.2f}, "
        f"copies {gn.copy_ms:.2f}; {gn.forward_calls:g} fwd calls)"
    )
    if row.gn_share is not None:
        text += f"  {row.gn_share:.0%} of the baseline step"
    if row.gn_removed is not None:
        text += f"  saved/GN {row.gn_removed:.2f}"
    if gn.named_elsewhere_ms:  # LayerNorm's kernels share names; anything else is worth a look
        text += (
            f"  (GroupNorm-like kernels outside GroupNorm ops, not counted: {gn.named_elsewhere_ms:.2f} ms)"
        )
    return text


def _measurement_text(m: Measurement, compiled: bool) -> str:
    if m.error:
        return f"ERROR {m.error}"
    text = f"{m.median_ms:9.2f} ms (iqr {m.q3_ms - m.q1_ms:.2f}, n={len(m.times_ms)})"
    if m.peak_mib is not None:
        text += f"  peak {m.peak_mib:8.0f} MiB"
    text += f"  {'compile' if compiled else 'first step'} {m.first_step_s:.2f} s  loss {m.first_loss:.4g}"
    if m.conversion:
        text += f"  swapped {m.conversion['swapped']} fused {m.conversion['fused']}"
    return text


# ---------------------------------------------------------------------------------------------
# Reports


def check_criteria(rows: Sequence[Row], judged: bool = True) -> list[TargetCheck]:
    """Issue 13's model criteria for every row they apply to (TargetCheck: case = model, dtype =
    precision, direction = mode). ``judged=False`` (CPU runs): reported, neither PASS nor MISS."""
    checks: list[TargetCheck] = []
    for r in rows:
        mode = "compile" if r.compiled else "eager"
        where = (r.model, r.precision, mode)

        def add(
            target: str, value: float | None, threshold: float, higher: bool = True, note: str = ""
        ) -> None:
            checks.append(TargetCheck(*where, target, value, threshold, higher, judged, note))  # noqa: B023

        if not r.compiled:
            add("saved / t_GN", r.gn_removed, GN_REMOVED_MIN)
            add(*_speedup_target("speedup", r, EAGER_SPEEDUP_MIN))
            if r.model == "vae" and r.precision == "bf16":
                add(*_speedup_target("speedup (AutoencoderKL-style VAE, bf16)", r, VAE_BF16_SPEEDUP_MIN))
        else:
            add("speedup", r.speedup, COMPILE_SPEEDUP_MIN)
        base, ours = r.baseline, r.swapped
        peaks = (base.peak_mib, ours.peak_mib) if base and ours else (None, None)
        ratio = peaks[1] / peaks[0] if None not in peaks and peaks[0] else None
        cl, note = r.measurements.get("channels_last"), ""
        if r.baseline_layout == "contiguous" and ours and ours.peak_mib and cl and cl.ok and cl.peak_mib:
            # the swap runs channels_last: how much of a NCHW baseline's ratio is that layout's (not judged)
            note = f"swapped / channels_last baseline {ours.peak_mib / cl.peak_mib:.4f}"
        add("peak memory swapped / baseline", ratio, PEAK_RATIO_MAX, higher=False, note=note)
    return checks


def _speedup_target(target: str, r: Row, minimum: float) -> tuple[str, float | None, float, bool, str]:
    """(target, value, threshold, higher, note) of a speedup criterion: ``minimum``, or LIMIT_FRACTION of
    the row's GN-free bound where that is lower (the measured limit; said in the target's name). The note
    gives the per-round speedups' range, so a verdict the noise decided can be told apart."""
    rounds = r.round_speedups
    note = ""
    if len(rounds) > 1:
        note = f"per round {min(rounds):.2f}-{max(rounds):.2f}, median {statistics.median(rounds):.2f}"
    bound = r.gn_free_bound
    if bound is not None and LIMIT_FRACTION * bound < minimum:
        limited = round(LIMIT_FRACTION * bound, 3)
        kind = " (torch's dtypes)" if r.gn_free_limit == GN_FREE_DTYPES else ""
        return (
            f"{target}, {LIMIT_FRACTION:g} x the GN-free{kind} bound {bound:.2f}x (target {minimum:g})",
            r.speedup,
            limited,
            True,
            note,
        )
    return target, r.speedup, minimum, True, note


@dataclass
class ModelsReport:
    date: str
    command: str
    device: dict[str, Any]
    settings: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # model -> reason

    @property
    def checks(self) -> list[TargetCheck]:
        """The model criteria; judged on CUDA only (CPU smoke runs time other things)."""
        return check_criteria(self.rows, judged=bool(self.device.get("cuda")))

    def as_dict(self) -> dict[str, Any]:
        checks = self.checks
        return {
            "date": self.date,
            "command": self.command,
            "device": self.device,
            "settings": self.settings,
            "rows": [r.as_dict() for r in self.rows],
            "skipped": self.skipped,
            "criteria": [c.as_dict() for c in checks],
            "criteria_summary": summarize_checks(checks),
        }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _profiled(rows: Sequence[Row]) -> bool:
    return any(r.gn is not None or r.gn_swapped is not None or r.gn_error for r in rows)


def table(rows: Sequence[Row]) -> tuple[list[str], list[list[str]]]:
    compiled = any(r.compiled for r in rows)
    profiled = _profiled(rows)
    hosted = any(r.host_ms for r in rows)
    gn_free = any(GN_FREE in r.measurements for r in rows)
    gn_free_dtypes = any(GN_FREE_DTYPES in r.measurements for r in rows)
    header = [
        "model",
        "precision",
        "mode",
        "baseline layout",
        "baseline ms",
        "other layout ms",
        "swapped ms",
        "speedup",
    ]
    if gn_free:
        header += ["GN-free CL ms", *(["GN-free dtypes CL ms"] if gn_free_dtypes else []), "GN-free bound"]
    if profiled:
        header += ["GN ms", "GN share", "saved ms", "saved/GN", "ours GN ms", "GPU busy ms baseline/swapped"]
        header += ["GPU-busy speedup"]
    if hosted:
        header += ["host issue ms baseline/swapped", "launch calls baseline/swapped"]
    header += ["peak MiB baseline", "peak MiB swapped", "swapped/fused"]
    if compiled:
        header += ["compile s baseline", "compile s swapped"]
    body = []
    for r in rows:
        layout, base, ours = r.baseline_layout, r.baseline, r.swapped
        other = (
            next((r.measurements.get(k) for k in BASELINE_LAYOUTS if k != layout), None) if layout else None
        )
        conv = (r.measurements.get(SWAPPED) or Measurement(SWAPPED)).conversion
        cells = [
            r.model,
            r.precision,
            "compile" if r.compiled else "eager",
            LAYOUT_LABEL[layout] if layout else "error",
            _ms(base.median_ms if base else None),
            _ms(other.median_ms if other is not None and other.ok else None),
            _ms(ours.median_ms if ours else None) if ours else "error",
            "-" if r.speedup is None else f"{r.speedup:.2f}x",
        ]
        if gn_free:
            for config in (GN_FREE, GN_FREE_DTYPES) if gn_free_dtypes else (GN_FREE,):
                free = r.measurements.get(config)
                cells.append(
                    _ms(free.median_ms)
                    if free is not None and free.ok
                    else ("error" if free is not None else "-")
                )
            cells.append("-" if r.gn_free_bound is None else f"{r.gn_free_bound:.2f}x")
        if profiled:
            cells += [
                _ms(r.gn.total_ms) if r.gn else ("error" if r.gn_error else "-"),
                "-" if r.gn_share is None else f"{r.gn_share:.0%}",
                _ms(r.saved_ms) if r.gn else "-",
                "-" if r.gn_removed is None else f"{r.gn_removed:.2f}",
                _ms(r.gn_swapped.own_ms) if r.gn_swapped else "-",
                f"{r.baseline_busy.device_ms:.2f}/{r.gn_swapped.device_ms:.2f}"
                if r.baseline_busy and r.gn_swapped
                else "-",
                "-"
                if r.busy_speedup is None
                else f"{r.busy_speedup:.2f}x" + (" host-bound" * bool(r.host_bound)),
            ]
        if hosted:
            base_host = r.host_ms.get(layout) if layout else None
            ours_host = r.host_ms.get(SWAPPED)
            base_busy, ours_busy = r.baseline_busy, r.gn_swapped
            cells += [
                f"{_ms(base_host)}/{_ms(ours_host)}" if base_host or ours_host else "-",
                f"{base_busy.launch_calls:g}/{ours_busy.launch_calls:g}" if base_busy and ours_busy else "-",
            ]
        cells += [
            _mib(base.peak_mib if base else None),
            _mib(ours.peak_mib if ours else None),
            f"{conv['swapped']}/{conv['fused']}" if conv else "-",
        ]
        if compiled:
            cells += [
                f"{base.first_step_s:.1f}" if base and r.compiled else "-",
                f"{ours.first_step_s:.1f}" if ours and r.compiled else "-",
            ]
        body.append(cells)
    return header, body


def _baseline_text(layouts: Sequence[str]) -> str:
    """What the baseline is in this run: the faster of both layouts, or the one --baseline-layouts named."""
    if len(layouts) > 1:
        return (
            "Baseline = the faster of channels_last (CL) and NCHW with torch's GroupNorm (`other layout ms` "
            "is the slower);"
        )
    only = LAYOUT_LABEL[layouts[0]]
    return f"Baseline = {only} with torch's GroupNorm (the only layout timed: --baseline-layouts);"


def _notes(report: ModelsReport) -> list[str]:
    lines = [f"{name}: skipped, {why}" for name, why in report.skipped.items()]
    for r in report.rows:
        mode = "compile" if r.compiled else "eager"
        lines += [f"{r.model} {r.precision} {mode} {cfg}: {err}" for cfg, err in r.errors.items()]
        if r.gn_error:
            lines.append(f"{r.model} {r.precision} {mode} GroupNorm profile: {r.gn_error}")
    return lines


def _gn_source_line(rows: Sequence[Row]) -> str | None:
    """What "GN ms" is in this run: kernel time on CUDA, CPU op time on the CPU."""
    shares = [r.gn for r in rows if r.gn is not None]
    if not shares:
        return None
    what = (
        "CPU time of torch's GroupNorm ops (CPU run: no kernels; not comparable with GPU runs)"
        if shares[0].source == CPU_SOURCE
        else "device time of the CUDA kernels launched inside torch's GroupNorm ops, forward and backward, "
        "their layout copies and casts included"
    )
    n = shares[0].steps
    return (
        f"GN ms: {what}, per step of the baseline, from {n} profiled step{'s' * (n != 1)}. "
        "GN share = GN ms / baseline ms; saved ms = baseline ms - swapped ms; "
        f"criterion saved/GN >= {GN_REMOVED_MIN}. ours GN ms: gn_module's kernels in the swapped step; "
        "GPU busy: every device event of the step summed (a step much longer than that waits on the host). "
        "GPU-busy speedup = baseline GPU busy / swapped GPU busy; host-bound: the baseline step takes "
        f"{HOST_BOUND_RATIO:g}x its GPU busy time or more, so its wall-time speedup compares host time."
    )


def _criteria_lines(report: ModelsReport) -> list[str]:
    from gn_module.bench.report import checks_lines

    checks = report.checks
    if not checks:
        return []
    s = summarize_checks(checks)
    if report.device.get("cuda"):
        head = f"Model criteria (issue 13): {s['PASS']} pass, {s['MISS']} miss, {s['n/a']} n/a"
    else:
        head = f"Model criteria (issue 13): {s['reported']} reported, not judged (CPU run)"
    return [head, *checks_lines(checks)]


def render_console(report: ModelsReport) -> str:
    from gn_module.bench.report import render_text

    header, body = table(report.rows)
    out = [render_text(header, body)] if body else ["(no rows)"]
    source = _gn_source_line(report.rows)
    out += [source] if source else []
    out += _notes(report)
    criteria = _criteria_lines(report)
    if criteria:
        out += ["", criteria[0], *("  " + line for line in criteria[1:])]
    return "\n".join(out)


def render_markdown_report(report: ModelsReport) -> str:
    from gn_module.bench.device import device_label
    from gn_module.bench.report import render_markdown

    header, body = table(report.rows)
    s = report.settings
    name = report.device.get("name", "GPU" if report.device.get("cuda") else "CPU")
    lines = [
        f"### {report.date}: models, {name}",
        "",
        f"- Date: {report.date}",
        f"- Device: {device_label(report.device)}",
        f"- Command: `{report.command}`",
        f"- Settings: {', '.join(f'{k}={v}' for k, v in s.items())}",
        "",
        "One training step = forward, loss, backward, AdamW step, zero_grad; "
        f"{s.get('steps')} timed steps in {s.get('rounds')} rounds after {s.get('warmup')} warm-up steps, "
        "median of the round medians ("
        + ("CUDA events" if report.device.get("cuda") else "perf_counter, CPU")
        + "); each configuration on a fresh model with the same seed and batch, eager configurations "
        "taking turns round by round. "
        + _baseline_text(s.get("baseline_layouts", BASELINE_LAYOUTS))
        + " swapped = `convert_groupnorm` on channels_last. "
        "Speedup = baseline ms / swapped ms. Peak MiB = `torch.cuda.max_memory_allocated` over the "
        "configuration's timed steps, less the other configurations' tensors kept alive beside it. "
        "swapped/fused: GroupNorm layers swapped / with SiLU fused. Compile s: wall time of the first "
        "compiled step."
        + (
            " GN-free CL ms (--gn-free): the swapped model with every GroupNorm replaced by identity, the "
            "activations the swap fused into them included (the others kept), taking turns with the "
            "others; GN-free bound = baseline ms / GN-free CL ms, "
            "the most a GroupNorm swapped in on channels_last can give; a speedup target above "
            f"{LIMIT_FRACTION:g} x the bound becomes {LIMIT_FRACTION:g} x the bound."
            if any(GN_FREE in r.measurements for r in report.rows)
            else ""
        )
        + (
            " GN-free dtypes CL ms: the same with a cast to the dtype torch's GroupNorm returns (float32 "
            "under autocast) in place of identity, timed in the bf16 rows of a swap that keeps torch's "
            "dtypes; where it is timed, the bound is the lower of the two."
            if any(GN_FREE_DTYPES in r.measurements for r in report.rows)
            else ""
        ),
    ]
    source = _gn_source_line(report.rows)
    lines += ["", source] if source else []
    lines += ["", render_markdown(header, body) if body else "(no rows)"]
    notes = _notes(report)
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    criteria = _criteria_lines(report)
    if criteria:
        lines += ["", criteria[0] + ":", ""] + [f"- {line}" for line in criteria[1:]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# CLI


def write_reports(report: ModelsReport, json_path: str | None, markdown_path: str | None) -> None:
    if json_path:
        Path(json_path).write_text(json.dumps(report.as_dict(), indent=1) + "\n")
    if markdown_path:
        Path(markdown_path).write_text(render_markdown_report(report))


def prebuild(device: torch.device) -> None:
    """Build (or load) our CUDA kernels before timing, so no first step pays for nvcc."""
    from gn_module.functional import group_norm

    t0 = time.perf_counter()
    try:
        x = torch.randn(2, 32, 8, 8, device=device).contiguous(memory_format=torch.channels_last)
        group_norm(x.requires_grad_(), 8, act="silu").sum().backward()
        torch.cuda.synchronize(device)
        print(f"gn_module kernels ready ({time.perf_counter() - t0:.1f} s)", flush=True)
    except Exception as exc:  # the swapped configurations will report it
        print(f"warning: gn_module kernels failed to build or run: {_error_text(exc)}", flush=True)


def training_route() -> str:
    """Which autograd node the swapped eager steps run: the C++ node (the default) or, with GN_CPP_NODE=0
    or where it failed to build, the Python autograd.Function."""
    from gn_module import autograd_node

    if autograd_node.requested() and autograd_node.load() is not None:
        return "C++ node"
    return f"Python autograd.Function ({autograd_node.ENV}=0 or no build)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gn_module.bench models",
        description=(__doc__ or "").split("\n\n")[0],
        epilog="Models: " + ", ".join(f"{k} ({s.title})" for k, s in MODELS.items()),
    )
    p.add_argument(
        "--models", type=_csv(MODEL_NAMES), help="comma-separated (default: every available model)"
    )
    p.add_argument("--precisions", type=_csv(PRECISIONS), default=list(PRECISIONS), help="default fp32,bf16")
    p.add_argument("--compile", action="store_true", help="also run torch.compile rows")
    p.add_argument(
        "--compile-models",
        type=_csv(MODEL_NAMES),
        help="with --compile: the models that get compile rows (default: all selected)",
    )
    p.add_argument(
        "--compile-precisions", type=_csv(PRECISIONS), help="with --compile (default: --precisions)"
    )
    p.add_argument("--no-eager", action="store_true", help="with --compile: only the compile rows")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend (default inductor)")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (default: torch's default)")
    p.add_argument("--fuse-calls", action="store_true", help="convert_groupnorm(fuse_calls=True)")
    p.add_argument(
        "--autocast-output",
        choices=("float32", "input"),
        default="float32",
        help="convert_groupnorm(autocast_output=...): float32 (default, as torch's GroupNorm under "
        "autocast) or input (bf16 output in the bf16 rows: faster, not torch's dtype)",
    )
    p.add_argument(
        "--gn-free",
        action="store_true",
        help="eager rows: also time the swapped model with every GroupNorm replaced by identity, with the "
        "activations the swap fused into them (the others kept): the bound no GroupNorm on channels_last can "
        f"beat; speedup targets above {LIMIT_FRACTION:g} x that bound become {LIMIT_FRACTION:g} x the bound. "
        "bf16 rows of a swap that keeps torch's dtypes (--autocast-output float32) also time a cast to "
        "torch's output dtype in its place, the bound for GroupNorms with torch's dtypes",
    )
    p.add_argument(
        "--baseline-layouts",
        type=_csv(BASELINE_LAYOUTS),
        default=list(BASELINE_LAYOUTS),
        help="torch's layouts timed as the baseline (default channels_last,contiguous: the baseline is the "
        "faster); naming one saves its model and, in compile rows, a cold compile, but the baseline is then "
        "that layout's step, not necessarily the faster",
    )
    p.add_argument("--batch", type=int, help="batch size for every model (default: each model's own)")
    p.add_argument(
        "--steps", type=int, help=f"timed steps (default {DEFAULTS['steps']}, tiny {TINY_DEFAULTS['steps']})"
    )
    p.add_argument(
        "--warmup",
        type=int,
        help=f"warm-up steps (default {DEFAULTS['warmup']}, tiny {TINY_DEFAULTS['warmup']})",
    )
    p.add_argument(
        "--rounds",
        type=int,
        help="split the timed steps into this many rounds; eager configurations take turns round by round "
        f"(default {DEFAULTS['rounds']}, tiny {TINY_DEFAULTS['rounds']})",
    )
    p.add_argument(
        "--profile-gn",
        type=int,
        metavar="STEPS",
        help="eager rows: profile this many extra steps of the baseline and report torch's GroupNorm time "
        "(CUDA kernels; CPU op time on the CPU) and issue 13's saved/GN criterion, and both steps' GPU busy "
        "time; compile rows: each configuration's GPU busy time; 0: off "
        f"(default {DEFAULTS['profile_gn']}, tiny {TINY_DEFAULTS['profile_gn']})",
    )
    p.add_argument("--tiny", action="store_true", help="tiny models and inputs (CPU smoke runs)")
    p.add_argument("--device", default="cuda", help="default cuda; cpu times with perf_counter (smoke tests)")
    p.add_argument("--json", metavar="PATH", help="write every row and measurement as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write a Markdown section for benchmarks/RESULTS.md")
    return p


def settings_from_args(args: argparse.Namespace) -> Settings:
    base = TINY_DEFAULTS if args.tiny else DEFAULTS
    steps = base["steps"] if args.steps is None else args.steps
    warmup = base["warmup"] if args.warmup is None else args.warmup
    rounds = base["rounds"] if args.rounds is None else args.rounds
    profile_steps = base["profile_gn"] if args.profile_gn is None else args.profile_gn
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    if warmup < 1:
        raise ValueError(f"--warmup must be >= 1 (the first step is timed separately), got {warmup}")
    if rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    if profile_steps < 0:
        raise ValueError(f"--profile-gn must be >= 0 (0: off), got {profile_steps}")
    if args.batch is not None and args.batch < 1:
        raise ValueError(f"--batch must be >= 1, got {args.batch}")
    return Settings(
        steps=steps,
        warmup=warmup,
        rounds=min(rounds, steps),
        profile_gn=profile_steps,
        tiny=args.tiny,
        fuse_calls=args.fuse_calls,
        autocast_output=args.autocast_output,
        batch=args.batch,
        gn_free=args.gn_free,
        compile_backend=args.compile_backend,
        compile_mode=args.compile_mode,
        baseline_layouts=tuple(dict.fromkeys(args.baseline_layouts)),
    )


def plan(args: argparse.Namespace) -> list[tuple[str, str, bool]]:
    """(model, precision, compiled) rows in run order: eager rows model by model, then compile rows."""
    models = args.models or list(MODEL_NAMES)
    rows = [] if args.no_eager else [(m, p, False) for m in models for p in args.precisions]
    if args.compile:
        compile_models = [m for m in models if m in (args.compile_models or models)]
        rows += [(m, p, True) for m in compile_models for p in (args.compile_precisions or args.precisions)]
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m gn_module.bench models ARGS`; returns the exit status (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.no_eager and not args.compile:
        parser.error("--no-eager needs --compile")
    try:
        device = torch.device(args.device)
    except RuntimeError as exc:
        parser.error(f"--device: {exc}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print(
                f"gn_module.bench models: no CUDA device (torch {torch.__version__}); use --device cpu for a "
                "smoke run. Nothing was measured.",
                file=sys.stderr,
            )
            return EXIT_NO_CUDA
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True  # as examples/train_unet.py and most training scripts

    from gn_module.bench.device import device_info, device_label, unexpected_gpu

    if device.type == "cuda" and (why := unexpected_gpu(torch.cuda.get_device_name(device))) is not None:
        print(f"gn_module.bench models: {why}.", file=sys.stderr)
        return EXIT_NO_CUDA

    info = device_info(device) if device.type == "cuda" else {"torch": torch.__version__, "cuda": False}
    print(
        f"device: {device_label(info) if device.type == 'cuda' else 'cpu (perf_counter timing)'}", flush=True
    )

    report = ModelsReport(
        date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        command="python -m gn_module.bench models " + shlex.join(argv),
        device=info,
        settings={
            **{k: v for k, v in asdict(settings).items() if v is not None},
            "wide_autocast": functional.wide_autocast_enabled(),
            "optimizer": f"AdamW(lr={LR})",
            "cudnn_benchmark": device.type == "cuda",
        },
    )
    if device.type == "cuda":
        prebuild(device)
        report.settings["training_route"] = training_route()
    reasons: dict[str, str | None] = {}
    started = time.perf_counter()
    for name, precision, compiled in plan(args):
        if name not in reasons:
            reasons[name] = MODELS[name].unavailable()
            if reasons[name]:
                report.skipped[name] = reasons[name]
                print(f"{name:24} skipped: {reasons[name]}", flush=True)
        if reasons[name]:
            continue
        row = run_row(MODELS[name], precision, compiled, device, settings, log=lambda s: print(s, flush=True))
        report.rows.append(row)
        report.settings["elapsed_s"] = round(time.perf_counter() - started, 1)
        write_reports(report, args.json, args.markdown)  # after every row: a killed run keeps its rows
    report.settings["elapsed_s"] = round(time.perf_counter() - started, 1)

    print()
    print(render_console(report))
    write_reports(report, args.json, args.markdown)
    for path in (args.json, args.markdown):
        if path:
            print(f"wrote {path}")
    print(f"benchmark time: {report.settings['elapsed_s']:.0f} s")
    measured = any(r.baseline is not None or r.swapped is not None for r in report.rows)
    return 0 if measured else EXIT_NOTHING_MEASURED
