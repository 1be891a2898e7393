"""The small shapes' chain floor (GPU): how fast can any kernel read x, reduce each group, and write y?

    python scripts/chain_floor.py [--shapes 2x1280x16x16:silu,...] [--directions fwd,bwd] [--dtypes fp16,bf16]
        [--json PATH]

Builds benchmarks/micro/chain_floor.cu with nvcc (this GPU's arch, sm_90 or newer: it uses thread-block
clusters) and times its GroupNorm (fp16 or bf16) forward with the benchmark's timer (CUDA events, L2
flushed, a GPU spin ahead, median) over a grid of geometries per shape: task windows W (whole groups, 16-byte
vectors), cluster sizes K (blocks per task; 1 = a block per task, no wait at all) and block sizes. Every
geometry is first run once with y poisoned (NaN) and checked against an fp64 GroupNorm, so no geometry that
skips work is timed.

Beside the best geometry, in the same run: `ours auto` (gn_module.group_norm, the benchmark's calls), the copy
floor (bench.floor's launches moving the same bytes: `y.copy_(x)` or `torch.neg(x, out=y)`, the backward
`torch.add(x, dy, out=dx)`), and an empty kernel on the best geometry's grid of clusters (the launch's own
share). The backward kernel (`chain_bwd`) takes the forward's saved statistics, gives each cluster a window of
channels over all samples (so dweight and dbias need no second level; batch x blocks per sample <= 16) and
writes dx, dweight and dbias, all checked against fp64 autograd. The kernel keeps each thread's rows in
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
from collections.abc import Callable
from dataclasses import dataclass

import torch

import gn_module
from gn_module import resources
from gn_module.bench.chain_floors import case_name
from gn_module.bench.timing import EventTimer, time_cuda

sys.path.insert(0, os.path.dirname(__file__))
from time_shapes import parse

SOURCE = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "micro", "chain_floor.cu")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
DEFAULT_SHAPES = "2x1280x16x16:silu,2x640x32x32:silu,2x320x64x64:silu,1x512x128x128:silu"
CLUSTERS = (1, 2, 3, 4, 6, 8, 12, 16)  # (6: 2x1280x16x16's teams)
THREADS = (128, 256, 512, 1024)
EPS = 1e-5


def build(workdir: str) -> ctypes.CDLL:
    major, minor = torch.cuda.get_device_capability()
    if major < 9:
        raise SystemExit(f"chain_floor needs thread-block clusters (sm_90+); this GPU is sm_{major}{minor}")
    lib = os.path.join(workdir, "libchain_floor.so")
    nvcc = os.environ.get("NVCC") or str(resources.find_nvcc())  # (as gn_module's own build finds it)
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
    cdll.chain_vectors.argtypes = [ctypes.c_longlong] + [ctypes.c_int] * 6
    # (x, y, w, b, batch, rows, C, cpg, window, cluster, threads, silu, eps, exchange, bf16, stream)
    pointers, longs, ints = [ctypes.c_void_p] * 4, [ctypes.c_longlong] * 2, [ctypes.c_int] * 6
    tail = [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    cdll.chain_launch.argtypes = pointers + longs + ints + tail
    cdll.chain_empty_launch.argtypes = [ctypes.c_int] * 3 + [ctypes.c_void_p]
    cdll.chain_bwd_vectors.argtypes = [ctypes.c_longlong] * 2 + [ctypes.c_int] * 6
    # (x, dy, dx, w, b, mean, rstd, dw, db, batch, rows, C, cpg, window, per_sample, threads, silu, bf16,
    # stream)
    cdll.chain_bwd_launch.argtypes = [ctypes.c_void_p] * 9 + longs + [ctypes.c_int] * 7 + [ctypes.c_void_p]
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


def excess(got: torch.Tensor, ref: torch.Tensor) -> float:
    """How far `got` strays beyond a 1 % relative band around the fp64 `ref` (inf for a non-finite value)."""
    if not bool(torch.isfinite(got).all().item()):
        return math.inf
    return ((got.double() - ref).abs() - 1e-2 * ref.abs()).max().item()


def current_stream() -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def timed(fn: Callable[[], object], timer: EventTimer) -> float:
    return time_cuda(fn, reps=100, warmup=5, min_reps=30, max_seconds=0.15, timer=timer).median_us


def checked(rc: int) -> None:
    if rc:
        raise RuntimeError(f"launch failed: {rc}")


def sweep(
    label: str,
    geometries: list[dict],
    launch: Callable[..., None],
    error: Callable[[], float],
    poison: Callable[[], None],
    timer: EventTimer,
) -> tuple[list[dict], dict | None]:
    """Runs each geometry once on poisoned outputs, checks it (`error()` <= 2e-2), times the ones that
    pass; returns every row and the fastest that passed."""
    results = []
    for geometry in geometries:
        poison()
        try:
            launch(**geometry)
            torch.cuda.synchronize()
        except RuntimeError as err:  # e.g. clusters of 16 that cannot be placed
            print(f"{label} {geometry}: {err}")
            continue
        err = error()
        ok = err <= 2e-2
        us = timed(lambda g=geometry: launch(**g), timer) if ok else math.nan
        results.append({**geometry, "us": round(us, 2), "ok": ok, "err": err})
        shown = " ".join(f"{k}={v}" for k, v in geometry.items())
        print(f"{label:26} {shown:48} {us:7.2f} us {'ok' if ok else 'WRONG'} (err {err:.2e})", flush=True)
    good = [r for r in results if r["ok"]]
    if not good:
        print(f"{label}: no geometry passed")
    return results, min(good, key=lambda r: r["us"]) if good else None


@dataclass(frozen=True)
class Problem:
    """One shape's geometry and fresh 16-bit inputs: x (channels_last), weight around 1, bias around 0."""

    n: int
    c: int
    rows: int  # H x W (x D)
    groups: int
    act: str | None
    x: torch.Tensor
    w: torch.Tensor
    b: torch.Tensor

    @property
    def cpg(self) -> int:
        return self.c // self.groups

    @property
    def bf16(self) -> int:
        return int(self.x.dtype == torch.bfloat16)

    @staticmethod
    def of(spec: str, dtype: str, dev: torch.device) -> Problem:
        shape, groups, act = parse(spec)
        c = shape[1]
        dt = DTYPES[dtype]
        x = torch.randn(shape, device=dev, dtype=dt).to(memory_format=torch.channels_last)
        w = (1 + 0.5 * torch.randn(c, device=dev)).to(dt)
        b = (0.5 * torch.randn(c, device=dev)).to(dt)
        return Problem(shape[0], c, math.prod(shape[2:]), groups, act, x, w, b)


