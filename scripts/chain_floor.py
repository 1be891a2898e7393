"""The small shapes' chain floor (GPU): how fast can any kernel read x, reduce each group, and write y?

    python scripts/chain_floor.py [--shapes 2x1280x16x16:silu,2x640x32x32:silu,...] [--json PATH]

Builds benchmarks/micro/chain_floor.cu with nvcc (this GPU's arch, sm_90 or newer: it uses thread-block
clusters) and times its GroupNorm forward with the benchmark's timer (CUDA events, L2 flushed, a GPU spin
ahead, median) over a grid of geometries per shape: task windows W (whole groups, 16-byte vectors), cluster
sizes K (blocks per task; 1 = a block per task, no wait at all) and block sizes. Every geometry is first run
once with y poisoned (NaN) and checked against an fp64 GroupNorm, so no geometry that skips work is timed.

Beside the best geometry, in the same run: `ours auto` (gn_module.group_norm), the copy floor (the faster of
`y.copy_(x)` and `torch.neg(x, out=y)`: one launch moving the same bytes, bench.floor's), and an empty kernel
on the best geometry's grid of clusters (the launch's own share). The kernel keeps each thread's rows in
registers (one batch of loads), folds a block's sums in shared memory and exchanges the cluster's over
distributed shared memory (the best geometry is timed again exchanging them through global memory, as
gn_module's cluster teams do): it is the chain stripped of everything else, so what it takes is what a read,
a reduction across blocks and a write cost on these shapes here.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import subprocess
import sys
import tempfile

import torch

import gn_module
from gn_module.bench.timing import EventTimer, time_cuda

sys.path.insert(0, os.path.dirname(__file__))
from time_shapes import parse

SOURCE = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "micro", "chain_floor.cu")
DEFAULT_SHAPES = "2x1280x16x16:silu,2x640x32x32:silu,2x320x64x64:silu,1x512x128x128:silu"
CLUSTERS = (1, 2, 4, 8, 16)
THREADS = (128, 256, 512, 1024)
EPS = 1e-5


def build(workdir: str) -> ctypes.CDLL:
    major, minor = torch.cuda.get_device_capability()
    if major < 9:
        raise SystemExit(f"chain_floor needs thread-block clusters (sm_90+); this GPU is sm_{major}{minor}")
    lib = os.path.join(workdir, "libchain_floor.so")
    nvcc = os.environ.get("NVCC", "nvcc")
    arch = f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"
    cmd = [nvcc, "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", arch, "-Xptxas", "-v", SOURCE]
    cmd += ["-o", lib]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"nvcc failed:\n{done.stderr}")
    lines = done.stderr.splitlines()
    spills = [line.strip() for line in lines if "spill" in line and " 0 bytes spill stores" not in line]
    if spills:
        print("WARNING: ptxas spills:", *spills, sep="\n  ")
    cdll = ctypes.CDLL(lib)
    cdll.chain_vectors.argtypes = [ctypes.c_longlong] + [ctypes.c_int] * 5
    # (x, y, w, b, batch, rows, C, cpg, window, cluster, threads, silu, eps, exchange, stream)
    pointers, longs, ints = [ctypes.c_void_p] * 4, [ctypes.c_longlong] * 2, [ctypes.c_int] * 6
    cdll.chain_launch.argtypes = pointers + longs + ints + [ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p]
    cdll.chain_empty_launch.argtypes = [ctypes.c_int] * 3 + [ctypes.c_void_p]
    return cdll


def windows(c: int, cpg: int, most: int = 4) -> list[int]:
    """Task windows: whole groups of 16-byte vectors that divide C, narrowest first, at most 512 channels."""
    out = [w for w in range(cpg, min(c, 512) + 1, cpg) if c % w == 0 and w % 8 == 0]
    return out[:most]


def reference(
    x: torch.Tensor, groups: int, w: torch.Tensor, b: torch.Tensor, act: str | None
) -> torch.Tensor:
    y = torch.nn.functional.group_norm(x.double(), groups, w.double(), b.double(), EPS)
    return torch.nn.functional.silu(y) if act == "silu" else y


def sweep_shape(lib: ctypes.CDLL, spec: str, timer: EventTimer) -> dict | None:
    """Every geometry of one shape, checked and timed; the best beside ours, the copy floor and the launch."""
    shape, groups, act = parse(spec)
    if act not in (None, "silu"):
        raise SystemExit(f"{spec}: the chain kernel has SiLU or no activation")
    dev = timer.device
    n, c = shape[0], shape[1]
    rows = math.prod(shape[2:])
    cpg = c // groups
    x = torch.randn(shape, device=dev, dtype=torch.float16).to(memory_format=torch.channels_last)
    w = (1 + 0.5 * torch.randn(c, device=dev)).half()
    b = (0.5 * torch.randn(c, device=dev)).half()
    y = torch.empty_like(x)
    ref = reference(x, groups, w, b, act)
    silu = int(act == "silu")
    pointers = (x.data_ptr(), y.data_ptr(), w.data_ptr(), b.data_ptr(), n, rows, c, cpg)

    def launch(window: int, cluster: int, threads: int, exchange: int | None = None) -> None:
        rc = lib.chain_launch(*pointers, window, cluster, threads, silu, EPS, exchange, current_stream())
        if rc:
            raise RuntimeError(f"launch failed: {rc}")

    results = []
    for window in windows(c, cpg):
        for cluster in CLUSTERS:
            for threads in THREADS:
                if lib.chain_vectors(rows, c, cpg, window, cluster, threads) <= 0:
                    continue
                geometry = {"window": window, "cluster": cluster, "threads": threads}
                y.fill_(float("nan"))
                try:
                    launch(**geometry)
                    torch.cuda.synchronize()
                except RuntimeError as err:  # e.g. clusters of 16 that cannot be placed
                    print(f"{spec} {geometry}: {err}")
                    continue
                err = ((y.double() - ref).abs() - 1e-2 * ref.abs()).max().item()
                ok = bool(torch.isfinite(y).all().item()) and err <= 2e-2
                us = timed(lambda g=geometry: launch(**g), timer) if ok else float("nan")
                grid = n * (c // window) * cluster
                results.append({**geometry, "grid": grid, "us": round(us, 2), "ok": ok, "err": err})
                print(
                    f"{spec:22} W={window:<4} K={cluster:<3} T={threads:<5} grid {grid:<5} "
                    f"{us:7.2f} us {'ok' if ok else 'WRONG'} (err {err:.2e})",
                    flush=True,
                )
    good = [r for r in results if r["ok"]]
    if not good:
        print(f"{spec}: no geometry passed")
        return None
    best = min(good, key=lambda r: r["us"])

    def empty() -> None:
        rc = lib.chain_empty_launch(best["grid"], best["threads"], best["cluster"], current_stream())
        if rc:
            raise RuntimeError(f"launch failed: {rc}")

    def ours() -> torch.Tensor:
        with torch.no_grad():
            return gn_module.group_norm(x, groups, w, b, EPS, act)

    # the best geometry again, its blocks' sums exchanged through global memory as gn_module's clusters do
    exchange = torch.empty(2 * best["grid"] * lib.chain_exchange_per_block(), device=dev)
    geometry = {k: best[k] for k in ("window", "cluster", "threads")}
    y.fill_(float("nan"))
    launch(**geometry, exchange=exchange.data_ptr())
    global_ok = bool(torch.isfinite(y).all().item())
    global_us = timed(lambda: launch(**geometry, exchange=exchange.data_ptr()), timer)
    copy_us = min(timed(lambda: y.copy_(x), timer), timed(lambda: torch.neg(x, out=y), timer))
    row = {
        "shape": spec,
        "best": best,
        "ours_us": round(timed(ours, timer), 2),
        "copy_floor_us": round(copy_us, 2),
        "empty_launch_us": round(timed(empty, timer), 2),
        "global_exchange_us": round(global_us, 2),
        "global_exchange_ok": global_ok,
        "geometries": results,
    }
    print(
        f"== {spec}: chain floor {best['us']:.2f} us (W={best['window']} K={best['cluster']} "
        f"T={best['threads']}, grid {best['grid']}); ours auto {row['ours_us']:.2f}; copy floor "
        f"{row['copy_floor_us']:.2f}; empty launch of that grid {row['empty_launch_us']:.2f}; "
        f"its sums through global memory {global_us:.2f} ({'ok' if global_ok else 'WRONG'})",
        flush=True,
    )
    return row


def current_stream() -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def timed(fn, timer: EventTimer) -> float:
    return time_cuda(fn, reps=100, warmup=5, min_reps=30, max_seconds=0.15, timer=timer).median_us


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--json")
    args = ap.parse_args()
    timer = EventTimer(torch.device("cuda", torch.cuda.current_device()))
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(tmp)
        rows = [sweep_shape(lib, spec, timer) for spec in args.shapes.split(",")]
    if args.json:
        with open(args.json, "w") as fh:
            out = {"device": torch.cuda.get_device_name(), "rows": [r for r in rows if r is not None]}
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
