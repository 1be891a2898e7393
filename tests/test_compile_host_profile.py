"""scripts/compile_host_profile.py without a GPU: its arguments, its report of a profile, and a clear exit
where there is no CUDA device (the profile itself runs on the GPU machine)."""

from __future__ import annotations

import cProfile
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "compile_host_profile.py"
chp = load_script("compile_host_profile")


def test_defaults_are_the_compiled_unet_rows() -> None:
    args = chp.parse_args([])
    assert (args.model, args.precision, args.configs, args.compile_mode) == (
        "unet",
        "bf16",
        "channels_last,swapped",
        None,
    )
    assert chp.parse_args(["--compile-mode", "reduce-overhead"]).compile_mode == "reduce-overhead"


def test_the_report_lists_the_hot_functions_and_ours() -> None:
    def busy() -> int:
        return sum(i * i for i in range(20000))

    prof = cProfile.Profile()
    prof.enable()
    busy()
    prof.disable()
    text = chp.profile_text(prof, 5, 1)
    assert text.startswith("(per 1 steps)") and "busy" in text and "gn_module's functions" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the exit without a CUDA device")
def test_without_a_gpu_it_says_so(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--code-dir", str(tmp_path / "code")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 2 and "needs a CUDA device" in proc.stderr
    assert (tmp_path / "code").is_dir()
