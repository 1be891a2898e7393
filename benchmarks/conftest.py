"""pytest-benchmark setup for the GroupNorm benchmarks: stable machine identity, run conditions, quick
subset, and a third-party GroupNorm (``--gn-impl``) timed next to ours.

Run: ``pytest benchmarks`` (all), ``pytest benchmarks -m quick`` (3 shapes, fp16: about a minute),
``pytest benchmarks --gn-impl mypkg.norm:group_norm`` (also time that implementation).
History: ``--benchmark-autosave`` saves into ``.benchmarks/`` (committed); ``--benchmark-compare``
compares with the newest saved run; ``python -m gn_module.bench history`` reads them all.
Knobs (environment): GN_BENCH_REPS (timed rounds, default 50), GN_BENCH_MAX_SECONDS (GPU time per
benchmark, default 0.3), GN_BENCH_WARMUP (default 5), GN_BENCH_SHAPES (other shapes, e.g.
"1x64x32x32 G8 +SiLU; 2x320x16x16 G32"), GN_BENCH_COMMIT (the commit, where the tree has no git).
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

try:
    import gn_module  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gn_module.bench.cases import QUICK_NAMES

_device_info: dict[str, Any] = {}


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def device_info() -> dict[str, Any]:
    """This session's GPU facts (read once; `gn_module.bench.device.device_info`)."""
    if not _device_info:
        from gn_module.bench.device import device_info as read

        try:
            _device_info.update(read())
        except Exception as exc:  # machine info must never break a benchmark run
            _device_info.update(error=f"{type(exc).__name__}: {exc}")
    return _device_info


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "quick: the quick benchmark subset (3 shapes, fp16), about a minute")


def foreign_impl(config: pytest.Config) -> tuple[str, Callable[..., Any]] | None:
    """(spec, callable) of ``--gn-impl`` when it names a GroupNorm other than ours (pytest-gn resolves it)."""
    import pytest_gn

    return pytest_gn.impl_under_test(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark (quick shape, fp16) benchmarks `quick` (a parametrize mark cannot express the conjunction);
    drop the foreign-implementation benchmarks when no ``--gn-impl`` names one."""
    has_foreign = foreign_impl(config) is not None
    keep, dropped = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        case, dtype = params.get("case"), params.get("dtype")
        if case is not None and getattr(case, "name", None) in QUICK_NAMES and dtype == "fp16":
            item.add_marker(pytest.mark.quick)
        is_foreign = getattr(item, "originalname", None) == "test_groupnorm_foreign"
        (dropped if is_foreign and not has_foreign else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    """machine_info = what identifies the machine kind and stack, nothing measured or host-specific.

    Fresh GPU machines of one kind differ in host name, kernel release and CPU clock; keeping those
    would make every compare warn "machine_info is different". Clocks and bandwidth go to extra_info.
    """
    from gn_module.bench.device import stable_machine_info

    stable_machine_info(machine_info, device_info())


def pytest_benchmark_update_commit_info(config: pytest.Config, commit_info: dict[str, Any]) -> None:
    """Take the commit from GN_BENCH_COMMIT (and GN_BENCH_COMMIT_TIME, GN_BENCH_DIRTY=1) when set.

    The copy of the working tree that runs on a GPU machine may carry no .git, or a stale one (seen:
    it reported the session's first commit, dirty), so the history could not say which kernels a run
    timed. scripts/gpu_check.sh sets these from the checkout it was sent from.
    """
    commit = os.environ.get("GN_BENCH_COMMIT", "").strip()
    if not commit:
        return
    commit_info.update(
        id=commit,
        time=os.environ.get("GN_BENCH_COMMIT_TIME") or None,
        author_time=None,
        dirty=os.environ.get("GN_BENCH_DIRTY", "") == "1",
        project="pytest-gn",
        source="GN_BENCH_COMMIT",
    )
    commit_info.pop("error", None)


@pytest.hookimpl(wrapper=True)
def pytest_benchmark_compare_machine_info(
    config: pytest.Config, benchmarksession: Any, machine_info: dict[str, Any], compared_benchmark: Any
) -> Generator[None, Any, Any]:
    """Keep pytest-benchmark's machine_info warning, but survive its formatting.

    pytest-benchmark 5.x formats the warning with ``storage.location``, which is the storage path
    relative to the working directory and raises ValueError for storage elsewhere (an INTERNALERROR
    that ends the run). Here the warning is issued with the absolute path instead.
    """
    try:
        return (yield)
    except ValueError:
        from gn_module.bench.history import machine_differences

        diffs = machine_differences(compared_benchmark.get("machine_info", {}), machine_info)
        benchmarksession.logger.warning(
            f"Benchmark machine_info is different: {'; '.join(diffs) or 'see the saved run'} "
            f"(storage: {benchmarksession.storage})."
        )
        return None


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

    return measure(1 << 30, timer=event_timer)


@pytest.fixture(scope="session")
def run_conditions(copy_bandwidth: Any) -> dict[str, Any]:
    """Measured and run-time facts recorded in every benchmark's extra_info (never in machine_info)."""
    from gn_module.bench.device import run_conditions as conditions

    return {**conditions(device_info()), "copy_tbps": copy_bandwidth.tbps}


@pytest.fixture(scope="session")
def foreign(pytestconfig: pytest.Config) -> tuple[str, Callable[..., Any]]:
    found = foreign_impl(pytestconfig)
    if found is None:  # deselected at collection; kept as a guard
        pytest.skip("no --gn-impl given")
    return found


@pytest.fixture(autouse=True)
def _release_memory() -> Any:
    """Shapes range from 1 MiB to 512 MiB; free each benchmark's tensors before the next one."""
    yield
    gc.collect()
    if cuda_available():
        import torch

        torch.cuda.empty_cache()
