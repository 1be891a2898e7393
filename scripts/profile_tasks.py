"""Per-call GPU time of the task forward (GN_ARCH=tasks): single calls vs back-to-back calls, for ncu.

python scripts/profile_tasks.py [--once]     # --once: one call per shape (under ncu)
python scripts/profile_tasks.py --trace      # the one-pass forward's phases per block (a build with
                                             # GN_NVCC_FLAGS=-DGN_TRACE_PROLOGUE: its prologue too)
python scripts/profile_tasks.py --trace-bwd  # the task backward's phases per block and its launches' times
python scripts/profile_tasks.py --launches-fwd  # the two-launch forward's stats and apply launches' times
python scripts/profile_tasks.py --once-bwd   # one backward per shape (its plan's launches, under ncu)

GN_PROFILE_SHAPES="1x128x1024x2048:G16,32x128x240x256" replaces the fixed shapes (scripts/time_shapes.py's
format: NxCxHxW[:G<groups>][:silu]), e.g. to time the stats launch on ranges that are not powers of two.
GN_PROFILE_SAMPLE_TILES=N and GN_PROFILE_LAUNCH_TILES=N set the tile budgets as time_shapes.py's
--sample-tiles and --launch-tiles do (an experiment's tilings: 1x512x256x256 at 1024 per sample runs one
team of 256 for 4 rounds).
Before each profiled or traced call the L2 is flushed as the benchmark does (a read); until session 40 it
was a write (zeroing 256 MiB), whose dirty lines were written back inside the measured launches.
"""

from __future__ import annotations

import itertools
import os
import sys

import torch

# The C++ autograd node (the default training route) launches without the trace buffer: a backward traced
# here must come from the Python Function (gn_module.autograd_node: traces keep the Python route).
os.environ.setdefault("GN_CPP_NODE", "0")

os.environ.setdefault("GN_ARCH", "tasks+bwd")  # the default: task forward and backward
import gn_module
from gn_module.bench.timing import l2_read_flush  # the benchmark's flush: a read, no dirty lines left

SHAPES = [
    ((2, 1280, 16, 16), 32, "silu"),
    ((2, 320, 64, 64), 32, "silu"),
    ((1, 512, 128, 128), 32, "silu"),
    ((32, 128, 256, 256), 32, None),
    ((1, 128, 1024, 2048), 16, None),
]


if os.environ.get("GN_PROFILE_SHAPES"):
    from time_shapes import parse  # this folder is sys.path[0] when run as a script

    SHAPES = [parse(s) for s in os.environ["GN_PROFILE_SHAPES"].split(",") if s]
if os.environ.get("GN_PROFILE_SAMPLE_TILES") or os.environ.get("GN_PROFILE_LAUNCH_TILES"):
    from time_shapes import set_tile_budgets

    set_tile_budgets(
        *(
            int(os.environ[k]) if os.environ.get(k) else None
            for k in ("GN_PROFILE_SAMPLE_TILES", "GN_PROFILE_LAUNCH_TILES")
        )
    )


#: One-pass trace points per round r: 1+4r stats done, 2+4r arrived, 3+4r mean/rstd in smem, 4+4r applied.
PHASES = ("stats", "arrive", "wait+stats", "apply")


