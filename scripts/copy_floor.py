"""What moving a GroupNorm's minimum bytes costs at each benchmark size, in the benchmark's timer (GPU).

    python scripts/copy_floor.py [--dtype fp16] [--shapes 1x512x128x128,2x320x64x64] [--json out.json]

Issues 12 and 13 let a target become 90 % of a measured physical limit where the limit shows the target
cannot be reached. The SOL column divides by the 1 GiB copy bandwidth, but a small or mid tensor cannot be
moved at that speed in one launch: the launch itself (3.7 us of event time, session 16) is part of every
median. This times one launch that moves exactly the bytes a GroupNorm must move, with the benchmark's
timer (L2 flushed by reading, a GPU spin before the start event, CUDA-event median):

- forward (read x, write y): ``y.copy_(x)`` and ``torch.neg(x, out=y)``;
- backward (read x and dy, write dx): ``torch.add(x, dy, out=dx)``.

The faster of a direction's kernels is its floor: no GroupNorm, which must also reduce before it writes,
moves those bytes in less time in one launch. Prints per shape and direction: the floor's us, TB/s and
fraction of SOL, the issue's target for that size, and where the floor makes that target unreachable,
90 % of the floor (the "limit" column). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from gn_module.bench.cases import CASES, bytes_moved, select_cases, size_class
from gn_module.bench.targets import LATENCY_TARGETS_US, sol_target
from gn_module.bench.timing import EventTimer, copy_bandwidth, sol_fraction, throughput_tbps, time_cuda

#: The share of a measured limit a target becomes where the limit rules the issue's target out.
LIMIT_SHARE = 0.9


def kernels(case, dtype: torch.dtype, direction: str, device) -> dict[str, object]:
    """The launches that move a direction's minimum bytes, by name."""
    fmt = torch.channels_last if len(case.shape) == 4 else torch.channels_last_3d
    x = torch.randn(case.shape, device=device, dtype=dtype).to(memory_format=fmt)
    out = torch.empty_like(x)
    if direction == "fwd":
        return {"copy_": lambda: out.copy_(x), "neg": lambda: torch.neg(x, out=out)}
    dy = torch.randn_like(x)
    return {"add": lambda: torch.add(x, dy, out=out)}


def limit_row(case, dtype_name: str, direction: str, floor_us: float, copy_tbps: float) -> dict:
    """The issue's target for this size and, where the floor rules it out, 90 % of the floor."""
    nbytes = bytes_moved(case, dtype_name, direction)
    tensor_bytes = case.nbytes(dtype_name)
    cls = size_class(tensor_bytes)
    floor_sol = sol_fraction(nbytes, floor_us, copy_tbps)
    row = {"floor_sol": floor_sol, "class": cls}
    if cls == "small":
        target = LATENCY_TARGETS_US[direction]
        row.update(target=f"<= {target:g} us", reachable=floor_us <= target)
        if floor_us > target:
            row["limit_target"] = f"<= {floor_us / LIMIT_SHARE:.1f} us"
        return row
    sol = sol_target(case, tensor_bytes, direction)
    if sol is None:
        return row
    row.update(target=f"{sol[0]} >= {sol[1]:.2f}", reachable=floor_sol >= sol[1])
    if floor_sol < sol[1]:
        row["limit_target"] = f">= {LIMIT_SHARE * floor_sol:.3f}"
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"))
    ap.add_argument("--shapes", default="", help="comma-separated name patterns (default: every shape)")
    ap.add_argument("--directions", default="fwd,bwd")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("copy_floor.py needs a CUDA device", file=sys.stderr)
        return 3
    device = torch.device("cuda", torch.cuda.current_device())
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    timer = EventTimer(device)
    copy = copy_bandwidth(device=device, timer=timer)
    print(f"{torch.cuda.get_device_name(device)}: copy bandwidth {copy.tbps:.3f} TB/s (1 GiB, read + write)")
    cases = select_cases([p for p in args.shapes.split(",") if p], cases=CASES)
    rows = []
    for case in cases:
        for direction in args.directions.split(","):
            nbytes = bytes_moved(case, args.dtype, direction)
            times = {}
            for name, fn in kernels(case, dtype, direction, device).items():
                t = time_cuda(fn, reps=args.reps, warmup=5, min_reps=20, max_seconds=1.0, timer=timer)
                times[name] = t.median_us
            floor_us = min(times.values())
            row = {
                "case": case.name,
                "direction": direction,
                "bytes": nbytes,
                "kernels_us": times,
                "floor_us": floor_us,
                "floor_tbps": throughput_tbps(nbytes, floor_us),
                **limit_row(case, args.dtype, direction, floor_us, copy.tbps),
            }
            rows.append(row)
            kern = ", ".join(f"{k} {v:.2f}" for k, v in times.items())
            limit = row.get("limit_target", "-")
            print(
                f"{case.name:26} {direction} {nbytes / 2**20:8.1f} MiB  {kern:28}  floor {floor_us:8.2f} us "
                f"{row['floor_tbps']:.2f} TB/s SOL {row['floor_sol']:.3f}  target {row.get('target', '-')}"
                f"  limit {limit}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {"device": torch.cuda.get_device_name(device), "copy": copy.as_dict(), "rows": rows},
                fh,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
