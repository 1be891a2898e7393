"""scripts/launch_timeline.py without a GPU: the summary of a traced call (times from the first block's start,
the launches' balance) and the refusal to run on a build whose trace points read per-SM clocks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "launch_timeline.py"
lt = load_script("launch_timeline")


def trace(rows: list[dict[int, int]]) -> torch.Tensor:
    """A (blocks + 2 spare rows, 16) trace buffer: ns at the given points, -1 elsewhere."""
    t = torch.full((len(rows) + 2, 16), -1, dtype=torch.int64)
    for i, points in enumerate(rows):
        for p, ns in points.items():
            t[i, p] = ns
    return t


def test_times_count_from_the_first_block_start_and_balance_is_mean_over_max() -> None:
    t = trace(
        [
            {0: 1000, 6: 3000, 8: 91000, 15: 98000, 9: 2000, 10: 100000, 11: 200000},
            {0: 1500, 6: 4000, 8: 81000, 15: 83000, 9: 2500, 10: 100000, 11: 190000},
        ]
    )
    lines = lt.summarize(t, lt.FORWARD, lt.FORWARD_STREAMS)
    start = next(s for s in lines if "stats: start" in s)
    # min / median (torch's: the lower of two) / max; the spare rows left out
    assert start.split()[2:5] == ["0.00", "0.00", "0.50"] and "(2 blocks)" in start
    end = next(s for s in lines if "apply: end" in s)
    assert end.split()[2:5] == ["189.00", "189.00", "199.00"]
    apply = next(s for s in lines if s.strip().startswith("apply, whole block"))
    assert apply.endswith(f"balance {95.0 / 100.0:.3f}")  # (100 + 90) / 2 over the slower block's 100 us
    assert not any("combined" in s for s in lines)  # no block reached point 13


def test_a_call_whose_launches_took_no_trace_says_so() -> None:
    assert lt.summarize(trace([{}]), lt.BACKWARD, lt.BACKWARD_STREAMS) == [
        "  (not traced: this call's launches took another route)"
    ]


def test_the_script_refuses_a_build_without_the_global_clock() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GN_NVCC_FLAGS"}
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2 and "-DGN_TRACE_TIMELINE" in out.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the exit without a CUDA device")
def test_the_script_exits_3_without_a_gpu() -> None:
    env = dict(os.environ, GN_NVCC_FLAGS="-DGN_TRACE_TIMELINE", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 3 and "needs a CUDA device" in out.stderr


@pytest.mark.parametrize("script", ["launch_timeline.py", "profile_tasks.py"])
def test_launch_scripts_flush_l2_by_reading_as_the_benchmark_does(script: str) -> None:
    # A write flush (zeroing a buffer) leaves the L2 full of dirty lines whose write-back lands inside the
    # measured launch (about 9 us on a 512 MiB read stream on the H200): these scripts' launch times and
    # timelines must see what the benchmark's timed calls see.
    source = (ROOT / "scripts" / script).read_text()
    assert "l2_read_flush()" in source
    assert ".zero_()" not in source


def test_l2_read_flush_is_the_benchmark_timers_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    from gn_module.bench import timing

    made = []

    class FakeTimer:
        def __init__(self, device: object = None) -> None:
            made.append(device)

        def flush(self) -> None:
            made.append("flushed")

    monkeypatch.setattr(timing, "EventTimer", FakeTimer)
    flush = timing.l2_read_flush("cuda:1")
    flush()
    assert made == ["cuda:1", "flushed"]
