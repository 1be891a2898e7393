"""Time `ours auto` on shapes outside the benchmark's fixed cases (GPU), for A/B runs of kernel trees.

    python scripts/time_shapes.py 32x320x64x64 32x128x256x256:G32 1x512x128x128:G32:silu [--dtype fp16]
        [--directions fwd,bwd] [--passes auto,1,2] [--json PATH] [--no-flush] [--launch-tiles N]
        [--sample-tiles N]

Each shape is NxCxHxW (or NxCxDxHxW), optionally followed by :G<groups> (default 32) and an
activation (:silu, :relu, :gelu, :gelu_tanh; both directions run it). The timer is the benchmark's
(CUDA events, L2 flushed, median); TB/s counts the minimum bytes (forward x and y, backward x, dy and
dx) and SOL divides by the copy bandwidth measured in the same run. The plan printed beside each row
is `gn_module.plan`'s. `--passes` times each schedule given (default auto only;
1 forces one launch, 2 the stats and apply launches), to check what `auto` picks. `--warm-code` runs the
same call on a second set of tensors after each flush (untimed): the kernels' code and parameters are
back in L2 while x, dy and the statistics are not, so the difference to a plain run is what the flush's
cold code costs the small shapes. `--launch-tiles N` sets the tile budget of a launch
(schedule.MAX_TILES_PER_LAUNCH) for the run, an experiment with other tilings: 8192 gives
32x128x256x256 tiles of 256 rows, 4 chunks, so one team of 256 holds a whole sample on chip.
`--sample-tiles N` sets a sample's tile budget (schedule.MAX_TILES_PER_SAMPLE, shared by its windows):
1024 gives 1x512x256x256's four 16 MiB windows 256 tiles of 4 chunks each, the same one team of 256.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

import gn_module
from gn_module import _abi, ops, schedule
from gn_module.bench.timing import EventTimer, copy_bandwidth, time_cuda

DT = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def set_tile_budgets(sample: int | None, launch: int | None) -> None:
    """An experiment's tile budgets for this process (None: the default): a sample's
    (schedule.MAX_TILES_PER_SAMPLE) and a launch's in both directions (schedule.MAX_TILES_PER_LAUNCH).
    Other tilings sum in another order, so their bits are not the default's."""
    for name, value in (("--sample-tiles", sample), ("--launch-tiles", launch)):
        if value is not None and value < 1:
            raise SystemExit(f"{name} must be >= 1, got {value}")
    if sample is not None:
        schedule.MAX_TILES_PER_SAMPLE = sample
        print(f"tile budget per sample: {sample} (schedule.MAX_TILES_PER_SAMPLE, this process)")
    if launch is not None:
        schedule.MAX_TILES_PER_LAUNCH.update(fwd=launch, bwd=launch)
        print(f"tile budget per launch: {launch} (schedule.MAX_TILES_PER_LAUNCH, this process)")


def parse(spec: str) -> tuple[tuple[int, ...], int, str | None]:
    """'32x320x64x64:G32:silu' -> ((32, 320, 64, 64), 32, 'silu')."""
    head, *opts = spec.split(":")
    shape = tuple(int(v) for v in head.split("x"))
    groups, act = 32, None
    for o in opts:
        if o.startswith("G"):
            groups = int(o[1:])
        elif o in _abi.ACT_CODES:
            act = o
        else:
            raise SystemExit(f"unknown option {o!r} in {spec!r}")
    return shape, groups, act


def _teams(plan) -> str:
    """'4x64 r16 c4+1' (teams x members, rounds, chunks per member + re-read) of a one-launch task plan."""
    tm = getattr(plan, "teams", None)
    if tm is None or plan.schedule != 1:
        return ""
    return f"{tm.teams}x{tm.team_size} r{tm.rounds} c{tm.chunks_per_member}+{tm.overflow_chunks}"


def _calls(
    shape: tuple[int, ...], groups: int, act: str | None, dtype: torch.dtype, sched: int | str, seed: int
):
    """The forward and backward calls of `ours` on fresh tensors of one shape (the backward's statistics
    from a forward of the same x)."""
    act_id = _abi.ACT_CODES[act]
    g = torch.Generator(device="cuda").manual_seed(seed)
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    x = torch.empty(shape, device="cuda", dtype=dtype).to(memory_format=fmt)
    x.normal_(3.0, 2.0, generator=g)
    dy = torch.empty_like(x).normal_(0.0, 1.0, generator=g)
    w = torch.empty(shape[1], device="cuda").normal_(1.0, 0.2, generator=g).to(dtype)
    b = torch.empty(shape[1], device="cuda").normal_(0.0, 0.2, generator=g).to(dtype)
    with torch.no_grad():
        _, mean, rstd = ops.forward(x, w, b, groups, 1e-5, act_id, "auto")

    def forward():
        with torch.no_grad():
            return gn_module.group_norm(x, groups, w, b, 1e-5, act, passes=sched)

    def backward():
        return ops.backward(dy, x, w, b, mean, rstd, groups, 1e-5, act_id, sched)

    return x, {"fwd": forward, "bwd": backward}