def print_trace(label: str, trace: torch.Tensor, ghz: float, rounds: int) -> None:
    t = trace.cpu()
    reached = t[:, 0] >= 0
    t = t[reached]
    print(f"{label}: {int(reached.sum())} blocks traced (us at {ghz:.2f} GHz: median / max over blocks)")
    for r in range(min(3, rounds)):
        prev = t[:, 0] if r == 0 else t[:, 4 * r]
        for k, name in enumerate(PHASES):
            cur = t[:, 1 + 4 * r + k]
            ok = (cur >= 0) & (prev >= 0)
            if ok.any():
                d = (cur[ok] - prev[ok]).double() / (ghz * 1e3)
                print(f"  round {r} {name:13} {d.median().item():8.2f} / {d.max().item():8.2f}")
            prev = cur
    # a build with -DGN_TRACE_PROLOGUE also traces a one-round launch's prologue: 9 placed, 10 shifts issued
    prologue = rounds == 1 and bool(((t[:, 9] >= 0) & (t[:, 10] >= t[:, 9]) & (t[:, 5] >= t[:, 10])).all())
    if rounds == 1:  # points 5-8 are inside the stats phase (fwd_task_onepass)
        print("  inside round 0's stats (one-round launches):")
        prev = t[:, 0]
        inside = ((5, "copies issued"), (6, "first chunk in"), (7, "first tile done"), (8, "all tiles"))
        if prologue:
            inside = ((9, "placed"), (10, "shifts issued"), *inside)
        for point, name in inside:
            cur = t[:, point]
            ok = (cur >= 0) & (prev >= 0)
            if ok.any():
                d = (cur[ok] - prev[ok]).double() / (ghz * 1e3)
                print(f"    {name:15} {d.median().item():8.2f} / {d.max().item():8.2f}")
            prev = cur
    # round 0's last member: 13 its flag raised (every partial is in), 14 its own combine done
    last = (t[:, 13] >= 0) & (t[:, 1] >= 0)
    if last.any():
        publish = (t[last, 13] - t[last, 1]).double() / (ghz * 1e3)
        combine = (t[last, 14] - t[last, 13]).double() / (ghz * 1e3)
        pub, c = publish.max().item(), combine.max().item()
        print(f"  round 0's last member: arrive + flag {pub:.2f}, combine {c:.2f}")
        # a one-round launch's last member may also trace inside its combine (points 9-12 are free there)
        steps = [
            p for p in (13, 9, 10, 11, 12, 14) if p == 13 or (not prologue and bool((t[last, p] >= 0).all()))
        ]
        if rounds == 1 and len(steps) > 2:
            parts = [
                f"{a}->{b} {((t[last, b] - t[last, a]).double() / (ghz * 1e3)).max().item():.2f}"
                for a, b in itertools.pairwise(steps)
            ]
            print("    inside the combine (trace points): " + ", ".join(parts))
    end = t[:, 15]
    total = (end - t[:, 0]).double() / (ghz * 1e3)
    print(f"  whole block   {total.median().item():8.2f} / {total.max().item():8.2f}")


