"""The examples run end to end on the CPU (CI smoke test)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_example(script: str, *args: str, cwd: Path, returncode: int = 0) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    # Works whether or not the package is installed.
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["CUDA_VISIBLE_DEVICES"] = ""  # the smoke test is the CPU path, even on a GPU machine
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == returncode, f"{script} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_train_unet_tiny_swap_matches_no_swap(tmp_path):
    results = {}
    for flag in ("--swap", "--no-swap"):
        log = tmp_path / f"{flag}.json"
        out = run_example("train_unet.py", "--tiny", flag, "--loss-log", str(log), cwd=tmp_path).stdout
        assert "steps/s:" in out and "peak memory:" in out and "final loss:" in out
        results[flag] = json.loads(log.read_text())
    swapped, plain = results["--swap"], results["--no-swap"]
    assert swapped["swap_summary"]["swapped"] > 0 and swapped["swap_summary"]["fused"] > 0
    assert len(swapped["losses"]) == swapped["steps"]
    assert all(math.isfinite(v) for v in swapped["losses"]) and swapped["steps_per_s"] > 0
    # On the CPU both runs use torch's GroupNorm: the swap must not change training at all.
    assert swapped["losses"] == plain["losses"]


def test_convert_model_example(tmp_path):
    out = run_example("convert_model.py", cwd=tmp_path).stdout
    assert "convert_groupnorm: swapped 2, fused 1" in out
    assert "back to torch.nn layers: ['Conv2d', 'GroupNorm', 'SiLU', 'Conv2d', 'GroupNorm', 'Conv2d']" in out


def test_train_unet_bad_groups_is_an_argument_error(tmp_path):
    proc = run_example("train_unet.py", "--tiny", "--groups", "5", cwd=tmp_path, returncode=2)
    message = "--groups 5 must divide every width in --channels; it does not divide [32, 64]"
    assert f"train_unet.py: error: {message}" in proc.stderr
    assert "Traceback" not in proc.stderr
