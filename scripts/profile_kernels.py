"""Per-kernel GPU time of our GroupNorm on the benchmark shapes (torch.profiler), plus host overhead.

    python scripts/profile_kernels.py [--dtype fp16] [--shapes 1x128x1024x2048,2x320x64x64]
Prints, per shape/direction/schedule, each kernel's mean device time and the sum, so a change
can be traced to the phase it moved. Used to tune the kernels (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import functools
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

import gn_module
from gn_module.bench.cases import CASES

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def case(shape, dtype):
    fmt = torch.channels_last_3d if len(shape) == 5 else torch.channels_last
    x = torch.randn(shape, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    c = shape[1]
    w = torch.randn(c, device="cuda", dtype=dtype)
    b = torch.randn(c, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    return x, w, b, dy


def kernel_times(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    totals = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            name = ev.name.split("(")[0].split("<")[0].replace("void ", "").replace("gn::", "")
            totals[name] += ev.device_time_total / reps
    return totals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--shapes", default="")
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]
    keep = [s for s in args.shapes.split(",") if s]
    for spec in CASES:
        if keep and not any(k in spec.name for k in keep):
            continue
        x, w, b, dy = case(spec.shape, dtype)
        act = spec.act
        for passes in (1, 2):
            fwd = functools.partial(gn_module.group_norm, x, spec.groups, w, b, act=act, passes=passes)
            xr = x.detach().requires_grad_(True)
            y = gn_module.group_norm(xr, spec.groups, w, b, act=act, passes=passes)
            bwd = functools.partial(torch.autograd.grad, y, xr, dy, retain_graph=True)
            for direction, fn in (("fwd", fwd), ("bwd", bwd)):
                t = kernel_times(fn)
                parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(t.items(), key=lambda kv: -kv[1]))
                print(f"{spec.name:28s} {direction} {passes}-pass total {sum(t.values()):8.1f} us | {parts}")
    # Host overhead of one eager call on a small shape (GPU work is tiny; the CPU is the limit).
    x, w, b, _ = case((2, 320, 64, 64), dtype)
    for _ in range(10):
        gn_module.group_norm(x, 32, w, b, act="silu")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        gn_module.group_norm(x, 32, w, b, act="silu")
    torch.cuda.synchronize()
    print(f"host time per eager forward call (2x320x64x64): {(time.perf_counter() - t0) / 200 * 1e6:.1f} us")


if __name__ == "__main__":
    main()
