"""Time the forward at every (channel window, tiles per task) a small shape allows, to find which
geometries let its teams run as thread-block clusters and what that is worth (GPU).

`scripts/chain_floor.py` measured the small rows' bare chain fastest with narrow windows and teams of
6-12 blocks (H100, session 55: 2x640x32x32 11.4 us at 80 channels in clusters of 6, 12.8 at 160 in
clusters of 8), while `schedule.task_tiling` gives 2x640x32x32 tasks of 22 one-chunk tiles (teams too
big for a cluster, so two launches: 13.7 us). Session 24's window sweep found the narrow window alone
worth 1.6 us there (13.22 against 14.86). This sweep adds the other knob: fewer, taller tiles per task
(several chunks each), so that wider windows also give teams of at most CLUSTER_MAX_TEAM.

For each window (window_sweep.windows) and each cap K on the tiles of a task (default, then 8 down to
2), it swaps `schedule.task_window` and `schedule.max_tiles_per_task` in this process, plans the
forward (`auto`), checks its one-launch and two-launch outputs bitwise equal and against the default
geometry's, and times it (CUDA events, L2 flushed). Distinct tilings only: a cap that gives the same
tiling as a larger one is skipped, and so is a capped tiling that does not run as one launch.

`--directions bwd` sweeps the backward's geometries the same way (caps BWD_TILE_CAPS: its small rows have
tasks of 22-86 one-chunk tiles, and every tile's partials are summed in its task's combine), timing
`auto` from the default forward's statistics and checking it bitwise against the two launches. With
`--one-launch` it also times, where `auto` takes two launches, the one launch forced ("1") and, where that one
launch's teams run several rounds, one round of larger teams under a residency cap ("1r"): session 57 found
8x256x56x56's backward 12 % faster in one launch of one round (taller tiles), where `schedule.choose_teams`
gives two rounds, no overflow and so two launches (session 58: "1" lost 8.5-26 % wherever `auto` took two
launches, and every "1r" row 10-12 us). Each row's "run" says which.

    python scripts/geometry_sweep.py [--dtype fp16] [--json PATH] [--shapes small|all]
                                     [--shape NxCxHxW[:G8][:silu] ...] [--repeats N]
                                     [--directions fwd|bwd|fwd,bwd] [--one-launch]
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import task_team_sweep  # (scripts/: the shapes, inputs and command line)
import torch
from task_team_sweep import case, timed_row
from window_sweep import windows

import gn_module
from gn_module import ops, schedule

DEFAULT_WINDOW = schedule.task_window
DEFAULT_MAX_TILES = schedule.max_tiles_per_task
TILE_CAPS = (None, 8, 7, 6, 5, 4, 3, 2)
BWD_TILE_CAPS = (None, 32, 24, 16, 12, 8, 6, 4, 2)


def use_geometry(window: int | None, cap: int | None) -> None:
    schedule.task_window = DEFAULT_WINDOW if window is None else (lambda channels, groups, itemsize: window)
    schedule.SMALL_FORWARD_GEOMETRY = window is None and cap is None  # (the default row: as launched)
    if cap is None:
        schedule.max_tiles_per_task = DEFAULT_MAX_TILES
    else:
        schedule.max_tiles_per_task = lambda *args, **kw: min(cap, DEFAULT_MAX_TILES(*args, **kw))
    ops._launches.clear()


def run(shape, groups, act, dname, timer, args=None) -> list[dict]:
    x, dy, w, b, act_id, itemsize = case(shape, groups, act, dname)
    os.environ[ops.ENV_ARCH] = "tasks+bwd"
    directions = args.directions.split(",") if args is not None else ["fwd"]
    rows = []
    if "fwd" in directions:
        rows += _sweep_forward(shape, groups, act, dname, timer, x, w, b, act_id, itemsize)
    if "bwd" in directions:
        rows += _sweep_backward(shape, groups, dname, timer, x, dy, w, b, act_id, itemsize, args)
    use_geometry(None, None)
    return rows


def _geometries(shape, groups, x, itemsize, direction):
    """(window, cap, plan) of every distinct tiling of `direction`: the default first, then each window
    and cap; the forward's capped tilings only where `auto` runs them as one launch."""
    for window in [None, *windows(shape[1], groups, itemsize)]:
        seen = set()
        for cap in TILE_CAPS if direction == "fwd" else BWD_TILE_CAPS:
            use_geometry(window, cap)
            p = ops.plan(x.shape, groups, x.dtype, direction, "auto")
            key = (p.tiling.window, p.tiling.rows_per_tile)
            if key in seen or (direction == "fwd" and cap is not None and p.schedule != 1):
                continue  # (a capped tiling that `auto` runs as two launches: not what the cap asks)
            seen.add(key)
            yield window, cap, p


