"""Per-block timeline of the two-launch forward and the task backward on one clock (%globaltimer).

    GN_NVCC_FLAGS=-DGN_TRACE_TIMELINE python scripts/launch_timeline.py [--reps 3]

Without that build flag the trace points record each SM's clock64(), which do not compare across blocks,
and the script refuses to run. Shapes: GN_PROFILE_SHAPES as in scripts/profile_tasks.py (default: the
benchmark's large rows). For each launch it prints, per trace point, the time from the forward's (or
backward's) first block start in us (min / median / max over blocks), then the blocks' stream times and
`balance` = mean / max of them: how much of the launch's span its slowest block alone decides. x (and dy)
come from DRAM: the L2 is flushed before each traced call by the benchmark's read flush (since session 40;
the write flush before it left dirty lines whose write-back landed in the traced launches).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

SHAPES = [
    ((1, 128, 1024, 2048), 16, None),
    ((1, 128, 1024, 1024), 32, "silu"),
    ((32, 128, 256, 256), 32, None),
    ((1, 512, 256, 256), 32, "silu"),
]

#: csrc/gn_forward.cu (timeline builds): stats launch 0 start, 5 copies issued, 6 first chunk in, 7 first
#: tile done, 8 all tiles, 12 arrived, 13 combined (last member), 15 end; apply launch 9 start, 10 statistics
#: in, 11 end.
FORWARD = (
    ("stats: start", 0),
    ("stats: copies issued", 5),
    ("stats: first chunk in", 6),
    ("stats: all tiles", 8),
    ("stats: arrived", 12),
    ("stats: combined (last)", 13),
    ("stats: end", 15),
    ("apply: start", 9),
    ("apply: statistics in", 10),
    ("apply: end", 11),
)
FORWARD_STREAMS = (
    ("stats, first task (first chunk in -> all tiles)", 6, 8),
    ("stats, whole block (start -> end)", 0, 15),
    ("apply, whole block (statistics in -> end)", 10, 11),
)
#: csrc/gn_backward_tasks.cu: stats launch 0 start, 2 reduced, 3 arrived, 4 combined, 5 end; apply launch
#: 8 start (coefficients loaded), 10 dx written, 15 end.
BACKWARD = (
    ("stats: start", 0),
    ("stats: x, dy reduced", 2),
    ("stats: arrived", 3),
    ("stats: combined (last)", 4),
    ("stats: end", 5),
    ("apply: start", 8),
    ("apply: dx written", 10),
    ("apply: end", 15),
)
BACKWARD_STREAMS = (("stats, whole block (start -> end)", 0, 5), ("apply, whole block (start -> end)", 8, 15))


#: Rows of the trace buffer: more blocks than any launch here has (a row per block).
TRACE_ROWS = 4096


def parse_shapes() -> list:
    if not os.environ.get("GN_PROFILE_SHAPES"):
        return SHAPES
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from time_shapes import parse

    return [parse(s) for s in os.environ["GN_PROFILE_SHAPES"].split(",") if s]


def summarize(t: torch.Tensor, points: tuple, streams: tuple) -> list[str]:
    """Lines for one traced call: t is (blocks, 16) int64 ns, -1 where a point was not reached."""
    t = t[(t >= 0).any(dim=1)].double()  # (the buffer has spare rows)
    if not (t[:, 0] >= 0).any():
        return ["  (not traced: this call's launches took another route)"]
    origin = t[:, 0][t[:, 0] >= 0].min()
    lines = []
    for name, p in points:
        v = t[:, p]
        v = v[v >= 0]
        if v.numel():
            us = (v - origin) / 1e3
            lines.append(
                f"  {name:26} {us.min().item():9.2f} {us.median().item():9.2f} {us.max().item():9.2f}"
                f"  ({v.numel()} blocks)"
            )
    for name, a, z in streams:
        ok = (t[:, a] >= 0) & (t[:, z] >= 0)
        if ok.any():
            d = (t[ok, z] - t[ok, a]) / 1e3
            lines.append(
                f"  {name:50} {d.min().item():8.2f} {d.median().item():8.2f} {d.max().item():8.2f}"
                f"  balance {d.mean().item() / d.max().item():.3f}"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="traced calls per shape and direction")
    parser.add_argument("--directions", default="fwd,bwd")
    args = parser.parse_args()
    if "-DGN_TRACE_TIMELINE" not in os.environ.get("GN_NVCC_FLAGS", ""):
        print(
            "launch_timeline.py: set GN_NVCC_FLAGS=-DGN_TRACE_TIMELINE (a build whose trace points read "
            "%globaltimer)",
            file=sys.stderr,
        )
        return 2
    if not torch.cuda.is_available():
        print("launch_timeline.py: needs a CUDA device", file=sys.stderr)
        return 3
    # The C++ autograd node (the default training route) launches without the trace buffer: a backward
    # traced here must come from the Python Function (gn_module.autograd_node: traces keep the Python route).
    os.environ.setdefault("GN_CPP_NODE", "0")
    import gn_module
    from gn_module import ops
    from gn_module.bench.timing import l2_read_flush

    flush = l2_read_flush()  # the benchmark's (a read: no dirty lines left for the traced kernels)
    directions = args.directions.split(",")
    for shape, groups, act in parse_shapes():
        x = torch.randn(shape, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        w = torch.randn(shape[1], device="cuda", dtype=torch.float16)
        b = torch.randn(shape[1], device="cuda", dtype=torch.float16)
        name = "x".join(map(str, shape)) + f" G{groups}" + (f" {act}" if act else "")
        if "fwd" in directions:
            plan = ops.plan(x.shape, groups, x.dtype, "fwd", 2)
            with torch.no_grad():
                gn_module.group_norm(x, groups, w, b, 1e-5, act, passes=2)  # build, warm up
                for rep in range(args.reps):
                    flush()
                    with ops.phase_trace(TRACE_ROWS) as trace:
                        gn_module.group_norm(x, groups, w, b, 1e-5, act, passes=2)
                        torch.cuda.synchronize()
                    print(
                        f"{name} forward, two launches, grid {plan.grid} {plan.teams}, rep {rep} "
                        "(us from the first block's start: min / median / max)"
                    )
                    print("\n".join(summarize(trace.cpu(), FORWARD, FORWARD_STREAMS)), flush=True)
        if "bwd" in directions:
            xg = x.detach().requires_grad_(True)
            wg = w.detach().requires_grad_(True)
            bg = b.detach().requires_grad_(True)
            dy = torch.randn_like(x)
            plan = ops.plan(x.shape, groups, x.dtype, "bwd")
            y = gn_module.group_norm(xg, groups, wg, bg, 1e-5, act)
            torch.autograd.grad(y, (xg, wg, bg), dy, retain_graph=True)
            for rep in range(args.reps):
                flush()
                with ops.phase_trace(TRACE_ROWS) as trace:  # (the launch's grid may differ from `plan`'s)
                    torch.autograd.grad(y, (xg, wg, bg), dy, retain_graph=True)
                    torch.cuda.synchronize()
                print(
                    f"{name} backward, grid {plan.grid} + {plan.strip_blocks} strip blocks, {plan.teams}, "
                    f"schedule {plan.schedule}, rep {rep} (us from the first block's start)"
                )
                rows = trace.cpu()
                print("\n".join(summarize(rows[rows[:, 8] >= 0], BACKWARD, BACKWARD_STREAMS)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
