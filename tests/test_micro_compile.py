"""The design microbenchmarks (benchmarks/micro: gn_micro.cu, chain_floor.cu) build for sm_90, without spills.

They run on a GPU only when a session asks a design question (`bash benchmarks/micro/run.sh`), so a
compile error would otherwise surface in the middle of a session's device time. Runs wherever nvcc is
installed (no GPU needed) and skips with the reason otherwise.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path

import pytest

from gn_module import resources

MICRO_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "micro"
MICRO = MICRO_DIR / "gn_micro.cu"
CHAIN = MICRO_DIR / "chain_floor.cu"  # scripts/chain_floor.py's kernel, a shared library


def build_sm90(source: Path, output: Path, *extra: str) -> str:
    """nvcc's ptxas report of `source` built for sm_90; fails on any spill or stack frame."""
    try:
        nvcc = resources.find_nvcc()
    except resources.NvccNotFound as exc:
        pytest.skip(str(exc))
    cmd = [str(nvcc), "-O3", "-std=c++17", "-gencode=arch=compute_90,code=sm_90", "-Xptxas", "-v", *extra]
    cmd += [str(source), "-o", str(output)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    frame = r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
    frames = re.findall(frame, done.stderr)
    assert frames, "ptxas reported no kernels"
    spilling = [f for f in frames if any(int(v) for v in f)]
    assert not spilling, f"{len(spilling)} kernels use a stack frame or spill: {spilling}"
    return done.stderr


def test_micro_builds_for_sm90_without_spills(tmp_path: Path) -> None:
    report = build_sm90(MICRO, tmp_path / "gn_micro")
    assert "k_copy_bulk" in report and "k_onchip" in report  # the sections' kernels were built


def test_chain_floor_builds_and_sizes_its_geometries(tmp_path: Path) -> None:
    """The chain floor's kernels (fp16 and bf16) build without spills, and its host-side geometry rule (no GPU
    needed) gives each block's rows to its threads in as few 16-byte vectors as its registers allow, or
    refuses."""
    lib_path = tmp_path / "libchain_floor.so"
    report = build_sm90(CHAIN, lib_path, "-shared", "-Xcompiler", "-fPIC")
    for dtype in ("6__half", "13__nv_bfloat16"):  # one kernel per vector count and dtype
        assert report.count(f"chain_gnI{dtype}") >= 5 and report.count(f"chain_bwdI{dtype}") >= 6, dtype
    lib = ctypes.CDLL(str(lib_path))
    lib.chain_vectors.argtypes = [ctypes.c_longlong] + [ctypes.c_int] * 6

    def vectors(
        *geometry: int, bf16: int = 0
    ) -> int:  # (rows, C, channels per group, window, cluster, threads)
        return lib.chain_vectors(*geometry, bf16)

    # 2x1280x16x16 G32: 256 rows, 40-channel windows (5 vectors a row) over 2 blocks of 160 threads
    assert vectors(256, 1280, 40, 40, 2, 160) == 4  # 128 rows, 32 at a time
    assert vectors(256, 1280, 40, 40, 2, 640) == 1
    # 1x512x128x128 G32: 16384 rows, 32-channel windows (4 vectors a row) in clusters of 16: 1024 rows a block
    assert vectors(16384, 512, 16, 32, 16, 1024) == 4  # 256 rows at a time
    assert vectors(16384, 512, 16, 32, 16, 1024, bf16=1) == 0  # bf16: 4 vectors only in 512 threads
    assert vectors(16384, 512, 16, 32, 16, 256) == 16  # 64 at a time
    assert vectors(16384, 512, 16, 32, 16, 512) == 8
    assert vectors(16384, 512, 16, 32, 8, 512) == 0  # 16 vectors: not in 512 threads' registers
    assert vectors(16384, 512, 16, 64, 16, 256) == 0  # 32 vectors a thread: more than any block holds
    # geometries it refuses: a window of partial groups, of partial vectors, that does not divide C;
    # clusters beyond 16; blocks beyond 1024 threads or not whole warps
    for bad in [
        (256, 1280, 40, 60, 2, 256),
        (256, 1280, 40, 20, 2, 256),
        (256, 1280, 40, 240, 2, 256),
        (256, 1280, 40, 40, 32, 256),
        (256, 1280, 40, 40, 2, 2048),
        (256, 1280, 40, 40, 2, 100),
    ]:
        assert vectors(*bad) == -1, bad
    # the backward: a cluster holds every sample of its window (batch x blocks per sample <= 16)
    lib.chain_bwd_vectors.argtypes = [ctypes.c_longlong] * 2 + [ctypes.c_int] * 6

    def bwd(
        *geometry: int, bf16: int = 0
    ) -> int:  # (batch, rows, C, cpg, window, blocks per sample, threads)
        return lib.chain_bwd_vectors(*geometry, bf16)

    assert bwd(2, 4096, 320, 10, 40, 8, 512) == 6  # 2x320x64x64: 512 rows a block, 102 at a time
    assert bwd(2, 4096, 320, 10, 40, 8, 512, bf16=1) == 0  # bf16: 6 vectors only in 256 threads
    assert bwd(2, 4096, 320, 10, 40, 8, 1024) == 0  # 3 vectors of x and dy: not in 1024 threads' registers
    assert bwd(2, 4096, 320, 10, 40, 16, 512) == -1  # 2 x 16 blocks: more than a cluster
    assert bwd(1, 16384, 512, 16, 32, 16, 256) == 0  # 1024 rows, 64 at a time: 16 vectors, more than it holds
    assert bwd(1, 16384, 512, 16, 16, 16, 256) == 8  # 128 at a time
    assert bwd(2, 256, 1280, 40, 640, 1, 256) == -1  # a window beyond 512 channels