def time_shape(
    spec: str,
    dname: str,
    directions: list[str],
    timer: EventTimer,
    copy: float,
    passes: str = "auto",
    warm_code: bool = False,
) -> list[dict]:
    """Rows for one shape: each direction of `ours` under `passes` ("auto", "1", "2") timed, with its plan;
    with `warm_code`, after each flush the same call runs untimed on a second set of tensors."""
    sched: int | str = passes if passes == "auto" else int(passes)
    shape, groups, act = parse(spec)
    dtype = DT[dname]
    x, calls = _calls(shape, groups, act, dtype, sched, seed=0)
    twins = _calls(shape, groups, act, dtype, sched, seed=1)[1] if warm_code else {}

    rows = []
    for direction in directions:
        fn, tensors = calls[direction], 2 if direction == "fwd" else 3
        timer.before = twins.get(direction)
        try:
            t = time_cuda(fn, reps=50, warmup=5, min_reps=10, max_seconds=0.2, timer=timer)
        finally:
            timer.before = None
        tbps = tensors * x.numel() * x.element_size() / t.median_us / 1e6
        plan = ops.plan(x.shape, groups, dtype, direction, sched)
        tiling = plan.tiling
        row = {"shape": spec, "dtype": dname, "dir": direction, "passes": passes, "warm_code": warm_code,
               "us": round(t.median_us, 2),
               "iqr_us": round(t.iqr_us, 2), "tbps": round(tbps, 3), "sol": round(tbps / copy, 3),
               "tiles_per_task": getattr(tiling, "tiles_per_task", None),
               "tasks": getattr(tiling, "tasks", None), "grid": plan.grid,
               "schedule": plan.schedule, "teams": _teams(plan)}  # fmt: skip
        rows.append(row)
        print(
            f"{spec:28} {direction} {passes:>4}{' warm-code' if warm_code else ''} "
            f"{row['us']:9.2f} us (IQR {row['iqr_us']:.2f}) "
            f"{tbps:6.3f} TB/s "
            f"SOL {row['sol']:.3f}  tasks={row['tasks']} tiles/task={row['tiles_per_task']} "
            f"grid={plan.grid} sched={plan.schedule} {row['teams']}"
        )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="+")
    ap.add_argument("--dtype", default="fp16", choices=sorted(DT))
    ap.add_argument("--directions", default="fwd,bwd")
    ap.add_argument("--passes", default="auto", help="comma-separated schedules: auto, 1, 2")
    ap.add_argument("--json")
    ap.add_argument("--no-flush", action="store_true", help="no L2 flush between repetitions")
    ap.add_argument(
        "--warm-code",
        action="store_true",
        help="also time each row with the same call on other tensors after the flush (code warm, data cold)",
    )
    ap.add_argument(
        "--launch-tiles",
        type=int,
        metavar="N",
        help="an experiment: tile budget of a launch in both directions (schedule.MAX_TILES_PER_LAUNCH) for "
        "this process; other tilings, so other bits than the default's",
    )
    ap.add_argument(
        "--sample-tiles",
        type=int,
        metavar="N",
        help="an experiment: tile budget of one sample, shared by its windows "
        "(schedule.MAX_TILES_PER_SAMPLE) for this process; other tilings, so other bits than the default's",
    )
    args = ap.parse_args()
    set_tile_budgets(args.sample_tiles, args.launch_tiles)
    timer = EventTimer(torch.device("cuda", torch.cuda.current_device()), flush=not args.no_flush)
    copy = copy_bandwidth(timer=timer).tbps
    print(f"copy bandwidth {copy:.3f} TB/s")
    rows = []
    for spec in args.shapes:
        for passes in args.passes.split(","):
            for warm in (False, True) if args.warm_code else (False,):
                rows += time_shape(spec, args.dtype, args.directions.split(","), timer, copy, passes, warm)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"copy_tbps": copy, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
