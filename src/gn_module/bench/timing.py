"""CUDA-event timing with L2 flushing, and the device-to-device copy bandwidth used as speed-of-light.

How one repetition is timed (`EventTimer.enqueue`):

1. Flush L2 by *reading* a buffer several times the L2 size (a sum). Reading leaves only clean lines in
   L2, so the timed kernel never pays for write-backs of the flush; the previous repetition's dirty
   output lines are written back here, outside the timed region. An experiment may set
   ``EventTimer.before`` to run a call after the flush (untimed): the same kernels on other tensors
   bring their code and parameters back into L2, so the timed call is cold in its data only.
2. Queue a GPU-side spin (``torch.cuda._sleep``) longer than the host overhead of the timed call, so
   the GPU is still busy when the start event is queued: the events then bracket GPU work only, not
   Python/dispatcher time spent enqueueing it.
3. Record start event, call the function, record end event.

Only stage 3 is timed. torch is imported lazily so that this module (and the statistics below) import
and unit-test on machines without CUDA.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: Flush buffer size as a multiple of the L2 size (L2 replacement is not strict LRU, so read past it).
FLUSH_L2_MULTIPLE = 3
#: Used when the device does not report its L2 size.
FALLBACK_L2_BYTES = 64 << 20
#: Bounds of the GPU-side spin queued before each timed call, in microseconds.
MIN_DELAY_US = 20.0
MAX_DELAY_US = 5000.0


@dataclass(frozen=True)
class Timing:
    """Summary statistics of repeated GPU timings, in microseconds."""

    median_us: float
    mean_us: float
    min_us: float
    max_us: float
    q1_us: float
    q3_us: float
    reps: int

    @property
    def iqr_us(self) -> float:
        return self.q3_us - self.q1_us

    def as_dict(self) -> dict[str, float]:
        out = asdict(self)
        out["iqr_us"] = self.iqr_us
        return out


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of already sorted values."""
    if not sorted_values:
        raise ValueError("quantile of an empty sequence")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(samples_us: Sequence[float]) -> Timing:
    """Median, mean, min, max and quartiles of timing samples (microseconds)."""
    values = sorted(float(v) for v in samples_us)
    if not values:
        raise ValueError("summarize() needs at least one timing sample")
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError(f"timing samples must be finite and non-negative, got {values[:5]}...")
    return Timing(
        median_us=statistics.median(values),
        mean_us=statistics.fmean(values),
        min_us=values[0],
        max_us=values[-1],
        q1_us=quantile(values, 0.25),
        q3_us=quantile(values, 0.75),
        reps=len(values),
    )


def throughput_tbps(nbytes: int, time_us: float) -> float:
    """Bytes moved per second, in TB/s (10**12 bytes)."""
    if time_us <= 0:
        raise ValueError(f"time must be positive, got {time_us} us")
    return nbytes / (time_us * 1e-6) / 1e12


def sol_fraction(nbytes: int, time_us: float, copy_tbps: float) -> float:
    """Fraction of speed-of-light: (nbytes at copy bandwidth) / measured time."""
    if copy_tbps <= 0:
        raise ValueError(f"copy bandwidth must be positive, got {copy_tbps} TB/s")
    return throughput_tbps(nbytes, time_us) / copy_tbps


def reps_for_budget(
    est_us: float, reps: int, min_reps: int, max_seconds: float | None, overhead_us: float = 0.0
) -> int:
    """Repetitions to run: `reps`, reduced to fit `max_seconds` of GPU time but never below `min_reps`."""
    if reps < 1 or min_reps < 1:
        raise ValueError(f"reps and min_reps must be >= 1, got {reps}, {min_reps}")
    if max_seconds is None or est_us + overhead_us <= 0:
        return reps
    fit = int(max_seconds * 1e6 // (est_us + overhead_us))
    return max(min(reps, fit), min(min_reps, reps))


def _torch() -> Any:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("CUDA timing needs a CUDA device; torch.cuda.is_available() is False")
    return torch


def cuda_device(device: Any = None) -> Any:
    """A CUDA torch.device with an explicit index (None, "cuda" -> the current device)."""
    torch = _torch()
    dev = torch.device("cuda") if device is None else torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"expected a CUDA device, got {dev}")
    return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())


def l2_cache_bytes(device: Any = None) -> int:
    """L2 size the device reports (a fallback when the property is absent)."""
    torch = _torch()
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or FALLBACK_L2_BYTES)


