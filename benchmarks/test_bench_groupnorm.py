"""GroupNorm benchmarks: ours (auto, 1-pass, 2-pass) vs eager vs torch.compile (channels_last and NCHW),
and a third-party GroupNorm given with ``--gn-impl`` (``test_groupnorm_foreign``).

Each benchmark's pytest-benchmark statistics are CUDA-event times in seconds (gn_module.bench.timer);
what is timed for each implementation is documented in gn_module.bench.impls, the timing protocol
(L2 flush, GPU-side spin, events) in gn_module.bench.timing. Benchmarks of one (shape, dtype, direction)
share a pytest-benchmark group, so its table shows the implementations side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gn_module.bench.cases import DIRECTIONS, DTYPES, IMPLS, Case, bytes_moved, configured_cases, size_class
from gn_module.bench.impls import FOREIGN, prepare
from gn_module.bench.timer import run_pedantic
from gn_module.bench.timing import reps_for_budget, sol_fraction, summarize, throughput_tbps

CASES = configured_cases()  # GN_BENCH_SHAPES="1x64x32x32 G8 +SiLU; ..." times other shapes
shapes = pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
dtypes = pytest.mark.parametrize("dtype", DTYPES)
directions = pytest.mark.parametrize("direction", DIRECTIONS)


@pytest.mark.parametrize("impl", IMPLS)
@directions
@dtypes
@shapes
def test_groupnorm(
    benchmark: Any,
    case: Case,
    dtype: str,
    direction: str,
    impl: str,
    event_timer: Any,
    run_conditions: dict[str, Any],
    bench_settings: dict[str, float],
) -> None:
    time_groupnorm(benchmark, case, dtype, direction, impl, event_timer, run_conditions, bench_settings)


@directions
@dtypes
@shapes
def test_groupnorm_foreign(
    benchmark: Any,
    case: Case,
    dtype: str,
    direction: str,
    foreign: tuple[str, Callable[..., Any]],
    event_timer: Any,
    run_conditions: dict[str, Any],
    bench_settings: dict[str, float],
) -> None:
    spec, fn = foreign
    time_groupnorm(
        benchmark, case, dtype, direction, FOREIGN, event_timer, run_conditions, bench_settings, fn, spec
    )


def time_groupnorm(
    benchmark: Any,
    case: Case,
    dtype: str,
    direction: str,
    impl: str,
    event_timer: Any,
    run_conditions: dict[str, Any],
    bench_settings: dict[str, float],
    foreign: Callable[..., Any] | None = None,
    spec: str | None = None,
) -> None:
    benchmark.group = f"{case.name} {dtype} {direction}"
    try:
        prepared = prepare(impl, case, dtype, direction, event_timer.device, foreign=foreign)
        est_us = event_timer.warm_up(prepared.fn, int(bench_settings["warmup"]))
    except NotImplementedError as exc:  # pytest-gn's "shape not supported" signal for --gn-impl
        pytest.skip(f"{spec or impl} does not support {case.name} {dtype}: {exc}")
    rounds = reps_for_budget(
        est_us,
        int(bench_settings["reps"]),
        int(bench_settings["min_reps"]),
        bench_settings["max_seconds"],
        overhead_us=event_timer.delay_us,
    )
    samples = run_pedantic(benchmark, lambda: event_timer.measure_once(prepared.fn), rounds)

    timing = summarize(samples)
    nbytes = bytes_moved(case, dtype, direction)
    benchmark.extra_info.update(
        impl=impl,
        impl_spec=spec,
        case=case.name,
        dtype=dtype,
        direction=direction,
        tensor_bytes=case.nbytes(dtype),
        size_class=size_class(case.nbytes(dtype)),
        bytes=nbytes,
        median_us=timing.median_us,
        iqr_us=timing.iqr_us,
        tbps=throughput_tbps(nbytes, timing.median_us),
        sol_fraction=sol_fraction(nbytes, timing.median_us, run_conditions["copy_tbps"]),
        schedule=(prepared.plan or {}).get("schedule"),
        plan=prepared.plan,
        settings=dict(bench_settings),
        **run_conditions,
    )
