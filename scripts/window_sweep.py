"""Time the task kernels at every channel window a shape allows, to calibrate `schedule.task_window` (GPU).

A task is one sample times one window of channels holding whole groups. Today's window is
lcm(channels per group, 128 B / itemsize) channels (whole 128-byte lines per row), so a small
tensor with wide channels has few tasks and big teams: 2x320x64x64 runs 2 tasks of 132 members,
and its forward spends 9 us of 19 waiting for the team's combine (RESULTS.md, session 9). A narrower
window gives more tasks, smaller teams and shorter combines, at the price of rows narrower than a
128-byte line. This script swaps `schedule.task_window` for each candidate window (a multiple of the
channels per group that divides C and gives 16-byte rows), times the forward (no grad) and the
backward (the default two launches, and the one-launch backward) with CUDA events and L2 flushed,
and checks each window's output against the default window's (the bits differ: the window is part of
the summation order) and the forward's one- and two-launch results against each other (bitwise).

    python scripts/window_sweep.py [--dtype fp16] [--json PATH] [--shapes small|all]
"""

from __future__ import annotations

import os
import sys

import task_team_sweep  # (scripts/: the shapes, inputs and command line)
import torch
from task_team_sweep import case, timed_row

import gn_module
from gn_module import ops, schedule

DEFAULT_WINDOW = schedule.task_window


def windows(channels: int, groups: int, itemsize: int) -> list[int]:
    """Every window the task kernels' vector path takes: whole groups, dividing C, 16-byte rows, at
    most THREADS vectors wide."""
    cpg = channels // groups
    vec = schedule.VEC_BYTES // itemsize
    return [
        w
        for w in range(cpg, channels + 1, cpg)
        if channels % w == 0 and (w * itemsize) % schedule.VEC_BYTES == 0 and w // vec <= schedule.THREADS
    ]


def use_window(w: int | None) -> None:
    schedule.task_window = DEFAULT_WINDOW if w is None else (lambda channels, groups, itemsize: w)
    schedule.SMALL_FORWARD_GEOMETRY = w is None  # (a window asked for, also for a small forward)
    ops._launches.clear()


def run(shape, groups, act, dname, timer) -> list[dict]:
    x, dy, w, b, act_id, itemsize = case(shape, groups, act, dname)
    rows = []
    ref: dict[str, torch.Tensor] = {}
    for window in [None, *windows(shape[1], groups, itemsize)]:
        use_window(window)
        label = "default" if window is None else str(window)
        for direction, arch in (("fwd", "tasks+bwd"), ("bwd", "tasks+bwd"), ("bwd1", "tasks+bwd1")):
            os.environ[ops.ENV_ARCH] = arch
            d = "fwd" if direction == "fwd" else "bwd"
            p = ops.plan(x.shape, groups, x.dtype, d, "auto")
            with torch.no_grad():
                first = 1 if d == "fwd" and p.schedule == 1 else 2
                y1, mean, rstd = ops.forward(x, w, b, groups, 1e-5, act_id, first)
                y2, _, _ = ops.forward(x, w, b, groups, 1e-5, act_id, 2)
            if d == "fwd":
                out = y2
                same = torch.equal(y1, y2)

                def fn():
                    with torch.no_grad():
                        return gn_module.group_norm(x, groups, w, b, 1e-5, act)
            else:
                out = ops.backward(dy, x, w, b, mean, rstd, groups, 1e-5, act_id, 0)[0]
                same = torch.equal(out, ops.backward(dy, x, w, b, mean, rstd, groups, 1e-5, act_id, 2)[0])

                def fn(mean=mean, rstd=rstd):
                    return ops.backward(dy, x, w, b, mean, rstd, groups, 1e-5, act_id, 0)

            if window is None:
                ref[direction] = out
            diff = (out.float() - ref[direction].float()).abs().max().item()
            row = timed_row(fn, shape, dname, direction, p, timer, window=label, row_bytes=p.tiling.row_bytes)
            row.update(max_diff_vs_default=diff, passes_bitwise=same)
            rows.append(row)
            print(
                f"{row['shape']:18} {direction:4} w={label:7} {p.tiling.row_bytes:5d} B {row['us']:8.2f} us"
                f"  diff {diff:.2e} {'same' if same else 'DIFFERENT'}  {row['plan']}",
                flush=True,
            )
    use_window(None)
    return rows


def main() -> int:
    return task_team_sweep.main(run)


if __name__ == "__main__":
    sys.exit(main())
