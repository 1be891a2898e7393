"""What moving a GroupNorm's minimum bytes costs at each benchmark size, in the benchmark's timer (GPU).

    python scripts/copy_floor.py [--dtype fp16] [--shapes 1x512x128x128,2x320x64x64] [--json out.json]

Issues 12 and 13 let a target become 90 % of a measured physical limit where the limit shows the target
cannot be reached. `gn_module.bench.floor` times one launch that moves exactly a row's minimum bytes
(forward: ``y.copy_(x)``, ``torch.neg(x, out=y)``; backward: ``torch.add(x, dy, out=dx)``) with the
benchmark's timer; `python -m gn_module.bench` does so for every row it judges. This script prints the floors
alone, without timing any GroupNorm: per shape and direction the floor's us, TB/s and fraction of SOL, the
issue's target for that size, and where the floor rules that target out, 90 % of the floor (the "limit"
column). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from gn_module.bench.cases import ALL_DTYPES, CASES, OURS, Case, bytes_moved, select_cases, size_class
from gn_module.bench.floor import measure_floor
from gn_module.bench.results import Result
from gn_module.bench.targets import TargetCheck, check_targets
from gn_module.bench.timing import EventTimer, Timing, copy_bandwidth, sol_fraction, throughput_tbps


def limit_row(case: Case, dtype: str, direction: str, floor_us: float, copy_tbps: float) -> dict:
    """The issue's target for this size and, where the floor rules it out, 90 % of the floor: the benchmark's
    own checks (`targets.check_targets`) of a row timed at the floor, without and with the floor."""
    floor_sol = sol_fraction(bytes_moved(case, dtype, direction), floor_us, copy_tbps)
    row = {"floor_sol": floor_sol, "class": size_class(case.nbytes(dtype))}
    at_floor = [Result(case, dtype, direction, OURS, Timing(*[floor_us] * 6, 1))]

    def sized(floors: dict) -> TargetCheck | None:  # the SOL or latency check (the only kinds without peers)
        return next(iter(check_targets(at_floor, copy_tbps, floors)), None)

    issue, limited = sized({}), sized({at_floor[0].key: floor_us})
    if issue is None:
        return row
    op = ">=" if issue.higher_is_better else "<="
    row["target"] = f"{issue.target} {op} {issue.threshold:g}"
    row["reachable"] = limited.threshold == issue.threshold
    if not row["reachable"]:
        row["limit_target"] = (
            f"{op} {limited.threshold:.1f} us" if op == "<=" else f"{op} {limited.threshold:.3f}"
        )
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="fp16", choices=ALL_DTYPES)
    ap.add_argument("--shapes", default="", help="comma-separated name patterns (default: every shape)")
    ap.add_argument("--directions", default="fwd,bwd")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("copy_floor.py needs a CUDA device", file=sys.stderr)
        return 3
    device = torch.device("cuda", torch.cuda.current_device())
    timer = EventTimer(device)
    copy = copy_bandwidth(device=device, timer=timer)
    print(f"{torch.cuda.get_device_name(device)}: copy bandwidth {copy.tbps:.3f} TB/s (1 GiB, read + write)")
    cases = select_cases([p for p in args.shapes.split(",") if p], cases=CASES)
    rows = []
    for case in cases:
        for direction in args.directions.split(","):
            nbytes = bytes_moved(case, args.dtype, direction)
            floor = measure_floor(case, args.dtype, direction, timer, reps=args.reps, max_seconds=1.0)
            times, floor_us = floor.kernels_us, floor.us
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
