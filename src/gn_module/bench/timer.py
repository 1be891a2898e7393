"""Make pytest-benchmark record CUDA-event times instead of host-clock times.

pytest-benchmark computes each round's duration as ``timer()`` after the call minus ``timer()`` before
it. We give it a *virtual clock* that only advances when the benchmarked target reports a measured GPU
duration, so its statistics (min, median, IQR, ...) and its saved JSON are CUDA-event times.

The one private API use: pytest-benchmark has no public per-test timer hook (``--benchmark-timer`` is
global and takes a real clock), so `install` sets the fixture's ``_timer`` attribute. It is checked
and raises a clear error if a pytest-benchmark release renames it; tests/test_bench_cpu.py runs it
against the installed pytest-benchmark.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class VirtualClock:
    """A clock (seconds) that moves only by `advance`; pytest-benchmark reads it via ``__call__``."""

    __name__ = "cuda_event_clock"  # pytest-benchmark stores the timer's name in its JSON

    def __init__(self) -> None:
        self.now = 0.0
        self.samples_s: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"a measured duration must be non-negative, got {seconds}")
        self.now += seconds
        self.samples_s.append(seconds)


def install(benchmark: Any, clock: VirtualClock) -> None:
    """Point a pytest-benchmark fixture at `clock` (private attribute; see module docstring)."""
    if not hasattr(benchmark, "_timer") or not hasattr(benchmark, "pedantic"):
        raise RuntimeError(
            "this pytest-benchmark version has no BenchmarkFixture._timer; "
            "gn_module.bench.timer needs updating"
        )
    benchmark._timer = clock


def run_pedantic(benchmark: Any, measure_us: Callable[[], float], rounds: int) -> list[float]:
    """Record `rounds` GPU measurements as pytest-benchmark rounds; returns them in microseconds.

    `measure_us` performs one timed call (flush, spin, events, synchronize) and returns its duration.
    Warm-up is the caller's job (done before, outside pytest-benchmark's statistics).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    clock = VirtualClock()
    install(benchmark, clock)
    benchmark.pedantic(
        lambda: clock.advance(measure_us() * 1e-6), rounds=rounds, iterations=1, warmup_rounds=0
    )
    return [s * 1e6 for s in clock.samples_s]
