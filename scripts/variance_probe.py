"""Does a launch's speed follow its tensors' addresses, or the moment it runs? (GPU)

    python scripts/variance_probe.py 32x128x256x256 [--dtype fp16] [--direction fwd] [--passes 1]
        [--allocations 6] [--repeats 3] [--json PATH]

Session 23 saw 32x128x256x256's one-launch forward take 376-402 us as its median from one benchmark to
the next, with an IQR of 5-10 us against 2-3 us for the two launches (benchmarks/RESULTS.md). This
script separates the two candidate causes. It makes --allocations sets of tensors (x, and dy for the
backward), each behind a padding allocation of a different size so their addresses differ, then times
every set --repeats times, round-robin (set 1, 2, ..., then again), with the benchmark's timer (CUDA
events, L2 flushed, median). If the medians of one set agree across rounds while the sets differ, the
speed follows the addresses; if every set drifts alike from round to round, it follows time (clocks,
another tenant); if neither, it varies from timing to timing (e.g. how the staggered teams fall in
phase). `spread` splits the medians that way.

Shapes as in scripts/time_shapes.py (NxCxHxW[:G<groups>][:silu]).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence

#: MiB of padding before allocation set k: 0, 1, 3, 7, ... (odd sizes move x across pages and
#: channels; the caching allocator hands out 2 MiB-aligned blocks for large tensors)
PAD_MIB = (0, 1, 3, 7, 13, 29, 61, 101, 157, 211)


def spread(medians: Sequence[Sequence[float]]) -> dict[str, float]:
    """medians[set][round] (us), split two ways: the range of the sets' means (what the addresses
    explain), the range of the rounds' means (what time explains), and the range of what is left in
    each cell once both are taken out (median - set mean - round mean + grand mean: noise)."""
    rounds = {len(r) for r in medians}
    if len(medians) < 2 or len(rounds) != 1 or min(rounds) < 2:
        raise ValueError("need at least 2 sets, each with the same number (>= 2) of rounds")
    set_means = [statistics.fmean(r) for r in medians]
    round_means = [statistics.fmean(col) for col in zip(*medians, strict=True)]
    grand = statistics.fmean(set_means)
    left = [
        v - sm - rm + grand
        for r, sm in zip(medians, set_means, strict=True)
        for v, rm in zip(r, round_means, strict=True)
    ]
    return {
        "between_sets_us": max(set_means) - min(set_means),
        "between_rounds_us": max(round_means) - min(round_means),
        "residual_us": max(left) - min(left),
    }


def verdict(s: dict[str, float]) -> str:
    """A one-line reading of `spread`'s figures: the part at least twice the other two, if any."""
    sets, rounds, noise = s["between_sets_us"], s["between_rounds_us"], s["residual_us"]
    if sets > 2 * max(rounds, noise):
        return "follows the addresses (the sets differ, each repeats)"
    if rounds > 2 * max(sets, noise):
        return "follows time (every set moves together from round to round)"
    if noise > 2 * max(sets, rounds):
        return "varies from timing to timing (neither the addresses nor the rounds explain it)"
    return "no single cause at this spread"


def timed_call(x, dy, w, b, groups: int, act: str | None, sched: int | str) -> Callable[[], object]:
    """What one repetition runs: the no-grad forward of x, or (dy given) the backward of x's forward."""
    import torch

    import gn_module
    from gn_module import _abi, ops

    if dy is None:

        def forward() -> object:
            with torch.no_grad():
                return gn_module.group_norm(x, groups, w, b, 1e-5, act, passes=sched)

        return forward
    act_id = _abi.ACT_CODES[act]
    with torch.no_grad():
        _, mean, rstd = ops.forward(x, w, b, groups, 1e-5, act_id, "auto")
    return lambda: ops.backward(dy, x, w, b, mean, rstd, groups, 1e-5, act_id, sched)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shapes", nargs="+")
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"))
    ap.add_argument("--direction", default="fwd", choices=("fwd", "bwd"))
    ap.add_argument("--passes", default="1", help="auto, 1 or 2 (default 1)")
    ap.add_argument("--allocations", type=int, default=6, help=f"tensor sets, 2 to {len(PAD_MIB)}")
    ap.add_argument("--repeats", type=int, default=3, help="rounds over the sets, at least 2")
    ap.add_argument("--reps", type=int, default=30, help="timed repetitions per timing")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if not 2 <= args.allocations <= len(PAD_MIB) or args.repeats < 2:
        ap.error(f"--allocations must be 2..{len(PAD_MIB)} and --repeats at least 2")

    import torch

    if not torch.cuda.is_available():
        print("variance_probe.py needs a CUDA GPU", file=sys.stderr)
        return 3
    from gn_module import ops
    from gn_module.bench.timing import EventTimer, time_cuda

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from time_shapes import DT, parse

    sched: int | str = args.passes if args.passes == "auto" else int(args.passes)
    timer = EventTimer(torch.device("cuda", torch.cuda.current_device()))
    report = []
    for spec in args.shapes:
        shape, groups, act = parse(spec)
        dtype = DT[args.dtype]
        fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
        sets, keep = [], []
        for k in range(args.allocations):
            keep.append(torch.empty(PAD_MIB[k] << 20 or 1, dtype=torch.uint8, device="cuda"))
            g = torch.Generator(device="cuda").manual_seed(k)
            x = torch.empty(shape, device="cuda", dtype=dtype, memory_format=fmt).normal_(
                3.0, 2.0, generator=g
            )
            dy = torch.empty_like(x).normal_(0.0, 1.0, generator=g) if args.direction == "bwd" else None
            w = torch.empty(shape[1], device="cuda").normal_(1.0, 0.2, generator=g).to(dtype)
            b = torch.empty(shape[1], device="cuda").normal_(0.0, 0.2, generator=g).to(dtype)
            sets.append((x, dy, w, b))
        medians = [[0.0] * args.repeats for _ in sets]
        for r in range(args.repeats):
            for k, (x, dy, w, b) in enumerate(sets):
                fn = timed_call(x, dy, w, b, groups, act, sched)
                t = time_cuda(fn, reps=args.reps, warmup=3, min_reps=10, max_seconds=None, timer=timer)
                medians[k][r] = t.median_us
        s = spread(medians)
        plan = ops.plan(shape, groups, dtype, args.direction, sched)
        head = f"{spec} {args.dtype} {args.direction} passes={args.passes}"
        print(f"{head} (schedule {plan.schedule}, grid {plan.grid})")
        for k, ((x, *_), row) in enumerate(zip(sets, medians, strict=True)):
            cells = "  ".join(f"{v:8.1f}" for v in row)
            print(f"  set {k} pad {PAD_MIB[k]:4d} MiB  x at {x.data_ptr():#014x}  {cells}  us")
        print(
            f"  between sets {s['between_sets_us']:.1f} us, between rounds {s['between_rounds_us']:.1f} us, "
            f"left over {s['residual_us']:.1f} us: {verdict(s)}"
        )
        report.append({"shape": spec, "dtype": args.dtype, "direction": args.direction, "passes": args.passes,
                       "x_ptrs": [x.data_ptr() for x, *_ in sets], "pad_mib": list(PAD_MIB[: len(sets)]),
                       "medians_us": medians, **s, "verdict": verdict(s)})  # fmt: skip
        del sets, keep
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
