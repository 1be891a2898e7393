"""Time the task kernels at several team sizes, to calibrate `schedule.choose_teams` (GPU).

The residency cap is the knob: the results are bitwise equal at every cap, and a cap of
``tasks x m`` gives teams of at most m members. For each shape and direction the script times the
natural plan and the caps ``tasks x m`` for m = 1, 2, 4, ... up to the natural team size, and prints
the plan each cap gave (members per team, teams, rounds, chunks per member, overflow) beside the
median (CUDA events, L2 flushed). The backward runs with GN_ARCH=tasks+bwd.

    python scripts/task_team_sweep.py [--dtype fp16] [--json PATH] [--shapes small|all]
                                      [--shape NxCxHxW[:G8][:silu] ...] [--repeats N]

Why: on the H200 the small shapes' time is a latency chain (2x320x64x64 forward: 2.0 us prologue,
5.7 us stats, 8.9 us waiting for a 132-member team's combine, 3.3 us apply; RESULTS.md), and the
model behind `choose_teams` counts the busiest block's chunks but nothing that grows with the team.
Since session 17 a forward cap that leaves one round of teams of 2-8 runs them as clusters (the plan's
"cluster"), the measurement that says whether `choose_teams` should prefer such teams.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys

import torch

import gn_module
from gn_module import ops, schedule
from gn_module.bench.timing import EventTimer, time_cuda

DT = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
SMALL = [
    ((2, 1280, 16, 16), 32, "silu"),
    ((2, 640, 32, 32), 32, "silu"),
    ((2, 320, 64, 64), 32, "silu"),
    ((1, 512, 128, 128), 32, "silu"),
]
LARGER = [((1, 512, 256, 256), 32, "silu"), ((32, 128, 256, 256), 32, None)]


def parse_shape(text: str) -> tuple[tuple[int, ...], int, str | None]:
    """--shape: time_shapes.py's spec (NxCxHxW[:G<groups>][:<activation>], 32 groups, no activation unless
    it says), as an argparse type."""
    from time_shapes import parse  # (scripts/, sys.path[0] when run as a script)

    try:
        return parse(text)
    except (SystemExit, ValueError) as e:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: {e}") from None


def make(shape, dtype, groups):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.empty(shape, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
    x.normal_(3.0, 2.0, generator=g)
    dy = torch.empty_like(x).normal_(0.0, 1.0, generator=g)
    c = shape[1]
    w = torch.empty(c, device="cuda").normal_(1.0, 0.2, generator=g).to(dtype)
    b = torch.empty(c, device="cuda").normal_(0.0, 0.2, generator=g).to(dtype)
    return x, dy, w, b


def case(shape, groups, act, dname):
    """x, dy, weight, bias of `make`, the activation's code and x's item size."""
    dtype = DT[dname]
    x, dy, w, b = make(shape, dtype, groups)
    return x, dy, w, b, 0 if act is None else 1, x.element_size()


def plan_text(p) -> str:
    """The plan in one line: tasks and tiles, the teams, the grid and the schedule."""
    t = p.teams
    head = f"tasks={p.tiling.tasks} tiles/task={p.tiling.tiles_per_task} slots={p.slots}"
    if t is None:
        return f"{head} grid={p.grid} sched={p.schedule}"
    # the forward's one-launch teams of 2-8 run as thread-block clusters (sm_90 builds, on by default)
    cluster = " cluster" if ops.cluster_teams_enabled() and schedule.cluster_teams_fit(p) else ""
    return (
        f"{head} m={t.team_size} teams={t.teams} rounds={t.rounds} chunks={t.chunks_per_member}"
        f" over={t.overflow_chunks} grid={p.grid} sched={p.schedule}{cluster}"
    )


def timed_row(fn, shape, dname: str, direction: str, plan, timer, **fields) -> dict:
    """One result row: `fn` timed (median us, CUDA events, L2 flushed) with the plan and `fields`."""
    t = time_cuda(fn, reps=40, warmup=5, min_reps=10, max_seconds=0.15, timer=timer)
    return {"shape": "x".join(map(str, shape)), "dtype": dname, "dir": direction, **fields,
            "us": round(t.median_us, 2), "plan": plan_text(plan)}  # fmt: skip


def sweep(shape, groups, act, dname, timer) -> list[dict]:
    x, dy, w, b, act_id, _ = case(shape, groups, act, dname)
    rows = []
    for direction, arch in (("fwd", "tasks"), ("bwd", "tasks+bwd")):
        os.environ[ops.ENV_ARCH] = arch
        natural = ops.plan(x.shape, groups, x.dtype, direction, "auto")
        tasks = natural.tiling.tasks
        caps: list[int | None] = [None]
        m = 1
        while tasks * m < natural.grid:
            caps.append(tasks * m)
            m *= 2
        if direction == "bwd":
            with torch.no_grad():
                _, mean, rstd = ops.forward(x, w, b, groups, 1e-5, act_id, "auto")
        for cap in caps:
            with gn_module.max_resident_blocks(cap) if cap else contextlib.nullcontext():
                p = ops.plan(x.shape, groups, x.dtype, direction, "auto")
                if direction == "fwd":

                    def fn():
                        with torch.no_grad():
                            return gn_module.group_norm(x, groups, w, b, 1e-5, act)
                else:

                    def fn(mean=mean, rstd=rstd):
                        return ops.backward(dy, x, w, b, mean, rstd, groups, 1e-5, act_id, 2)

                row = timed_row(fn, shape, dname, direction, p, timer, cap=cap)
            rows.append(row)
            print(f"{row['shape']:18} {direction} cap={cap!s:5} {row['us']:8.2f} us  {row['plan']}")
    return rows


def main(per_shape=None, add_arguments=None) -> int:
    """Runs `per_shape(shape, groups, act, dtype name, timer) -> rows` (default: the team sweep) over the
    shapes the command line picks; also window_sweep.py's and geometry_sweep.py's main. `add_arguments(ap)`
    adds a script's own options, which then reach `per_shape` as the keyword `args`."""
    per_shape = per_shape or sweep
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="fp16", choices=sorted(DT))
    ap.add_argument("--shapes", default="all", choices=("small", "all"))
    ap.add_argument("--shape", action="append", type=parse_shape, metavar="NxCxHxW[:G8][:silu]",
                    help="these shapes instead of --shapes' (repeatable; time_shapes.py specs)")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=1,
                    help="sweep the shapes this many times in turn (rows say which: 'repeat')")  # fmt: skip
    ap.add_argument("--json")
    if add_arguments is not None:
        add_arguments(ap)
    args = ap.parse_args()
    if add_arguments is not None:
        per_shape = functools.partial(per_shape, args=args)
    timer = EventTimer(torch.device("cuda", torch.cuda.current_device()))
    shapes = args.shape or SMALL + (LARGER if args.shapes == "all" else [])
    rows = []
    for repeat in range(args.repeats):
        for shape, groups, act in shapes:
            rows += [{**r, "repeat": repeat} for r in per_shape(shape, groups, act, args.dtype, timer)]
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