def _sweep(shape, groups, dname, timer, x, itemsize, direction, check, fn, variants=None) -> list[dict]:
    """Times `fn` at each geometry of `direction`; `check(plan) -> (output, bitwise)` gives the output
    compared with the default geometry's and whether its launches agreed bitwise. `variants(plan)` yields
    further (label, plan, fn, context) to time at a geometry (the backward's forced one launch)."""
    rows = []
    ref = None
    for window, cap, p in _geometries(shape, groups, x, itemsize, direction):
        out, same = check(p)
        if ref is None:
            ref = out
        diff = (out.float() - ref.float()).abs().max().item()
        label = "default" if window is None else str(window)
        runs = [("auto", p, fn, contextlib.nullcontext)]
        runs += list(variants(p)) if variants is not None else []
        for run, q, f, context in runs:
            t = q.tiling
            with context():
                row = timed_row(f, shape, dname, direction, q, timer, window=label, tile_cap=cap, run=run,
                                row_bytes=t.row_bytes, rows_per_tile=t.rows_per_tile)  # fmt: skip
            row.update(max_diff_vs_default=diff, passes_bitwise=same)
            rows.append(row)
            print(
                f"{row['shape']:18} {direction} w={label:7} {t.row_bytes:5d} B cap={cap!s:4} rows/tile="
                f"{t.rows_per_tile:5d} {run:4} {row['us']:8.2f} us  diff {diff:.2e}"
                f" {'same' if same else 'DIFFERENT'}  {row['plan']}",
                flush=True,
            )
    return rows


def _sweep_forward(shape, groups, act, dname, timer, x, w, b, act_id, itemsize) -> list[dict]:
    def check(p):
        with torch.no_grad():
            y1 = ops.forward(x, w, b, groups, 1e-5, act_id, 1)[0] if p.schedule == 1 else None
            y2 = ops.forward(x, w, b, groups, 1e-5, act_id, 2)[0]
        return y2, y1 is None or torch.equal(y1, y2)

    def fn():
        with torch.no_grad():
            return gn_module.group_norm(x, groups, w, b, 1e-5, act)

    return _sweep(shape, groups, dname, timer, x, itemsize, "fwd", check, fn)


def _sweep_backward(shape, groups, dname, timer, x, dy, w, b, act_id, itemsize, args=None) -> list[dict]:
    """The backward (`auto`: two launches, or one where `schedule.l2_backward_one_launch` takes it) at each
    geometry, from one set of statistics (the default forward's), so that only the backward's summation
    order moves the bits; `auto` checked bitwise against the two launches."""
    use_geometry(None, None)
    with torch.no_grad():
        _, mean, rstd = ops.forward(x, w, b, groups, 1e-5, act_id, 2)

    def fn(passes=0):
        return ops.backward(dy, x, w, b, mean, rstd, groups, 1e-5, act_id, passes)

    def check(p):
        dx = fn()[0]
        return dx, torch.equal(dx, fn(2)[0])

    def one_launch(p):
        """Where `auto` takes two launches: the one launch forced ("1": GN_ARCH=tasks+bwd1, whose `passes=1`
        runs the one-pass kernel; tasks+bwd runs two launches for it), and where its teams run several
        rounds, also under the residency cap that leaves one round of teams ("1r": tasks x the most members
        each, so members hold more chunks and may re-read some)."""
        if not one_launches or p.schedule == 1:
            return
        with one_pass_kernel():
            forced = ops.plan(x.shape, groups, x.dtype, "bwd", 1)
        yield "1", forced, functools.partial(fn, 1), one_pass_kernel
        tasks = forced.tiling.tasks
        if forced.teams is not None and forced.teams.rounds > 1 and forced.residency >= tasks:
            cap = tasks * min(forced.tiling.tiles_per_task, forced.residency // tasks)
            with one_pass_kernel(cap):
                one_round = ops.plan(x.shape, groups, x.dtype, "bwd", 1)
            yield "1r", one_round, functools.partial(fn, 1), functools.partial(one_pass_kernel, cap)

    one_launches = args is not None and args.one_launch
    return _sweep(shape, groups, dname, timer, x, itemsize, "bwd", check, fn, one_launch)


@contextlib.contextmanager
def one_pass_kernel(cap: int | None = None):
    """GN_ARCH=tasks+bwd1 (the backward's one-pass kernel for `passes=1`) inside, under a residency cap."""
    saved = os.environ[ops.ENV_ARCH]
    os.environ[ops.ENV_ARCH] = "tasks+bwd1"
    try:
        with gn_module.max_resident_blocks(cap) if cap else contextlib.nullcontext():
            yield
    finally:
        os.environ[ops.ENV_ARCH] = saved


def add_arguments(ap) -> None:
    ap.add_argument("--directions", default="fwd", choices=("fwd", "bwd", "fwd,bwd"),
                    help="the forward's geometries, the backward's, or both (default fwd)")  # fmt: skip
    ap.add_argument("--one-launch", action="store_true",
                    help="the backward: also time the one launch forced where auto takes two, and in one "
                    "round of teams where it runs several")  # fmt: skip


def main() -> int:
    return task_team_sweep.main(run, add_arguments)


if __name__ == "__main__":
    sys.exit(main())