class EventTimer:
    """Times a callable on one device with CUDA events; see the module docstring for the protocol."""

    def __init__(self, device: Any = None, *, flush: bool = True) -> None:
        torch = _torch()
        self.torch = torch
        self.device = cuda_device(device)
        self.flush_bytes = FLUSH_L2_MULTIPLE * l2_cache_bytes(self.device) if flush else 0
        self._flush_buf = (
            torch.empty(self.flush_bytes // 4, dtype=torch.float32, device=self.device).fill_(1.0)
            if flush
            else None
        )
        self._sleep = getattr(torch.cuda, "_sleep", None)  # private but long-stable; absent: no spin
        self._cycles_per_us: float | None = None
        self.delay_us = MIN_DELAY_US
        self.before: Callable[[], object] | None = None  # queued after the flush, untimed (see above)

    @property
    def can_delay(self) -> bool:
        return self._sleep is not None

    def _calibrate_spin(self) -> float:
        if self._cycles_per_us is None:
            torch = self.torch
            cycles = 2_000_000
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.device(self.device):
                self._sleep(cycles)  # first call may load the kernel
                start.record()
                self._sleep(cycles)
                end.record()
                end.synchronize()
            self._cycles_per_us = cycles / max(start.elapsed_time(end) * 1e3, 1e-3)
        return self._cycles_per_us

    def spin(self, us: float) -> None:
        """Keep the GPU busy for about `us` microseconds (no-op without torch.cuda._sleep)."""
        if self._sleep is not None and us > 0:
            self._sleep(max(1, int(us * self._calibrate_spin())))

    def flush(self) -> None:
        if self._flush_buf is not None:
            self._flush_buf.sum()

    def host_overhead_us(self, fn: Callable[[], object], calls: int = 5) -> float:
        """Host time of one call while the GPU is busy (so launches do not wait for the GPU)."""
        torch = self.torch
        with torch.cuda.device(self.device):
            torch.cuda.synchronize()
            self.spin(20_000)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            host_us = (time.perf_counter() - t0) * 1e6 / calls
            torch.cuda.synchronize()
        return host_us

    def set_delay_for(self, fn: Callable[[], object]) -> float:
        """Choose the pre-call spin so it outlasts the host overhead of `fn`."""
        self.delay_us = min(MAX_DELAY_US, max(MIN_DELAY_US, 2.0 * self.host_overhead_us(fn) + 10.0))
        return self.delay_us

    def enqueue(self, fn: Callable[[], object]) -> tuple[Any, Any]:
        """Queue flush, spin and one timed call; returns the (start, end) events."""
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.flush()
        if self.before is not None:
            self.before()
        self.spin(self.delay_us)
        start.record()
        fn()
        end.record()
        return start, end

    def measure_once(self, fn: Callable[[], object]) -> float:
        """One timed call, synchronized; microseconds."""
        with self.torch.cuda.device(self.device):
            start, end = self.enqueue(fn)
            end.synchronize()
        return start.elapsed_time(end) * 1e3

    def measure(self, fn: Callable[[], object], reps: int) -> list[float]:
        """`reps` timed calls queued back to back, one synchronization at the end; microseconds."""
        with self.torch.cuda.device(self.device):
            events = [self.enqueue(fn) for _ in range(reps)]
            events[-1][1].synchronize()
        return [s.elapsed_time(e) * 1e3 for s, e in events]

    def warm_up(self, fn: Callable[[], object], warmup: int) -> float:
        """Run `fn` (compiles, autotunes, allocates), set the spin; returns an estimate of one call in us."""
        torch = self.torch
        with torch.cuda.device(self.device):
            for _ in range(max(1, warmup)):
                fn()
            torch.cuda.synchronize()
        self.set_delay_for(fn)
        return statistics.median(self.measure(fn, 3))


def l2_read_flush(device: Any = None) -> Callable[[], None]:
    """The benchmark's L2 flush (a read of FLUSH_L2_MULTIPLE x the L2 size) as a callable, for scripts that
    profile or trace launches: they then see x in DRAM and no dirty lines in L2, as the timed calls do.
    (A write flush, e.g. zeroing a buffer, leaves the L2 full of dirty lines whose write-back lands in the
    next kernel: about 9 us on a 512 MiB read stream on the H200, RESULTS.md session 15.)"""
    return EventTimer(device).flush


def time_cuda(
    fn: Callable[[], object],
    *,
    reps: int = 100,
    warmup: int = 5,
    min_reps: int = 10,
    max_seconds: float | None = None,
    flush: bool = True,
    device: Any = None,
    timer: EventTimer | None = None,
) -> Timing:
    """Warm up, then time `fn` with CUDA events over `reps` repetitions (fewer if `max_seconds` says so)."""
    timer = timer or EventTimer(device, flush=flush)
    est_us = timer.warm_up(fn, warmup)
    n = reps_for_budget(est_us, reps, min_reps, max_seconds, overhead_us=timer.delay_us)
    return summarize(timer.measure(fn, n))


@dataclass(frozen=True)
class CopyBandwidth:
    """Device-to-device copy: bytes read + written per second (the SOL reference)."""

    nbytes: int  # bytes of the source buffer; the copy moves twice that
    timing: Timing

    @property
    def tbps(self) -> float:
        return throughput_tbps(2 * self.nbytes, self.timing.median_us)

    def as_dict(self) -> dict[str, Any]:
        return {
            "nbytes": self.nbytes,
            "moved_bytes": 2 * self.nbytes,
            "tbps": self.tbps,
            **self.timing.as_dict(),
        }


def copy_bandwidth(
    nbytes: int = 1 << 30, *, device: Any = None, reps: int = 30, timer: EventTimer | None = None
) -> CopyBandwidth:
    """Median bandwidth of ``dst.copy_(src)`` for an `nbytes` buffer on the device."""
    if nbytes <= 0:
        raise ValueError(f"copy size must be positive, got {nbytes}")
    timer = timer or EventTimer(device)
    torch = timer.torch
    src = torch.empty(nbytes, dtype=torch.uint8, device=timer.device).fill_(7)
    dst = torch.empty_like(src)
    timing = time_cuda(lambda: dst.copy_(src), reps=reps, warmup=3, timer=timer)
    return CopyBandwidth(nbytes=nbytes, timing=timing)