def forward_row(lib: ctypes.CDLL, spec: str, dtype: str, timer: EventTimer) -> dict | None:
    """Every forward geometry of one shape; the best beside ours, the copy floor, the empty launch, and the
    best again exchanging its sums through global memory (as gn_module's cluster teams do)."""
    p = Problem.of(spec, dtype, timer.device)
    n, c, rows, cpg, groups, act, x, w, b = p.n, p.c, p.rows, p.cpg, p.groups, p.act, p.x, p.w, p.b
    dev = timer.device
    y = torch.empty_like(x)
    ref = reference(x, groups, w, b, act)
    head = (x.data_ptr(), y.data_ptr(), w.data_ptr(), b.data_ptr(), n, rows, c, cpg)
    silu = int(act == "silu")

    def launch(window: int, cluster: int, threads: int, exchange: int | None = None) -> None:
        checked(
            lib.chain_launch(*head, window, cluster, threads, silu, EPS, exchange, p.bf16, current_stream())
        )

    geometries = [
        {"window": wc, "cluster": k, "threads": t}
        for wc in windows(c, cpg)
        for k in CLUSTERS
        for t in THREADS
        if lib.chain_vectors(rows, c, cpg, wc, k, t, p.bf16) > 0
    ]
    results, best = sweep(
        f"{spec} {dtype} fwd", geometries, launch, lambda: excess(y, ref), lambda: y.fill_(math.nan), timer
    )
    if best is None:
        return None
    grid = n * (c // best["window"]) * best["cluster"]
    geometry = {k: best[k] for k in ("window", "cluster", "threads")}
    exchange = torch.empty(2 * grid * lib.chain_exchange_per_block(), device=dev)
    y.fill_(math.nan)
    launch(**geometry, exchange=exchange.data_ptr())
    global_ok = excess(y, ref) <= 2e-2
    global_us = timed(lambda: launch(**geometry, exchange=exchange.data_ptr()), timer)

    def ours() -> torch.Tensor:
        with torch.no_grad():
            return gn_module.group_norm(x, groups, w, b, EPS, act)

    copy_us = min(timed(lambda: y.copy_(x), timer), timed(lambda: torch.neg(x, out=y), timer))
    empty = lambda: checked(lib.chain_empty_launch(grid, best["threads"], best["cluster"], current_stream()))  # noqa: E731
    at_ours = at_our_geometry(results, x, groups)
    row = {
        "shape": spec,
        "case": case_name(spec),
        "dtype": dtype,
        "direction": "fwd",
        "best": {**best, "grid": grid},
        "ours_us": round(timed(ours, timer), 2),
        "copy_floor_us": round(copy_us, 2),
        "empty_launch_us": round(timed(empty, timer), 2),
        "global_exchange_us": round(global_us, 2),
        "global_exchange_ok": global_ok,
        "at_our_geometry": at_ours,
        "geometries": results,
    }
    mine = "" if at_ours is None else f"; at our plan's geometry {at_ours['us']:.2f}"
    report(row, f"; its sums through global memory {global_us:.2f} ({'ok' if global_ok else 'WRONG'}){mine}")
    return row


def backward_row(lib: ctypes.CDLL, spec: str, dtype: str, timer: EventTimer) -> dict | None:
    """Every backward geometry of one shape; the best beside ours (the benchmark's autograd.grad on a graph
    built once), the copy floor and the empty launch."""
    p = Problem.of(spec, dtype, timer.device)
    n, c, rows, cpg, groups, act, x, w, b = p.n, p.c, p.rows, p.cpg, p.groups, p.act, p.x, p.w, p.b
    dev = timer.device
    dy = torch.randn_like(x)
    dx = torch.empty_like(x)
    dw = torch.empty(c, device=dev)
    db = torch.empty(c, device=dev)
    var, mean = torch.var_mean(x.float().reshape(n, groups, -1), dim=2, unbiased=False)
    rstd = torch.rsqrt(var + EPS).contiguous()
    mean = mean.contiguous()
    # fp64 autograd's dx, dweight, dbias
    xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))
    ref = torch.autograd.grad(reference(xd, groups, wd, bd, act), (xd, wd, bd), dy.double())
    head = (x.data_ptr(), dy.data_ptr(), dx.data_ptr(), w.data_ptr(), b.data_ptr(), mean.data_ptr())
    head += (rstd.data_ptr(), dw.data_ptr(), db.data_ptr(), n, rows, c, cpg)
    silu = int(act == "silu")

    def launch(window: int, per_sample: int, threads: int) -> None:
        checked(lib.chain_bwd_launch(*head, window, per_sample, threads, silu, p.bf16, current_stream()))

    def error() -> float:  # dweight and dbias: sums of many terms, against their own scale
        scale = [1.0, ref[1].abs().max().item(), ref[2].abs().max().item()]
        return max(excess(got / s, r / s) for got, r, s in zip((dx, dw, db), ref, scale, strict=True))

    def poison() -> None:
        for t in (dx, dw, db):
            t.fill_(math.nan)

    geometries = [
        {"window": wc, "per_sample": k, "threads": t}
        for wc in windows(c, cpg)
        for k in CLUSTERS
        for t in THREADS
        if lib.chain_bwd_vectors(n, rows, c, cpg, wc, k, t, p.bf16) > 0
    ]
    results, best = sweep(f"{spec} {dtype} bwd", geometries, launch, error, poison, timer)
    if best is None:
        return None
    cluster = n * best["per_sample"]
    grid = (c // best["window"]) * cluster
    xg, wg, bg = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y = gn_module.group_norm(xg, groups, wg, bg, EPS, act)
    ours = lambda: torch.autograd.grad(y, (xg, wg, bg), dy, retain_graph=True)  # noqa: E731
    empty = lambda: checked(lib.chain_empty_launch(grid, best["threads"], cluster, current_stream()))  # noqa: E731
    row = {
        "shape": spec,
        "case": case_name(spec),
        "dtype": dtype,
        "direction": "bwd",
        "best": {**best, "cluster": cluster, "grid": grid},
        "ours_us": round(timed(ours, timer), 2),
        "copy_floor_us": round(timed(lambda: torch.add(x, dy, out=dx), timer), 2),
        "empty_launch_us": round(timed(empty, timer), 2),
        "geometries": results,
    }
    report(row)
    return row


def at_our_geometry(results: list[dict], x: torch.Tensor, groups: int) -> dict | None:
    """The chain kernel's row at the geometry of our forward plan (its window, its team as the cluster, 256
    threads: gn_module.plan), where the sweep ran it: the same split, without our kernel's machinery."""
    plan = gn_module.plan(tuple(x.shape), groups, x.dtype, "fwd")
    tiling, teams = getattr(plan, "tiling", None), getattr(plan, "teams", None)
    if tiling is None or teams is None:
        return None
    for r in results:
        if (r["window"], r["cluster"], r["threads"]) == (tiling.window, teams.team_size, 256) and r["ok"]:
            return r
    return None


def report(row: dict, extra: str = "") -> None:
    best = row["best"]
    print(
        f"== {row['shape']} {row['dtype']} {row['direction']}: chain floor {best['us']:.2f} us "
        f"(W={best['window']} K={best['cluster']} T={best['threads']}, grid {best['grid']}); "
        f"ours auto {row['ours_us']:.2f}; "
        f"copy floor {row['copy_floor_us']:.2f}; empty launch of that grid "
        f"{row['empty_launch_us']:.2f}{extra}",
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--directions", default="fwd,bwd")
    ap.add_argument("--dtypes", default="fp16", help="fp16 and/or bf16")
    ap.add_argument("--json")
    args = ap.parse_args()
    timer = EventTimer(torch.device("cuda", torch.cuda.current_device()))
    measure = {"fwd": forward_row, "bwd": backward_row}
    for spec in args.shapes.split(","):
        if parse(spec)[2] not in (None, "silu"):
            raise SystemExit(f"{spec}: the chain kernels have SiLU or no activation")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(tmp)
        for direction in args.directions.split(","):
            for dtype in args.dtypes.split(","):
                rows += [measure[direction](lib, spec, dtype, timer) for spec in args.shapes.split(",")]
    if args.json:
        with open(args.json, "w") as fh:
            out = {"device": torch.cuda.get_device_name(), "rows": [r for r in rows if r is not None]}
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
