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

    python scripts/geometry_sweep.py [--dtype fp16] [--json PATH] [--shapes small|all]
"""

from __future__ import annotations

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


def use_geometry(window: int | None, cap: int | None) -> None:
    schedule.task_window = DEFAULT_WINDOW if window is None else (lambda channels, groups, itemsize: window)
    schedule.SMALL_FORWARD_GEOMETRY = window is None and cap is None  # (the default row: as launched)
    if cap is None:
        schedule.max_tiles_per_task = DEFAULT_MAX_TILES
    else:
        schedule.max_tiles_per_task = lambda *args, **kw: min(cap, DEFAULT_MAX_TILES(*args, **kw))
    ops._launches.clear()


def run(shape, groups, act, dname, timer) -> list[dict]:
    x, _, w, b, act_id, itemsize = case(shape, groups, act, dname)
    os.environ[ops.ENV_ARCH] = "tasks+bwd"
    rows = []
    ref = None
    for window in [None, *windows(shape[1], groups, itemsize)]:
        seen = set()
        for cap in TILE_CAPS:
            use_geometry(window, cap)
            p = ops.plan(x.shape, groups, x.dtype, "fwd", "auto")
            key = (p.tiling.window, p.tiling.rows_per_tile)
            if key in seen or (cap is not None and p.schedule != 1):
                continue  # (a capped tiling that `auto` runs as two launches: not what the cap asks)
            seen.add(key)
            with torch.no_grad():
                y1 = ops.forward(x, w, b, groups, 1e-5, act_id, 1)[0] if p.schedule == 1 else None
                y2 = ops.forward(x, w, b, groups, 1e-5, act_id, 2)[0]
            same = y1 is None or torch.equal(y1, y2)
            if ref is None:
                ref = y2
            diff = (y2.float() - ref.float()).abs().max().item()

            def fn():
                with torch.no_grad():
                    return gn_module.group_norm(x, groups, w, b, 1e-5, act)

            label = "default" if window is None else str(window)
            row = timed_row(fn, shape, dname, "fwd", p, timer, window=label, tile_cap=cap,
                            row_bytes=p.tiling.row_bytes, rows_per_tile=p.tiling.rows_per_tile)  # fmt: skip
            row.update(max_diff_vs_default=diff, passes_bitwise=same)
            rows.append(row)
            print(
                f"{row['shape']:18} w={label:7} {p.tiling.row_bytes:5d} B cap={cap!s:4} rows/tile="
                f"{p.tiling.rows_per_tile:5d} {row['us']:8.2f} us  diff {diff:.2e}"
                f" {'same' if same else 'DIFFERENT'}  {row['plan']}",
                flush=True,
            )
    use_geometry(None, None)
    return rows


def main() -> int:
    return task_team_sweep.main(run)


if __name__ == "__main__":
    sys.exit(main())