def trace_all() -> int:
    from gn_module import ops

    ghz = (
        torch.cuda.get_device_properties(0).clock_rate / 1e6
        if hasattr(torch.cuda.get_device_properties(0), "clock_rate")
        else 1.98
    )
    flush = l2_read_flush()
    for shape, groups, act in SHAPES:
        x = torch.randn(shape, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        w = torch.randn(shape[1], device="cuda", dtype=torch.float16)
        b = torch.randn(shape[1], device="cuda", dtype=torch.float16)
        plan = ops.plan(x.shape, groups, x.dtype, "fwd", 1)
        with torch.no_grad():
            gn_module.group_norm(x, groups, w, b, 1e-5, act, passes=1)  # warm up, build
            flush()  # x comes from DRAM, as in the benchmarks
            with ops.phase_trace(plan.grid) as trace:
                gn_module.group_norm(x, groups, w, b, 1e-5, act, passes=1)
                torch.cuda.synchronize()
        label = f"{'x'.join(map(str, shape))} one-pass grid {plan.grid} {plan.teams}"
        print_trace(label, trace, ghz, plan.teams.rounds)
    return 0


#: Task backward trace points (csrc/gn_backward_tasks.cu): the stats launch's 0 and 2-5, the apply launch's
#: 8, 10 and 15 (a block's dweight/dbias strips run behind its first copies: inside 8-10).
BWD_PHASES = (
    ("stats launch: parameters in, x and dy reduced", 0, 2),
    ("stats launch: arrive", 2, 3),
    ("stats launch: last member's combine", 3, 4),
    ("stats launch: whole block", 0, 5),
    ("apply launch: coefficients in, dx written (strips included)", 8, 10),
    ("apply launch: whole block", 8, 15),
)
#: The one-launch backward's (GN_ARCH=tasks+bwd1, where passes="auto" takes it): bwd_task_onepass's points.
BWD_ONEPASS_PHASES = (
    ("one launch: x and dy reduced", 0, 2),
    ("one launch: arrive", 2, 3),
    ("one launch: the task's statistics in", 3, 4),
    ("one launch: its dweight/dbias strips", 4, 6),
    ("one launch: dx written", 6, 10),
    ("one launch: dweight/dbias totals", 11, 12),
    ("one launch: whole block", 0, 15),
)


def trace_backward() -> int:
    """Per block, the task backward's phases on its first task (median / max over blocks, us), then the
    device time of each of its launches (torch.profiler, median of 10 calls); x and dy from DRAM. Under
    GN_ARCH=tasks+bwd1 the shapes whose plan takes one launch show the one-launch kernel's phases."""
    from gn_module import ops

    props = torch.cuda.get_device_properties(0)
    ghz = props.clock_rate / 1e6 if hasattr(props, "clock_rate") else 1.98
    flush = l2_read_flush()
    # GN_PROFILE_PAD_KIB=k: k KiB allocated ahead of each shape's tensors move them (and dx) to other
    # addresses (session 8's open question: does the apply's 7 % come from where dx lands?)
    pad_kib = int(os.environ.get("GN_PROFILE_PAD_KIB", "0"))
    for shape, groups, act in SHAPES:
        pad = torch.empty(pad_kib << 10, dtype=torch.uint8, device="cuda") if pad_kib else None
        x = torch.randn(shape, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        x.requires_grad_(True)
        w = torch.randn(shape[1], device="cuda", dtype=torch.float16, requires_grad=True)
        b = torch.randn(shape[1], device="cuda", dtype=torch.float16, requires_grad=True)
        dy = torch.randn_like(x)
        plan = ops.plan(x.shape, groups, x.dtype, "bwd")
        y = gn_module.group_norm(x, groups, w, b, 1e-5, act)
        torch.autograd.grad(y, (x, w, b), dy, retain_graph=True)  # warm up, build
        flush()
        with ops.phase_trace(plan.grid + plan.strip_blocks) as trace:  # (the apply's strip blocks too)
            torch.autograd.grad(y, (x, w, b), dy, retain_graph=True)
            torch.cuda.synchronize()
        t = trace.cpu()
        print(f"{'x'.join(map(str, shape))} backward grid {plan.grid} {plan.teams} (us at {ghz:.2f} GHz)")
        strip_rows = torch.arange(t.shape[0]) >= plan.grid  # the apply launch's strip blocks, if any
        phases = BWD_ONEPASS_PHASES if plan.schedule == 1 else BWD_PHASES
        if plan.schedule == 2 and ops.strip_blocks_enabled() and plan.strip_blocks:
            phases = (*phases, ("apply launch: a strip block (strips, totals)", 8, 15))
        for name, a, z in phases:
            ok = (t[:, a] >= 0) & (t[:, z] >= 0)
            ok &= strip_rows if name.startswith("apply launch: a strip block") else ~strip_rows
            if ok.any():
                d = (t[ok, z] - t[ok, a]).double() / (ghz * 1e3)
                med, most, blocks = d.median().item(), d.max().item(), int(ok.sum())
                print(f"  {name:38} {med:8.2f} / {most:8.2f}  ({blocks} blocks)")
        if pad is not None:
            print(f"  (tensors allocated after a {pad_kib} KiB pad: x at {x.data_ptr():#x})")
        grads = lambda y=y, x=x, w=w, b=b, dy=dy: torch.autograd.grad(y, (x, w, b), dy, retain_graph=True)  # noqa: E731
        for name, us in launch_times(grads, "bwd_task", flush).items():
            print(f"  kernel {name:31} {us:8.2f} us (median of 10)")
    return 0


def launch_times(call, name_part: str, flush, calls: int = 10) -> dict[str, float]:
    """Median device time (us) of each kernel whose name holds `name_part` over `calls` calls of `call`,
    L2 flushed before each (torch.profiler)."""
    launches: dict[str, list[float]] = {}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush()
            call()
        torch.cuda.synchronize()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and name_part in e.name:
            launches.setdefault(e.name.split("<")[0].split("(")[0], []).append(e.device_time)
    return {name: sorted(t)[len(t) // 2] for name, t in sorted(launches.items())}


def launches_forward() -> int:
    """The two-launch forward (passes=2) per shape: each launch's device time and the stats launch's
    read rate / the apply launch's read + write rate (TB/s)."""
    from gn_module import ops

    flush = l2_read_flush()
    for shape, groups, act in SHAPES:
        x = torch.randn(shape, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        w = torch.randn(shape[1], device="cuda", dtype=torch.float16)
        b = torch.randn(shape[1], device="cuda", dtype=torch.float16)

        def call(x=x, w=w, b=b, groups=groups, act=act):
            with torch.no_grad():
                return gn_module.group_norm(x, groups, w, b, 1e-5, act, passes=2)

        call()
        nbytes = x.numel() * x.element_size()
        plan = ops.plan(x.shape, groups, x.dtype, "fwd", 2)
        t = plan.tiling
        print(f"{'x'.join(map(str, shape))} forward, two launches ({nbytes / 2**20:.0f} MiB per tensor)")
        print(f"  grid {plan.grid} {plan.teams}; tiles per task {t.tiles_per_task} of {t.rows_per_tile} rows")
        for name, us in launch_times(call, "fwd_task", flush).items():
            moved = nbytes * (2 if "apply" in name else 1)
            print(f"  kernel {name:31} {us:8.2f} us  {moved / us / 1e6:5.2f} TB/s")
    return 0


def backward_once() -> int:
    """A forward and a backward per shape, twice (the plan `auto` picks; the first pair also builds): what
    ncu_tasks.sh profiles under NCU_DIRECTION=bwd, each backward launch of both pairs."""
    for shape, groups, act in SHAPES:
        x = torch.randn(shape, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        x.requires_grad_(True)
        w = torch.randn(shape[1], device="cuda", dtype=torch.float16, requires_grad=True)
        b = torch.randn(shape[1], device="cuda", dtype=torch.float16, requires_grad=True)
        dy = torch.randn_like(x)
        for _ in range(2):
            gn_module.group_norm(x, groups, w, b, 1e-5, act).backward(dy)
            torch.cuda.synchronize()
        print(f"{'x'.join(map(str, shape))}: backward twice")
    return 0


def main() -> int:
    if "--once-bwd" in sys.argv:
        return backward_once()
    if "--launches-fwd" in sys.argv:
        return launches_forward()
    if "--trace-bwd" in sys.argv:
        return trace_backward()
    if "--trace" in sys.argv:
        return trace_all()
    once = "--once" in sys.argv
    for shape, groups, act in SHAPES:
        x = torch.randn(shape, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        w = torch.randn(shape[1], device="cuda", dtype=torch.float16)
        b = torch.randn(shape[1], device="cuda", dtype=torch.float16)
        for passes in (1, 2):

            def call(passes=passes, x=x, w=w, b=b, groups=groups, act=act):
                with torch.no_grad():
                    return gn_module.group_norm(x, groups, w, b, 1e-5, act, passes=passes)

            call()
            torch.cuda.synchronize()
            if once:
                call()
                torch.cuda.synchronize()
                continue
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(50):
                call()
            e.record()
            e.synchronize()
            burst = s.elapsed_time(e) * 1e3 / 50
            singles = []
            for _ in range(20):
                torch.cuda._sleep(200000)
                s.record()
                call()
                e.record()
                e.synchronize()
                singles.append(s.elapsed_time(e) * 1e3)
            singles.sort()
            print(
                f"{'x'.join(map(str, shape))} passes={passes}: back-to-back {burst:.1f} us/call, "
                f"single median {singles[10]:.1f} us"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
