"""GPU check of the task-architecture forward (GN_ARCH=tasks): correctness, bitwise equality across
residency caps and schedules, the launch record, and CUDA-event timings against the tile kernels.

    python scripts/task_forward_check.py [--quick] [--json PATH]

Correctness: fp64 reference (gn_module.reference) on fresh random inputs with a large mean, outputs
poisoned with NaN before each launch. Bitwise: y, mean and rstd of passes=1 under caps 1, 2, 3, 7, 61
and the natural residency, and of passes=2, must be identical. Timing: median of CUDA events with L2
flushed (gn_module.bench.timing), fraction of SOL against the measured copy bandwidth. Exit 1 on any
correctness or bitwise failure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

os.environ["GN_ARCH"] = "tasks"

import gn_module
from gn_module import ops, reference

DT = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

# (N, C, *spatial), groups, act, dtype: odd shapes first (scalar path, partial tiles, G=1, cpg=1, N>1)
CHECKS = [
    ((3, 100, 37), 10, None, "fp16"),
    ((2, 96, 33, 31), 32, "silu", "fp32"),
    ((5, 64, 17, 19), 1, None, "bf16"),
    ((2, 64, 40, 40), 64, "silu", "fp16"),
    ((4, 320, 24, 24), 32, "silu", "fp16"),
    ((1, 128, 300, 257), 16, None, "fp16"),
    ((2, 1280, 16, 16), 32, "silu", "bf16"),
    ((1, 512, 128, 128), 32, "silu", "fp16"),
    ((2, 640, 32, 32), 32, None, "fp32"),
    ((8, 128, 96, 96), 32, None, "bf16"),
    ((1, 256, 512, 512), 32, "silu", "fp16"),
]
CAPS = (1, 2, 3, 7, 61, None)

BENCH = [
    ((1, 128, 1024, 2048), 16, None),
    ((1, 128, 1024, 1024), 32, "silu"),
    ((1, 256, 512, 512), 32, "silu"),
    ((1, 512, 256, 256), 32, "silu"),
    ((1, 512, 128, 128), 32, "silu"),
    ((2, 320, 64, 64), 32, "silu"),
    ((2, 640, 32, 32), 32, "silu"),
    ((2, 1280, 16, 16), 32, "silu"),
    ((32, 128, 256, 256), 32, None),
    ((1, 128, 16, 256, 256), 32, "silu"),
]


def make(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d if len(shape) == 5 else None
    x = torch.empty(shape, device="cuda", dtype=dtype)
    if fmt is not None:
        x = x.to(memory_format=fmt)
    elif len(shape) == 3:  # (N, C, L) stored as (N, L, C)
        x = torch.empty((shape[0], shape[2], shape[1]), device="cuda", dtype=dtype).transpose(1, 2)
    x.normal_(3.0, 2.0, generator=g)  # a mean far from 0 exercises the shifted sums
    c = shape[1]
    w = torch.empty(c, device="cuda").normal_(1.0, 0.2, generator=g)
    b = torch.empty(c, device="cuda").normal_(0.0, 0.2, generator=g)
    return x, w, b


def run(x, w, b, groups, act, passes, cap):
    with ops.poison_outputs(), ops.launch_record() as rec:
        if cap is None:
            y, mean, rstd = ops.forward(x, w, b, groups, 1e-5, 0 if act is None else 1, passes)
        else:
            with gn_module.max_resident_blocks(cap):
                y, mean, rstd = ops.forward(x, w, b, groups, 1e-5, 0 if act is None else 1, passes)
    torch.cuda.synchronize()
    return y, mean, rstd, rec.get("fwd", {})


def check(shape, groups, act, dname: str, seed: int) -> list[str]:
    dtype = DT[dname]
    x, w, b = make(shape, dtype, seed)
    problems = []
    p1 = ops.plan(x.shape, groups, dtype, "fwd", 1)
    if getattr(p1, "arch", 1) != 2:
        return [f"not planned on the task architecture: {p1}"]
    ref = reference.forward(x, groups, w, b, 1e-5, act)
    base = None
    for passes, cap in [(1, c) for c in CAPS] + [(2, None)]:
        y, mean, rstd, rec = run(x, w, b, groups, act, passes, cap)
        tag = f"passes={passes} cap={cap}"
        try:
            reference.compare(y, ref, dtype, f"y {tag}")
        except AssertionError as exc:
            problems.append(str(exc))
        if rec.get("tiles_phase1") != p1.tiles or rec.get("tiles_applied") != p1.tiles:
            problems.append(f"{tag}: launch record {rec} does not cover {p1.tiles} tiles")
        if base is None:
            base = (y, mean, rstd)
        elif not all(torch.equal(a, b_) for a, b_ in zip(base, (y, mean, rstd), strict=True)):
            diff = (base[0].float() - y.float()).abs().max().item()
            problems.append(f"{tag}: not bitwise equal to passes=1 cap={CAPS[0]} (max |dy| {diff:.3g})")
    return problems


def bench(quick: bool) -> list[dict]:
    from gn_module.bench.timing import EventTimer, copy_bandwidth, time_cuda

    timer = EventTimer(torch.device("cuda", torch.cuda.current_device()))
    bw = copy_bandwidth(1 << 30, timer=timer)
    print(f"copy bandwidth {bw.tbps:.3f} TB/s")
    rows = []
    for shape, groups, act in BENCH:
        for dname in ("fp16",) if quick else ("fp16", "bf16"):
            x, w, b = make(shape, DT[dname], 0)
            w, b = w.to(DT[dname]), b.to(DT[dname])
            nbytes = 2 * x.numel() * x.element_size()
            row = {"shape": "x".join(map(str, shape)), "groups": groups, "act": act, "dtype": dname}
            for label, arch, passes in (
                ("tasks-auto", "tasks", "auto"),
                ("tasks-1", "tasks", 1),
                ("tasks-2", "tasks", 2),
                ("tiles-auto", "tiles", "auto"),
            ):
                os.environ["GN_ARCH"] = arch
                try:

                    def fn(x=x, w=w, b=b, passes=passes, groups=groups, act=act):
                        with torch.no_grad():
                            return gn_module.group_norm(x, groups, w, b, 1e-5, act, passes=passes)

                    t = time_cuda(fn, reps=30, warmup=3, min_reps=5, max_seconds=0.1, timer=timer)
                    row[label] = round(t.median_us, 2)
                    row[label + "_sol"] = round(nbytes / (t.median_us * 1e-6) / 1e12 / bw.tbps, 3)
                except Exception as exc:  # report and go on
                    row[label] = f"{type(exc).__name__}: {exc}"[:120]
            os.environ["GN_ARCH"] = "tasks"
            plan = ops.plan(x.shape, groups, x.dtype, "fwd", "auto")
            row["plan"] = {
                "schedule": plan.schedule,
                "grid": plan.grid,
                "slots": getattr(plan, "slots", None),
                "teams": getattr(plan, "teams", None) and plan.teams.__dict__,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            del x, w, b
            torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--no-bench", action="store_true")
    args = ap.parse_args()
    started = time.time()
    failures = 0
    for i, (shape, groups, act, dname) in enumerate(CHECKS):
        try:
            problems = check(shape, groups, act, dname, seed=100 + i)
        except Exception as exc:
            problems = [f"{type(exc).__name__}: {exc}"]
        status = "ok" if not problems else "FAIL"
        failures += bool(problems)
        print(
            f"{status:4} {shape} G{groups} {act} {dname}" + "".join(f"\n     {p}" for p in problems[:6]),
            flush=True,
        )
    rows = [] if args.no_bench else bench(args.quick)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"failures": failures, "bench": rows}, fh, indent=1)
    print(f"checks: {len(CHECKS) - failures}/{len(CHECKS)} ok; {time.time() - started:.0f} s")
    print(
        f"{'shape':22} {'dt':4} {'tasks-auto':>10} {'SOL':>5} {'tasks-1':>9} {'tasks-2':>9} "
        f"{'tiles':>9} {'SOL':>5}"
    )
    for r in rows:

        def f(k, r=r):
            v = r.get(k)
            return f"{v:9.1f}" if isinstance(v, float) else "  err    "

        print(
            f"{r['shape']:22} {r['dtype']:4} {f('tasks-auto'):>10} {r.get('tasks-auto_sol', 0):5} "
            f"{f('tasks-1')} {f('tasks-2')} {f('tiles-auto')} {r.get('tiles-auto_sol', 0):5}"
        )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
