"""CPU tests of the benchmark machinery: statistics, bytes, shape table, targets, reports, CLI, timer glue."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import gn_module
from gn_module.bench import cases as bench_cases
from gn_module.bench import cli as bench
from gn_module.bench import device as bench_device
from gn_module.bench import impls as bench_impls
from gn_module.bench import report as bench_report
from gn_module.bench import targets as bench_targets
from gn_module.bench import timing
from gn_module.bench.cases import MIB, Case
from gn_module.bench.results import Result
from gn_module.bench.timer import VirtualClock, install, run_pedantic
from gn_module.bench.timing import Timing, summarize

SRC = str(Path(gn_module.__file__).resolve().parents[1])
NO_CUDA = not torch.cuda.is_available()


def run_module(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    # A child pytest must not inherit this run's xdist worker identity: pytest-benchmark disables
    # itself (one round only) when it believes it runs under xdist.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["PYTHONPATH"] = SRC + os.pathsep + os.environ.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=300, cwd=cwd, check=False
    )


# ---------------------------------------------------------------- statistics


def test_summarize_known_values() -> None:
    t = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (t.median_us, t.mean_us, t.min_us, t.max_us, t.reps) == (3.0, 3.0, 1.0, 5.0, 5)
    assert (t.q1_us, t.q3_us, t.iqr_us) == (2.0, 4.0, 2.0)
    even = summarize([4.0, 1.0, 2.0, 3.0])
    assert even.median_us == 2.5
    assert even.q1_us == pytest.approx(1.75) and even.q3_us == pytest.approx(3.25)  # numpy's linear rule
    assert summarize([7.0]).iqr_us == 0.0


@pytest.mark.parametrize("bad", [[], [1.0, -0.5], [1.0, math.nan], [math.inf]])
def test_summarize_rejects_bad_samples(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        summarize(bad)


def test_quantile_bounds() -> None:
    assert timing.quantile([1.0, 2.0], 0.0) == 1.0 and timing.quantile([1.0, 2.0], 1.0) == 2.0
    with pytest.raises(ValueError):
        timing.quantile([1.0], 1.5)


def test_throughput_and_sol() -> None:
    assert timing.throughput_tbps(4_000_000, 1.0) == pytest.approx(4.0)  # 4 MB in 1 us
    assert timing.sol_fraction(2_000_000, 1.0, 4.0) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        timing.throughput_tbps(1, 0.0)
    with pytest.raises(ValueError):
        timing.sol_fraction(1, 1.0, 0.0)


def test_reps_for_budget() -> None:
    assert timing.reps_for_budget(10.0, 100, 10, None) == 100
    assert timing.reps_for_budget(10.0, 100, 10, 1.0) == 100  # 1 s holds 100k calls
    assert timing.reps_for_budget(10_000.0, 100, 10, 0.5) == 50  # 10 ms each: 50 fit
    assert timing.reps_for_budget(1e6, 100, 10, 0.5) == 10  # never below min_reps
    assert timing.reps_for_budget(1e6, 3, 10, 0.5) == 3  # min_reps never exceeds reps
    assert timing.reps_for_budget(900.0, 1000, 1, 0.1, overhead_us=100.0) == 100
    with pytest.raises(ValueError):
        timing.reps_for_budget(1.0, 0, 1, None)


def test_event_timer_needs_cuda() -> None:
    if not NO_CUDA:
        pytest.skip("this machine has CUDA")
    with pytest.raises(RuntimeError, match="CUDA"):
        timing.EventTimer()


def test_event_timer_runs_before_after_the_flush_and_outside_the_events() -> None:
    """`EventTimer.before` (time_shapes.py --warm-code) runs after the L2 flush and before the start event."""
    log: list[str] = []

    class Event:
        def __init__(self, enable_timing: bool) -> None:
            pass

        def record(self) -> None:
            log.append("event")

    class Flush:
        def sum(self) -> None:
            log.append("flush")

    fake_torch = type("T", (), {"cuda": type("C", (), {"Event": Event})})
    timer = timing.EventTimer.__new__(timing.EventTimer)
    timer.torch, timer._flush_buf, timer._sleep, timer.delay_us = fake_torch, Flush(), None, 20.0
    timer.before = lambda: log.append("before")
    timer.enqueue(lambda: log.append("call"))
    assert log == ["flush", "before", "event", "call", "event"]
    log.clear()
    timer.before = None
    timer.enqueue(lambda: log.append("call"))
    assert log == ["flush", "event", "call", "event"]


# ---------------------------------------------------------------- shapes and bytes

ISSUE_TEXT = (
    "1x128x1024x2048 G16; 1x128x1024x1024 G32 +SiLU; 1x256x512x512 G32 +SiLU; 1x512x256x256 G32 +SiLU;\n"
    "1x512x128x128 G32 +SiLU; 2x320x64x64 G32 +SiLU; 2x640x32x32 G32 +SiLU; 2x1280x16x16 G32 +SiLU; "
    "32x128x256x256 G32;\n1x128x16x256x256 G32 +SiLU"
)


def test_shape_table_matches_issue_text() -> None:
    assert bench_cases.parse_table(ISSUE_TEXT) == list(bench_cases.CASES)
    assert len(bench_cases.CASES) == 10
    first, last = bench_cases.CASES[0], bench_cases.CASES[-1]
    assert first == Case((1, 128, 1024, 2048), 16, None) and first.name == "1x128x1024x2048-G16"
    assert last == Case((1, 128, 16, 256, 256), 32, "silu") and last.name == "1x128x16x256x256-G32-silu"
    assert sum(c.act == "silu" for c in bench_cases.CASES) == 8
    assert set(bench_cases.QUICK_NAMES) <= {c.name for c in bench_cases.CASES}


@pytest.mark.parametrize(
    "bad", ["1x128x64 G3", "128x64 G32", "1x128x64x64", "1x128x64x64 G32 +relu", "1x0x4x4 G1", "1x8 G2"]
)
def test_parse_case_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        bench_cases.parse_case(bad)


def test_parse_table_skips_comments_and_blanks() -> None:
    cases = bench_cases.parse_table("# header\n\n1x8x4x4 G2  # tiny\n2x16x2x2 G4 +silu; ")
    assert cases == [Case((1, 8, 4, 4), 2), Case((2, 16, 2, 2), 4, "silu")]


def test_select_cases() -> None:
    assert [c.name for c in bench_cases.select_cases(quick=True)] == list(bench_cases.QUICK_NAMES)
    assert [c.name for c in bench_cases.select_cases(["2x320", "1X512X128"])] == [
        "1x512x128x128-G32-silu",
        "2x320x64x64-G32-silu",
    ]
    assert [c.name for c in bench_cases.select_cases(["G16"], quick=True)] == ["1x128x1024x2048-G16"]
    with pytest.raises(ValueError, match="no benchmark shape"):
        bench_cases.select_cases(["7x7"])
    # One unknown shape among known ones is an error too, named (session 35's A/B asked for 8x320x64x64 and
    # silently got the four default shapes only).
    with pytest.raises(ValueError, match=r"no benchmark shape matches \['8x320x64x64'\]"):
        bench_cases.select_cases(["2x320x64x64", "8x320x64x64"])
    with pytest.raises(ValueError, match="under --quick"):
        bench_cases.select_cases(["2x320"], quick=True)


def test_bytes_moved() -> None:
    c = Case((2, 64, 8, 8), 32)
    assert c.numel == 8192
    assert bench_cases.bytes_moved(c, "fp16", "fwd") == 2 * 8192 * 2
    assert bench_cases.bytes_moved(c, "bf16", "bwd") == 3 * 8192 * 2
    assert bench_cases.bytes_moved(c, "fp32", "bwd") == 3 * 8192 * 4
    with pytest.raises(ValueError):
        bench_cases.bytes_moved(c, "fp16", "sideways")
    with pytest.raises(ValueError):
        bench_cases.bytes_moved(c, "int8", "fwd")
    # autocast rows: 16-bit x and dx, float32 y and dy
    assert bench_cases.bytes_moved(c, "bf16-autocast", "fwd") == 8192 * (2 + 4)
    assert bench_cases.bytes_moved(c, "fp16-autocast", "bwd") == 8192 * (2 + 4 + 2)
    assert c.nbytes("bf16-autocast") == 8192 * 2  # a row's size class is x's


def test_size_classes_of_the_table() -> None:
    classes = {c.name: bench_cases.size_class(c.nbytes("fp16")) for c in bench_cases.CASES}
    assert classes == {
        "1x128x1024x2048-G16": "large",
        "1x128x1024x1024-G32-silu": "large",
        "1x256x512x512-G32-silu": "large",  # exactly 128 MiB
        "1x512x256x256-G32-silu": "mid",  # exactly 64 MiB
        "1x512x128x128-G32-silu": "mid",
        "2x320x64x64-G32-silu": "small",
        "2x640x32x32-G32-silu": "small",
        "2x1280x16x16-G32-silu": "small",
        "32x128x256x256-G32": "large",
        "1x128x16x256x256-G32-silu": "large",
    }
    assert bench_cases.size_class(100 * MIB) is None
    assert bench_cases.size_class(8 * MIB - 1) == "small" and bench_cases.size_class(8 * MIB) == "mid"


# ---------------------------------------------------------------- targets (issues 12 and 13)

LARGE = Case((1, 128, 1024, 2048), 16)  # 512 MiB fp16; issue 13's named compile-best exception
LARGE_G32 = Case((1, 128, 1024, 2048), 32)  # the same tensor, other groups: not the exception
LARGE_SILU = Case((1, 128, 1024, 1024), 32, "silu")  # 256 MiB fp16, one sample
ON_CHIP = Case((32, 128, 256, 256), 32)  # 512 MiB fp16, 16 MiB per sample
BIG_SAMPLES = Case((8, 256, 256, 256), 32)  # 256 MiB fp16, 32 MiB per sample: does not fit
MID8 = Case((1, 256, 128, 128), 32)  # 8 MiB fp16
MID20 = Case((1, 640, 128, 128), 32)  # 20 MiB fp16
MID24 = Case((1, 768, 128, 128), 32)  # 24 MiB fp16
MID48 = Case((1, 384, 256, 256), 32)  # 48 MiB fp16
MID64 = Case((1, 512, 256, 256), 32, "silu")  # 64 MiB fp16
GAP100 = Case((1, 800, 256, 256), 32)  # 100 MiB fp16: no size class
SMALL = Case((2, 640, 32, 32), 32, "silu")  # 2.5 MiB fp16
SMALL5 = Case((2, 320, 64, 64), 32, "silu")  # 5 MiB fp16
COPY_TBPS = 4.0


def t(us: float) -> Timing:
    return Timing(us, us, us, us, us, us, 10)


def results_for(case: Case, direction: str, times: dict[str, float], dtype: str = "fp16") -> list[Result]:
    return [Result(case, dtype, direction, impl, t(us)) for impl, us in times.items()]


def by_target(checks: list[bench_targets.TargetCheck]) -> dict[str, bench_targets.TargetCheck]:
    assert len({c.target for c in checks}) == len(checks), "one check per target and row"
    return {c.target: c for c in checks}


def us_at_sol(case: Case, direction: str, fraction: float, dtype: str = "fp16") -> float:
    """Median us at which ours-auto reaches `fraction` of SOL (COPY_TBPS)."""
    return bench_cases.bytes_moved(case, dtype, direction) / (COPY_TBPS * 1e12) * 1e6 / fraction


def checks_of(case: Case, direction: str, times: dict[str, float], dtype: str = "fp16") -> dict:
    return by_target(bench_targets.check_targets(results_for(case, direction, times, dtype), COPY_TBPS))


def test_target_shapes_have_the_sizes_the_tests_assume() -> None:
    mib = {c: c.nbytes("fp16") / MIB for c in (LARGE, LARGE_SILU, ON_CHIP, BIG_SAMPLES, MID20, MID48, GAP100)}
    assert mib == {
        LARGE: 512,
        LARGE_SILU: 256,
        ON_CHIP: 512,
        BIG_SAMPLES: 256,
        MID20: 20,
        MID48: 48,
        GAP100: 100,
    }
    assert (MID8.nbytes("fp16"), MID24.nbytes("fp16"), MID64.nbytes("fp16")) == (8 * MIB, 24 * MIB, 64 * MIB)
    assert ON_CHIP.name == "32x128x256x256-G32" and LARGE.name == "1x128x1024x2048-G16"
    assert bench_cases.size_class(GAP100.nbytes("fp16")) is None


@pytest.mark.parametrize(
    ("case", "direction", "target", "threshold"),
    [
        (LARGE_SILU, "fwd", "large SOL", 0.62),
        (LARGE_SILU, "bwd", "large SOL", 0.58),
        (LARGE, "fwd", "large SOL", 0.62),
        (BIG_SAMPLES, "fwd", "large SOL", 0.62),  # 32 MiB samples do not fit on chip
        (ON_CHIP, "fwd", "large SOL (sample <=24MiB)", 0.80),
        (ON_CHIP, "bwd", "large SOL (sample <=24MiB)", 0.75),
        (MID8, "fwd", "mid SOL (<=24MiB)", 0.75),
        (MID20, "fwd", "mid SOL (<=24MiB)", 0.75),
        (MID20, "bwd", "mid SOL (<=24MiB)", 0.70),
        (MID24, "fwd", "mid SOL (<=24MiB)", 0.75),
        (MID48, "fwd", "mid SOL", 0.65),
        (MID48, "bwd", "mid SOL", 0.55),
        (MID64, "fwd", "mid SOL", 0.65),
    ],
)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_targets_sol(case: Case, direction: str, target: str, threshold: float, dtype: str) -> None:
    below = checks_of(
        case, direction, {"ours-auto": us_at_sol(case, direction, threshold - 0.01, dtype)}, dtype
    )
    above = checks_of(
        case, direction, {"ours-auto": us_at_sol(case, direction, threshold + 0.01, dtype)}, dtype
    )
    assert set(below) == set(above) == {target}  # one SOL target; no peers measured, no speedup targets
    assert below[target].threshold == threshold and below[target].value == pytest.approx(threshold - 0.01)
    assert below[target].status == "MISS" and above[target].status == "PASS"


def test_targets_large_fwd_061_misses_063_passes() -> None:
    assert (
        checks_of(LARGE_SILU, "fwd", {"ours-auto": us_at_sol(LARGE_SILU, "fwd", 0.61)})["large SOL"].passed
        is False
    )
    assert (
        checks_of(LARGE_SILU, "fwd", {"ours-auto": us_at_sol(LARGE_SILU, "fwd", 0.63)})["large SOL"].passed
        is True
    )
    # 32x128x256x256's samples fit on chip: 0.79 is not enough there
    on_chip = checks_of(ON_CHIP, "fwd", {"ours-auto": us_at_sol(ON_CHIP, "fwd", 0.79)})
    assert on_chip["large SOL (sample <=24MiB)"].passed is False


def test_sample_on_chip_rule() -> None:
    def on_chip(case: Case, dtype: str = "fp16") -> bool:
        return bench_targets.sample_on_chip(case, case.nbytes(dtype))

    assert on_chip(ON_CHIP) and on_chip(ON_CHIP, "bf16")
    assert not on_chip(ON_CHIP, "fp32")  # 32 MiB samples
    assert not on_chip(BIG_SAMPLES) and not on_chip(LARGE) and not on_chip(LARGE_SILU)
    assert not on_chip(Case((1, 128, 16, 256, 256), 32, "silu"))
    assert not on_chip(MID20)  # one sample: the whole tensor (a mid tensor's rule is its own size)


def test_sol_target_by_size() -> None:
    assert bench_targets.sol_target(ON_CHIP, ON_CHIP.nbytes("fp16"), "bwd") == (
        "large SOL (sample <=24MiB)",
        0.75,
    )
    assert bench_targets.sol_target(MID20, MID20.nbytes("fp16"), "fwd") == ("mid SOL (<=24MiB)", 0.75)
    assert bench_targets.sol_target(LARGE, LARGE.nbytes("fp16"), "fwd") == ("large SOL", 0.62)
    assert bench_targets.sol_target(GAP100, GAP100.nbytes("fp16"), "fwd") is None


def test_no_sol_target_between_64_and_128_mib() -> None:
    checks = checks_of(GAP100, "fwd", {"ours-auto": us_at_sol(GAP100, "fwd", 0.1)})
    assert checks == {}


@pytest.mark.parametrize(
    ("direction", "limit", "passing", "missing"),
    [("fwd", 6.0, [5.9, 6.0], [6.1]), ("bwd", 10.0, [9.9, 10.0], [10.1])],
)
def test_targets_small_latency(
    direction: str, limit: float, passing: list[float], missing: list[float]
) -> None:
    for case in (SMALL, SMALL5):
        for us in passing + missing:
            checks = checks_of(case, direction, {"ours-auto": us})
            assert set(checks) == {"small us"}
            c = checks["small us"]
            assert c.threshold == limit and not c.higher_is_better and c.value == us
            assert c.passed is (us in passing)
    assert checks_of(SMALL, "fwd", {"ours-auto": 6.5})["small us"].margin == pytest.approx(6 / 6.5)


def compile_best(case: Case, direction: str, speedup: float, dtype: str = "fp16") -> dict:
    """ours-auto 100 us; compile-nchw (the best layout) `speedup` times slower, compile-cl 3x slower still."""
    times = {"ours-auto": 100.0, "compile-nchw": 100.0 * speedup, "compile-cl": 100.0 * speedup * 3}
    return checks_of(case, direction, times, dtype)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_targets_compile_best_every_shape_and_up_to_64_mib(direction: str) -> None:
    for case in (LARGE_SILU, ON_CHIP, GAP100):  # above 64 MiB: 1.0 only
        assert compile_best(case, direction, 0.99)["x compile-best"].passed is False
        checks = compile_best(case, direction, 1.01)
        assert checks["x compile-best"].passed is True and checks["x compile-best"].threshold == 1.0
        assert "x compile-best (<=64MiB)" not in checks
    for case in (MID64, MID48, MID8, SMALL):  # up to 64 MiB: 1.0 and 1.5
        low = compile_best(case, direction, 1.4)
        assert low["x compile-best"].passed is True and low["x compile-best (<=64MiB)"].passed is False
        assert low["x compile-best (<=64MiB)"].threshold == 1.5
        high = compile_best(case, direction, 1.6)
        assert high["x compile-best (<=64MiB)"].passed is True and high["x compile-best"].passed is True
    # the best layout is the faster of the two compiled variants
    times = {"ours-auto": 10.0, "compile-cl": 12.0, "compile-nchw": 40.0}
    assert checks_of(SMALL, direction, times)["x compile-best"].value == pytest.approx(1.2)


def test_targets_compile_best_exception_is_1x128x1024x2048_g16_backward_only() -> None:
    exc = "x compile-best (named exception)"
    bwd = compile_best(LARGE, "bwd", 0.92)
    assert bwd[exc].threshold == 0.9 and bwd[exc].passed is True and "x compile-best" not in bwd
    assert compile_best(LARGE, "bwd", 0.88)[exc].passed is False
    assert compile_best(LARGE, "bwd", 0.92, "bf16")[exc].passed is True
    fwd = compile_best(LARGE, "fwd", 0.92)  # forward: the plain 1.0
    assert exc not in fwd and fwd["x compile-best"].passed is False and fwd["x compile-best"].threshold == 1.0
    other_groups = compile_best(LARGE_G32, "bwd", 0.92)  # the same tensor with G32 is not the exception
    assert exc not in other_groups and other_groups["x compile-best"].passed is False
    assert compile_best(LARGE_SILU, "bwd", 0.92)["x compile-best"].passed is False


def peers(case: Case, direction: str, eager: float, compile_cl: float) -> dict:
    return checks_of(
        case, direction, {"ours-auto": 100.0, "eager": 100.0 * eager, "compile-cl": 100.0 * compile_cl}
    )


@pytest.mark.parametrize("case", [MID8, MID20, MID48, GAP100, LARGE_SILU, ON_CHIP])
def test_targets_eager_and_compile_cl_from_8_mib(case: Case) -> None:
    fwd_low, fwd_high = peers(case, "fwd", 4.9, 1.9), peers(case, "fwd", 5.1, 2.1)
    assert fwd_low["x eager"].threshold == 5.0 and fwd_low["x compile-cl"].threshold == 2.0
    assert fwd_low["x eager"].passed is False and fwd_low["x compile-cl"].passed is False
    assert fwd_high["x eager"].passed is True and fwd_high["x compile-cl"].passed is True
    bwd_low, bwd_high = peers(case, "bwd", 1.9, 0.5), peers(case, "bwd", 2.1, 0.5)
    assert bwd_low["x eager"].threshold == 2.0 and bwd_low["x eager"].passed is False
    assert bwd_high["x eager"].passed is True
    assert "x compile-cl" not in bwd_low  # issue 13 sets no compile-cl target for backward


@pytest.mark.parametrize("case", [SMALL, SMALL5])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_targets_no_eager_or_compile_cl_target_below_8_mib(case: Case, direction: str) -> None:
    checks = peers(case, direction, 1.0, 1.0)
    assert "x eager" not in checks and "x compile-cl" not in checks
    assert "x compile-best" in checks  # compile-cl alone is torch.compile's best layout here


def test_targets_fp32_reported_not_judged() -> None:
    times = {"ours-auto": us_at_sol(LARGE_SILU, "fwd", 0.3, "fp32"), "eager": 1.0, "compile-nchw": 1.0}
    fp32 = checks_of(LARGE_SILU, "fwd", times, "fp32")
    assert set(fp32) == {"large SOL", "x compile-best", "x eager"}
    assert all(c.status == "reported" and c.passed is None and not c.judged for c in fp32.values())
    assert fp32["large SOL"].value == pytest.approx(0.3) and fp32["large SOL"].met is False
    assert fp32["large SOL"].as_dict()["status"] == "reported"
    small = checks_of(SMALL, "fwd", {"ours-auto": 4.0}, "fp32")["small us"]
    assert small.status == "reported" and small.met is True and small.passed is None
    assert bench_targets.summarize_checks(list(fp32.values())) == {
        "PASS": 0,
        "MISS": 0,
        "n/a": 0,
        "reported": 3,
    }
    # the same numbers in bf16 are judged
    times16 = {"ours-auto": us_at_sol(LARGE_SILU, "fwd", 0.3, "bf16"), "eager": 1.0, "compile-nchw": 1.0}
    bf16 = checks_of(LARGE_SILU, "fwd", times16, "bf16")
    assert {c.status for c in bf16.values()} == {"MISS"}


def test_targets_summary_and_missing_data() -> None:
    res = results_for(MID48, "fwd", {"ours-auto": us_at_sol(MID48, "fwd", 0.7), "eager": 1.0})
    res.append(Result(MID48, "fp16", "fwd", "compile-cl", None, error="compile failed"))
    res.append(Result(MID48, "fp16", "fwd", "ours-1pass", None, error="boom"))
    res += results_for(SMALL, "bwd", {"ours-auto": 12.0}, "fp32")
    checks = bench_targets.check_targets(res, COPY_TBPS)
    fwd = by_target([c for c in checks if c.case == MID48.name])
    assert fwd["mid SOL"].passed is True and fwd["x eager"].passed is False
    assert (
        fwd["x compile-best"].status == "n/a" and fwd["x compile-cl"].status == "n/a"
    )  # failed compile: no pass
    assert bench_targets.summarize_checks(checks) == {"PASS": 1, "MISS": 1, "n/a": 3, "reported": 1}
    no_copy = by_target(bench_targets.check_targets(results_for(MID48, "fwd", {"ours-auto": 5.0}), None))
    assert no_copy["mid SOL"].passed is None and no_copy["mid SOL"].status == "n/a"
    # without ours-auto nothing is judged
    assert (
        bench_targets.check_targets(results_for(MID48, "fwd", {"ours-1pass": 1.0, "eager": 9.0}), 4.0) == []
    )


# ---------------------------------------------------------------- reports


def sample_report() -> bench_report.Report:
    results = results_for(LARGE, "fwd", {"ours-auto": 600.0, "ours-1pass": 320.0, "eager": 2000.0})
    results[0].plan = {"schedule": 2, "grid": 8192, "overflow_tiles": 0}
    results += results_for(SMALL, "bwd", {"ours-auto": 8.0, "eager": 100.0, "compile-nchw": 20.0})
    results.append(Result(SMALL, "fp16", "bwd", "compile-cl", None, error="RuntimeError: nope"))
    copy = {"nbytes": 1 << 30, "moved_bytes": 2 << 30, "tbps": 4.0}
    return bench_report.Report(
        date="2026-12-01 10:00 UTC",
        command="python -m gn_module.bench --quick",
        device={
            "cuda": True,
            "name": "NVIDIA H200",
            "sm_count": 132,
            "compute_capability": "9.0",
            "torch": "x",
        },
        copy=copy,
        results=results,
        checks=bench_targets.check_targets(results, 4.0),
        settings={"reps": 30},
    )


def test_table_rows() -> None:
    report = sample_report()
    header, rows = bench_report.table_rows(report.results, report.copy_tbps)
    assert header[:7] == ["shape", "dtype", "dir", "MiB", "ours auto us", "TB/s", "SOL"]
    assert "compile CL us" in header and "ours 2-pass us" not in header  # only measured implementations
    assert len(rows) == 2 and all(len(r) == len(header) for r in rows)
    large = dict(zip(header, rows[0], strict=True))
    assert large["MiB"] == "512.0" and large["ours auto us"] == "600.0" and large["eager CL us"] == "2000"
    assert large["TB/s"] == f"{2 * (512 << 20) / 600e-6 / 1e12:.2f}"
    assert large["SOL"] == f"{2 * (512 << 20) / 600e-6 / 1e12 / 4.0:.2f}"
    assert large["x eager"] == "3.3" and large["auto plan"] == "2p grid 8192"
    small = dict(zip(header, rows[1], strict=True))
    assert (
        small["compile CL us"] == "err"
        and small["x compile best"] == "2.50"
        and small["ours 1-pass us"] == "-"
    )


def test_console_and_markdown() -> None:
    report = sample_report()
    text = bench_report.render_console(report)
    assert "RuntimeError: nope" in text and "Speed targets" in text and "MISS" in text
    md = bench_report.render_markdown_report(report)
    assert "2026-12-01 10:00 UTC" in md and "`python -m gn_module.bench --quick`" in md
    assert "NVIDIA H200, 132 SMs" in md and "4.000 TB/s" in md
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 2 and table[1].startswith("|---")
    assert len({line.count("|") for line in table}) == 1  # every row has the header's column count


def test_json_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    bench_report.write_json(sample_report(), path)
    data = json.loads(path.read_text())
    assert data["copy_bandwidth"]["tbps"] == 4.0 and data["device"]["name"] == "NVIDIA H200"
    first = data["results"][0]
    assert first["impl"] == "ours-auto" and first["bytes"] == 2 * (512 << 20)
    assert first["sol_fraction"] == pytest.approx(first["tbps"] / 4.0) and first["size_class"] == "large"
    assert first["timing_us"]["median_us"] == 600.0 and first["plan"]["grid"] == 8192
    assert data["targets_summary"]["MISS"] >= 1 and any(r["error"] for r in data["results"])


def test_plot(tmp_path: Path) -> None:
    path = tmp_path / "chart.png"
    wrote = bench_report.write_plot(sample_report(), path)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert wrote is False and not path.exists()
    else:
        assert wrote is True and path.stat().st_size > 1000


# ---------------------------------------------------------------- device info


def test_parse_smi_line() -> None:
    info = bench_device.parse_smi_line("570.86.15, 1980, 3201, 1980, 3201, 700.00")
    assert info["driver_version"] == "570.86.15" and info["max_sm_clock_mhz"] == "1980"
    assert "power_limit_w" not in bench_device.parse_smi_line("570.1, 1980, 3201, 1980, 3201, [N/A]")
    with pytest.raises(ValueError):
        bench_device.parse_smi_line("570.1, 1980")


def test_device_label_without_cuda() -> None:
    assert "no CUDA" in bench_device.device_label({"cuda": False, "torch": "2.x"})
    if NO_CUDA:
        assert bench_device.device_info()["cuda"] is False


# ---------------------------------------------------------------- what is timed (on the CPU)

TINY = Case((2, 8, 3, 5), 4, "silu")


def test_prepare_eager_and_ours_forward_agree_on_cpu() -> None:
    eager = bench_impls.prepare("eager", TINY, "fp32", "fwd", "cpu")
    ours = bench_impls.prepare("ours-auto", TINY, "fp32", "fwd", "cpu")  # CPU: gn_module's native path
    x = eager.tensors[0]
    assert x.is_contiguous(memory_format=torch.channels_last)
    ref = torch.nn.functional.silu(torch.nn.functional.group_norm(x, 4, eager.tensors[1], eager.tensors[2]))
    torch.testing.assert_close(eager.fn(), ref)
    torch.testing.assert_close(ours.fn(), ref)


def test_prepare_autocast_rows_run_every_call_under_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    """An autocast row: bf16 x, float32 weight and bias, the call (and the backward's forward) under
    autocast on the row's device, whose output dtype the timed call returns."""
    seen = []
    real = bench_impls.reference

    def spy(x, groups, weight, bias, act):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return real(x, groups, weight, bias, act)

    monkeypatch.setattr(bench_impls, "reference", spy)
    fwd = bench_impls.prepare("eager", TINY, "bf16-autocast", "fwd", "cpu")
    x, w, b = fwd.tensors
    assert x.dtype == torch.bfloat16 and w.dtype == b.dtype == torch.float32
    y = fwd.fn()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = real(x, 4, w, b, "silu")
    assert y.dtype == expected.dtype and torch.equal(y, expected)
    bwd = bench_impls.prepare("eager", TINY, "bf16-autocast", "bwd", "cpu")
    dx, dw, db = bwd.fn()
    assert dx.dtype == torch.bfloat16 and dw.dtype == db.dtype == torch.float32
    assert seen and all(s == (True, torch.bfloat16) for s in seen)
    plain = bench_impls.prepare("eager", TINY, "bf16", "fwd", "cpu")
    seen.clear()
    plain.fn()
    assert seen == [(False, torch.get_autocast_dtype("cpu"))]


def test_prepare_backward_times_autograd_grad_repeatedly() -> None:
    p = bench_impls.prepare("eager", TINY, "fp32", "bwd", "cpu")
    first = p.fn()
    second = p.fn()  # retain_graph: the timed call can repeat
    assert [g.shape for g in first] == [torch.Size(TINY.shape), torch.Size([8]), torch.Size([8])]
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b)


