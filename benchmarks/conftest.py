"""pytest-benchmark setup for the GroupNorm benchmarks: GPU machine info, copy bandwidth, quick subset.

Run: ``pytest benchmarks`` (all), ``pytest benchmarks -m quick`` (3 shapes, fp16: about a minute).
Knobs (environment): GN_BENCH_REPS (timed rounds, default 50), GN_BENCH_MAX_SECONDS (GPU time per
benchmark, default 0.3), GN_BENCH_WARMUP (default 5).
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path
from typing import Any

import pytest

try:
    import gn_module  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gn_module.bench.cases import QUICK_NAMES

_copy_tbps: dict[str, float] = {}


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "quick: the quick benchmark subset (3 shapes, fp16), about a minute")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark (quick shape, fp16) benchmarks `quick`; a parametrize mark cannot express the conjunction."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        case, dtype = params.get("case"), params.get("dtype")
        if case is not None and getattr(case, "name", None) in QUICK_NAMES and dtype == "fp16":
            item.add_marker(pytest.mark.quick)


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    """GPU name, driver, SM count, clocks (and this session's copy bandwidth) in the saved JSON."""
    from gn_module.bench.device import device_info

    try:
        machine_info["gpu"] = device_info()
    except Exception as exc:  # machine info must never break a benchmark run
        machine_info["gpu"] = {"error": f"{type(exc).__name__}: {exc}"}
    if _copy_tbps:
        machine_info["gpu"]["copy_bandwidth_tbps"] = _copy_tbps["tbps"]


def env_number(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise pytest.UsageError(f"{name} must be a number, got {raw!r}") from None
    if value < 0:
        raise pytest.UsageError(f"{name} must be non-negative, got {raw!r}")
    return value


@pytest.fixture(scope="session")
def bench_settings() -> dict[str, float]:
    return {
        "reps": int(env_number("GN_BENCH_REPS", 50)),
        "min_reps": 5,
        "warmup": int(env_number("GN_BENCH_WARMUP", 5)),
        "max_seconds": env_number("GN_BENCH_MAX_SECONDS", 0.3),
    }


@pytest.fixture(scope="session")
def event_timer() -> Any:
    if not cuda_available():
        pytest.skip("CUDA is not available: the GroupNorm benchmarks time CUDA kernels")
    from gn_module.bench.timing import EventTimer

    return EventTimer()


@pytest.fixture(scope="session")
def copy_bandwidth(event_timer: Any) -> Any:
    """Device-to-device copy bandwidth measured once per session: the SOL reference."""
    from gn_module.bench.timing import copy_bandwidth as measure

    bw = measure(1 << 30, timer=event_timer)
    _copy_tbps["tbps"] = bw.tbps
    return bw


@pytest.fixture(autouse=True)
def _release_memory() -> Any:
    """Shapes range from 1 MiB to 512 MiB; free each benchmark's tensors before the next one."""
    yield
    gc.collect()
    if cuda_available():
        import torch

        torch.cuda.empty_cache()
