"""The design microbenchmarks (benchmarks/micro/gn_micro.cu) still build for sm_90, without spills.

They run on a GPU only when a session asks a design question (`bash benchmarks/micro/run.sh`), so a
compile error would otherwise surface in the middle of a session's device time. Runs wherever nvcc is
installed (no GPU needed) and skips with the reason otherwise.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from gn_module import resources

MICRO = Path(__file__).resolve().parents[1] / "benchmarks" / "micro" / "gn_micro.cu"


def test_micro_builds_for_sm90_without_spills(tmp_path: Path) -> None:
    try:
        nvcc = resources.find_nvcc()
    except resources.NvccNotFound as exc:
        pytest.skip(str(exc))
    cmd = [str(nvcc), "-O3", "-std=c++17", "-gencode=arch=compute_90,code=sm_90", "-Xptxas", "-v"]
    cmd += [str(MICRO), "-o", str(tmp_path / "gn_micro")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    frame = r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
    frames = re.findall(frame, done.stderr)
    assert frames, "ptxas reported no kernels"
    spilling = [f for f in frames if any(int(v) for v in f)]
    assert not spilling, f"{len(spilling)} kernels use a stack frame or spill: {spilling}"
    assert "k_copy_bulk" in done.stderr and "k_onchip" in done.stderr  # the sections' kernels were built