def test_compiled_backward_repeats_and_matches_eager_on_cpu() -> None:
    """torch.compile's backward under retain_graph (donated buffers off), both layouts, same dy as eager."""
    eager = bench_impls.prepare("eager", TINY, "fp32", "bwd", "cpu").fn()
    for impl in ("compile-cl", "compile-nchw"):
        p = bench_impls.prepare(impl, TINY, "fp32", "bwd", "cpu")
        p.fn()
        for got, want in zip(p.fn(), eager, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    fwd = bench_impls.prepare("compile-nchw", TINY, "fp32", "fwd", "cpu")
    assert fwd.tensors[0].is_contiguous()
    eager_fwd = bench_impls.prepare("eager", TINY, "fp32", "fwd", "cpu").fn()
    torch.testing.assert_close(fwd.fn(), eager_fwd, rtol=1e-4, atol=1e-5)


def test_prepare_5d_and_errors() -> None:
    p = bench_impls.prepare("eager", Case((1, 4, 2, 3, 3), 2), "fp32", "fwd", "cpu")
    assert p.tensors[0].is_contiguous(memory_format=torch.channels_last_3d)
    nchw = bench_impls.make_inputs(TINY, "fp32", "cpu")[0].contiguous()
    assert nchw.is_contiguous()
    with pytest.raises(ValueError, match="implementation"):
        bench_impls.make_op("apex", TINY)
    with pytest.raises(ValueError, match="direction"):
        bench_impls.prepare("eager", TINY, "fp32", "up", "cpu")
    with pytest.raises(ValueError, match="dtype"):
        bench_impls.torch_dtype("fp8")


def test_run_case_reports_errors_instead_of_raising() -> None:
    if not NO_CUDA:
        pytest.skip("this machine has CUDA")
    settings = {"compile_mode": None, "reps": 3, "warmup": 1, "min_reps": 1, "max_seconds": 0.1}
    r = bench.run_case("eager", TINY, "fp32", "fwd", "cpu", settings, None)
    assert r.timing is None and "CUDA" in r.error and r.setup_s is not None


# ---------------------------------------------------------------- the pytest-benchmark timer glue


def test_virtual_clock() -> None:
    clock = VirtualClock()
    start = clock()
    clock.advance(2e-6)
    assert clock() - start == pytest.approx(2e-6) and clock.samples_s == [2e-6]
    with pytest.raises(ValueError):
        clock.advance(-1.0)
    with pytest.raises(RuntimeError, match="_timer"):
        install(object(), clock)


def test_pytest_benchmark_records_virtual_clock_times(tmp_path: Path) -> None:
    """Against the installed pytest-benchmark: its statistics are exactly the durations we report."""
    (tmp_path / "test_vc.py").write_text(
        textwrap.dedent(
            """
            import itertools
            import pytest
            from gn_module.bench.timer import run_pedantic

            def test_fake_gpu(benchmark):
                durations = itertools.cycle([10.0, 30.0, 20.0, 40.0, 50.0])
                samples = run_pedantic(benchmark, lambda: next(durations), rounds=5)
                assert samples == pytest.approx([10.0, 30.0, 20.0, 40.0, 50.0])
            """
        )
    )
    out = tmp_path / "bench.json"
    proc = run_module(
        "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:gn", f"--benchmark-json={out}",
        "test_vc.py", cwd=str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stats = json.loads(out.read_text())["benchmarks"][0]["stats"]
    assert stats["rounds"] == 5 and stats["iterations"] == 1
    assert stats["median"] == pytest.approx(30e-6) and stats["min"] == pytest.approx(10e-6)
    assert stats["max"] == pytest.approx(50e-6) and stats["mean"] == pytest.approx(30e-6)


def test_run_pedantic_rejects_zero_rounds() -> None:
    with pytest.raises(ValueError):
        run_pedantic(object(), lambda: 1.0, 0)


# ---------------------------------------------------------------- the command line


def test_help_works_without_cuda() -> None:
    proc = run_module("-m", "gn_module.bench", "--help")
    assert proc.returncode == 0, proc.stderr
    for flag in ("--shapes", "--dtypes", "--quick", "--json", "--markdown", "--plot", "exit status 3"):
        assert flag in proc.stdout
    assert "1x128x16x256x256-G32-silu" in proc.stdout


def test_without_cuda_exits_3_with_a_clear_message() -> None:
    if not NO_CUDA:
        pytest.skip("this machine has CUDA")
    proc = run_module("-m", "gn_module.bench", "--quick")
    assert proc.returncode == bench.EXIT_NO_CUDA == 3
    assert "no CUDA device" in proc.stderr and "Nothing was measured" in proc.stderr


@pytest.mark.parametrize(
    ("name", "expected", "stops"),
    [
        ("NVIDIA H200", "H200", False),
        ("NVIDIA H200 NVL", "h200", False),  # case aside
        ("NVIDIA H100 80GB HBM3", "H200", True),
        (None, "H200", True),  # no GPU is not it either
        ("NVIDIA H100 80GB HBM3", "", False),  # unset: any GPU
    ],
)
def test_unexpected_gpu(name: str | None, expected: str, stops: bool) -> None:
    why = bench_device.unexpected_gpu(name, expected)
    assert (why is not None) == stops
    if stops:
        assert expected in why and "GN_EXPECT_GPU" in why and str(name or "none") in why


class _PastTheCheck(Exception):
    """Raised by the first step after the GPU check: the run went on."""


def _fake_gpu(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A CUDA device called `name` as far as the CLIs' checks see; measuring anything raises _PastTheCheck."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark)  # (restored after)
    monkeypatch.setattr(timing, "cuda_device", lambda device: torch.device("cuda", 0))

    def past_the_check(*args: object, **kwargs: object) -> None:
        raise _PastTheCheck

    monkeypatch.setattr(bench_device, "device_info", past_the_check)


@pytest.mark.parametrize("command", [["--quick"], ["models", "--models", "vae"]])
def test_expect_gpu_stops_a_run_on_another_card(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """GN_EXPECT_GPU (as scripts/gpu_call.sh reads it): the benchmark and `bench models` exit 3 on another
    card before they measure anything, and go on on the card named."""
    _fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3")
    monkeypatch.setenv("GN_EXPECT_GPU", "H200")
    assert bench.main(command) == bench.EXIT_NO_CUDA == 3
    err = capsys.readouterr().err
    assert "'NVIDIA H100 80GB HBM3', not H200 (GN_EXPECT_GPU)" in err and "nothing was measured" in err
    monkeypatch.setenv("GN_EXPECT_GPU", "h100")
    with pytest.raises(_PastTheCheck):
        bench.main(command)
    monkeypatch.delenv("GN_EXPECT_GPU")
    with pytest.raises(_PastTheCheck):
        bench.main(command)


@pytest.mark.parametrize(
    "args",
    [["--dtypes", "fp64"], ["--impls", "apex"], ["--shapes", "9x9"], ["--reps", "0"], ["--directions", ""]],
)
def test_bad_arguments_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(args)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


class FakeTimer:
    can_delay = True
    delay_us = 20.0

    def __init__(self, device: object, flush: bool = True) -> None:
        self.device = device


def fake_gpu(monkeypatch: pytest.MonkeyPatch, floor_us: float) -> tuple[list[str], list[str]]:
    """Fake the CLI's GPU parts: every floor launch takes `floor_us`, ours-auto 4 us and eager 40 us (called
    in turn). Returns the lists the timed calls and the timed floor launches are appended to."""
    calls: list[str] = []
    floors: list[str] = []

    def fake_time_cuda(fn: object, **kwargs: object) -> Timing:
        fn()  # the prepared call really runs (on the CPU)
        if fn.__code__.co_filename.endswith("floor.py"):  # type: ignore[attr-defined]
            floors.append("t")
            return t(floor_us)
        calls.append("t")
        return t(4.0 if len(calls) % 2 else 40.0)  # ours-auto 4 us, eager 40 us

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Fake GPU")
    monkeypatch.setattr(timing, "cuda_device", lambda d: torch.device("cpu"))
    monkeypatch.setattr(timing, "EventTimer", FakeTimer)
    monkeypatch.setattr(timing, "time_cuda", fake_time_cuda)
    monkeypatch.setattr(
        timing, "copy_bandwidth", lambda n, timer: timing.CopyBandwidth(n, t(2 * n / 4e12 * 1e6))
    )
    monkeypatch.setattr(
        bench_device, "device_info", lambda d: {"cuda": True, "name": "Fake GPU", "sm_count": 2}
    )
    return calls, floors


@pytest.mark.parametrize("floor_us", [3.0, 8.0])
def test_main_end_to_end_with_a_fake_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], floor_us: float
) -> None:
    """The whole CLI flow (floors, prepare, time, table, targets, JSON, Markdown) with the GPU parts faked.

    A floor of 3 us leaves the small latency targets (6 and 10 us) as the issues set them; 8 us rules the
    forward's 6 us out, which is then judged at 8 / 0.9 us."""
    calls, floors = fake_gpu(monkeypatch, floor_us)
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    args = ["--shapes", "2x1280", "--dtypes", "fp32", "--impls", "ours-auto,eager", "--copy-mib", "1"]
    assert bench.main([*args, "--json", str(out_json), "--markdown", str(out_md)]) == 0
    printed = capsys.readouterr().out
    assert "copy bandwidth (SOL): 4.000 TB/s" in printed and "Speed targets" in printed
    data = json.loads(out_json.read_text())
    assert len(data["results"]) == 4 and len(calls) == 4  # fwd, bwd x ours-auto, eager
    assert len(floors) == 3  # forward: copy_ and neg; backward: add
    assert {(f["direction"], f["floor_us"]) for f in data["floors"]} == {("fwd", floor_us), ("bwd", floor_us)}
    assert f"fp32 fwd floor {floor_us:9.2f} us (copy_ {floor_us:.2f} us, neg {floor_us:.2f} us)" in printed
    assert {(r["direction"], r["impl"]) for r in data["results"]} == {
        (d, i) for d in ("fwd", "bwd") for i in ("ours-auto", "eager")
    }
    assert data["settings"]["dtypes"] == "fp32" and data["command"].endswith("--markdown " + str(out_md))
    by = {c["target"] + c["direction"]: c for c in data["targets"]}
    fwd = "small us" if floor_us < 6 else "small us, 90 % of the floor"
    assert set(by) == {fwd + "fwd", "small usbwd"}  # 5 MiB: no speedup target over eager below 8 MiB
    assert by[fwd + "fwd"]["value"] == 4.0 and by["small usbwd"]["value"] == 4.0
    assert by[fwd + "fwd"]["threshold"] == pytest.approx(6.0 if floor_us < 6 else floor_us / 0.9)
    assert by["small usbwd"]["threshold"] == 10.0 and by["small usbwd"]["note"] == ""
    if floor_us > 6:
        assert "issue: 6 us" in by[fwd + "fwd"]["note"] and "8.00 us" in by[fwd + "fwd"]["note"]
    assert {c["status"] for c in by.values()} == {"reported"} and by[fwd + "fwd"]["passed"] is None  # fp32
    assert data["targets_summary"] == {"PASS": 0, "MISS": 0, "n/a": 0, "reported": 2}
    assert "2 reported (fp32, not judged)" in printed
    md = out_md.read_text()
    assert "Fake GPU" in md and "| 2x1280x16x16-G32-silu | fp32 | fwd |" in md


def chain_floor_file(tmp_path: Path, device: str, fwd_us: float, ours_us: float) -> Path:
    """A chain_floor.py JSON with one fp32 forward row of 2x1280x16x16 (groups 32, SiLU)."""
    row = {"shape": "2x1280x16x16:silu", "dtype": "fp32", "direction": "fwd", "ours_us": ours_us}
    path = tmp_path / "chain.json"
    path.write_text(json.dumps({"device": device, "rows": [{**row, "best": {"us": fwd_us, "ok": True}}]}))
    return path


def test_main_judges_at_ninety_percent_of_a_chain_floor(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--chain-floors: a chain floor slower than the copy floor and the target (12 us against 3 and 6) sets
    the forward's small target at 12 / 0.9 us, names it, and lands in the JSON; the backward keeps its own."""
    fake_gpu(monkeypatch, 3.0)
    chain = chain_floor_file(tmp_path, "Fake GPU", 12.0, 15.0)
    out_json = tmp_path / "r.json"
    args = ["--shapes", "2x1280", "--dtypes", "fp32", "--impls", "ours-auto,eager", "--copy-mib", "1"]
    assert bench.main([*args, "--chain-floors", str(chain), "--json", str(out_json)]) == 0
    assert "fp32 fwd chain floor     12.00 us" in capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert data["chain_floors"] == [
        {"case": "2x1280x16x16-G32-silu", "dtype": "fp32", "direction": "fwd", "floor_us": 12.0}
    ]
    by = {c["target"] + c["direction"]: c for c in data["targets"]}
    assert set(by) == {"small us, 90 % of the chain floorfwd", "small usbwd"}
    fwd = by["small us, 90 % of the chain floorfwd"]
    assert fwd["threshold"] == pytest.approx(12.0 / 0.9) and "chain_floor.py" in fwd["note"]


def test_main_refuses_chain_floors_of_another_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_gpu(monkeypatch, 3.0)
    chain = chain_floor_file(tmp_path, "NVIDIA H100 80GB HBM3", 12.0, 15.0)
    with pytest.raises(SystemExit) as exc:
        bench.main(["--shapes", "2x1280", "--dtypes", "fp32", "--chain-floors", str(chain)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "measured on 'NVIDIA H100 80GB HBM3'" in err and "'Fake GPU'" in err


def test_main_without_floors_times_none(monkeypatch: pytest.MonkeyPatch) -> None:
    from gn_module.bench import cli

    parsed = cli.build_parser().parse_args(["--no-floors"])
    assert cli.resolve_settings(parsed)["floors"] is False
    assert cli.resolve_settings(cli.build_parser().parse_args([]))["floors"] is True


def test_plan_info_and_launch_record_with_a_fake_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib
    import types

    from gn_module import ops

    seen: list[tuple] = []

    def fake_plan(shape, groups, dtype, direction, schedule, device=None):  # type: ignore[no-untyped-def]
        seen.append((tuple(shape), groups, dtype, direction, schedule))
        return types.SimpleNamespace(schedule=1 if schedule == "auto" else schedule, grid=132, tiles=400,
                                     overflow_tiles=268, residency=132, waves=4, cap=None)  # fmt: skip

    monkeypatch.setattr(ops, "plan", fake_plan, raising=False)
    info = bench_impls.plan_info("ours-auto", TINY, "fp16", "bwd", "cpu")
    assert info == {"schedule": 1, "grid": 132, "tiles": 400, "overflow_tiles": 268, "residency": 132,
                    "waves": 4, "cap": None}  # fmt: skip
    assert seen == [((2, 8, 3, 5), 4, torch.float16, "bwd", "auto")]
    assert bench_impls.plan_info("ours-2pass", TINY, "fp16", "fwd", "cpu")["schedule"] == 2

    state: dict = {}

    @contextlib.contextmanager
    def recording():  # type: ignore[no-untyped-def]
        state["rec"] = {}
        yield state["rec"]

    calls: list[int] = []

    def fn() -> None:  # a launch fills the active record, as ops._run does
        calls.append(1)
        state["rec"]["fwd"] = {"grid": 132, "tiles_applied": 400, "plan": object()}

    monkeypatch.setattr(ops, "launch_record", recording, raising=False)
    plan = bench_impls.with_launch({"schedule": 1}, fn, "fwd")
    assert calls == [1] and plan == {"schedule": 1, "launched": {"grid": 132, "tiles_applied": 400}}
    assert bench_impls.with_launch(None, fn, "fwd") is None and calls == [1]
