"""scripts/copy_floor.py without a GPU: which target a measured floor rules out, and what it becomes
(90 % of the floor), and a clear exit where there is no CUDA device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from script_loader import load_script

from gn_module.bench.cases import Case, bytes_moved
from gn_module.bench.timing import throughput_tbps

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "copy_floor.py"
cf = load_script("copy_floor")

COPY_TBPS = 4.25
MID16 = Case((1, 512, 128, 128), 32, "silu")  # 16 MiB fp16: mid, <= 24 MiB
SMALL = Case((2, 1280, 16, 16), 32, "silu")
ON_CHIP = Case((32, 128, 256, 256), 32)


def us_at_sol(case: Case, direction: str, sol: float) -> float:
    return bytes_moved(case, "fp16", direction) / (sol * COPY_TBPS * 1e12) * 1e6


def test_a_floor_below_the_target_makes_it_ninety_percent_of_the_floor() -> None:
    row = cf.limit_row(MID16, "fp16", "fwd", us_at_sol(MID16, "fwd", 0.70), COPY_TBPS)
    assert row["target"] == "mid SOL (<=24MiB) >= 0.75" and row["reachable"] is False
    assert row["limit_target"] == ">= 0.630"
    assert row["floor_sol"] == pytest.approx(0.70)


def test_a_floor_above_the_target_leaves_it() -> None:
    row = cf.limit_row(ON_CHIP, "fp16", "bwd", us_at_sol(ON_CHIP, "bwd", 0.95), COPY_TBPS)
    assert row["target"] == "large SOL (sample <=24MiB) >= 0.75" and row["reachable"] is True
    assert "limit_target" not in row


@pytest.mark.parametrize(
    ("direction", "floor_us", "limit"), [("fwd", 5.0, None), ("bwd", 10.8, "<= 12.0 us")]
)
def test_small_shapes_are_judged_by_latency(direction: str, floor_us: float, limit: str | None) -> None:
    row = cf.limit_row(SMALL, "fp16", direction, floor_us, COPY_TBPS)
    assert row["class"] == "small"
    assert row.get("limit_target") == limit
    assert row["reachable"] is (limit is None)


def test_floor_sol_is_bytes_over_time_over_copy_bandwidth() -> None:
    us = 10.0
    row = cf.limit_row(MID16, "fp16", "bwd", us, COPY_TBPS)
    assert row["floor_sol"] == pytest.approx(
        throughput_tbps(bytes_moved(MID16, "fp16", "bwd"), us) / COPY_TBPS
    )


def test_exits_3_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the script would time instead")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 3 and "needs a CUDA device" in proc.stderr
