"""Time the one-launch task forward at forced team sizes, to measure what L2 holds between its phases (GPU).

The one-launch forward (`passes=1`) keeps each member's last `slots` chunks of a task on chip and reads
its earlier chunks again in the apply phase. `schedule.choose_teams` prices such a re-read as a DRAM
read, so on a tensor larger than the chip it picks one team of every resident block walking the tasks
round after round (32x128x256x256: 32 rounds of 256 blocks, 836 us), and `passes="auto"` then prefers
two launches. Fewer teams re-read more; a team whose re-read chunks fit in L2 may re-read them at L2
speed, more so when the first read asks L2 to keep them: the kernels of
`benchmarks/results/2026-12-01-l2-onepass-policies.patch` (evict_last on the re-read chunks' first read;
`git apply` it to a copy of csrc/ and point GN_CSRC_DIR there). Measured on the H200: RESULTS.md, session 12.

For each shape this script times `passes="auto"`, `passes=2` and `passes=1` at the natural plan and
with `schedule.choose_teams` replaced by a fixed team size m (m = residency / k), and prints each
plan's L2 footprint (teams x members x re-read chunks x chunk bytes) beside the median (CUDA events,
L2 flushed). Every forced plan's y must be bitwise equal to the two-launch y (the team changes which
block reduces which tile, never the arithmetic); a difference is reported and fails the run.

    python scripts/l2_team_sweep.py [--dtypes fp16,bf16] [--shapes 32x128x256x256,...] [--json PATH]

`--shapes` keeps the listed shapes of SHAPES (by their NxCxHxW); any other NxCxHxW[:G] is timed too
(G 32 unless given, no activation). `--natural-only` skips the forced team sizes.
`--stagger NS[:PHASES],...` times every one-launch plan again under each team stagger (ops.team_stagger:
team j starts (j % PHASES) x NS late, PHASES 2 unless given), which tells whether teams that wait in
lockstep with DRAM idle, rather than the waits themselves, cost the multi-team plans. Staggered rows must
be bitwise equal too.

Run it twice in one session, once with GN_CSRC_DIR at the patched kernels, to see the policies' share.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

import gn_module
from gn_module import ops, schedule
from gn_module.bench.timing import EventTimer, time_cuda

DT = {"fp16": torch.float16, "bf16": torch.bfloat16}
SHAPES = [
    ((32, 128, 256, 256), 32, None),
    ((1, 512, 256, 256), 32, "silu"),
    ((1, 256, 512, 512), 32, "silu"),
    ((8, 256, 128, 128), 32, "silu"),
    ((1, 512, 128, 128), 32, "silu"),
]
NATURAL_CHOOSE_TEAMS = schedule.choose_teams


def forced_teams(m: int):
    """A choose_teams that always answers teams of m members (as many as the blocks and tasks allow)."""

    def choose(t: schedule.TaskTiling, blocks: int, slots: int) -> schedule.TaskTeams:
        size = max(1, min(m, t.tiles_per_task, blocks))
        teams = min(blocks // size, t.tasks)
        rounds = -(-t.tasks // teams)
        chunks = -(-t.tiles_per_task // size) * t.chunks_per_tile
        return schedule.TaskTeams(size, teams, rounds, chunks, max(0, chunks - slots))

    return choose


def use_teams(choose) -> None:
    schedule.choose_teams = choose
    ops._launches.clear()


def describe(p) -> dict:
    t, tm = p.tiling, p.teams
    reread = tm.teams * tm.team_size * tm.overflow_chunks * t.chunk_bytes
    footprint = reread / 2**20 if p.schedule == 1 else 0.0
    return {
        "m": tm.team_size, "teams": tm.teams, "rounds": tm.rounds, "chunks": tm.chunks_per_member,
        "over": tm.overflow_chunks, "slots": p.slots, "grid": p.grid, "sched": p.schedule,
        "l2_mib": round(footprint, 1),
    }  # fmt: skip


def sweep(
    shape,
    groups,
    act,
    dname: str,
    timer: EventTimer,
    staggers: list[tuple[int, int]],
    natural_only: bool = False,
) -> tuple[list[dict], int]:
    dtype = DT[dname]
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.empty(shape, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
    x.normal_(3.0, 2.0, generator=gen)
    c = shape[1]
    w = torch.empty(c, device="cuda").normal_(1.0, 0.2, generator=gen).to(dtype)
    b = torch.empty(c, device="cuda").normal_(0.0, 0.2, generator=gen).to(dtype)
    rows, bad = [], 0
    name = "x".join(map(str, shape)) + f"-G{groups}" + (f"-{act}" if act else "")

    def run(passes):
        with torch.no_grad():
            return gn_module.group_norm(x, groups, w, b, 1e-5, act, passes=passes)

    use_teams(NATURAL_CHOOSE_TEAMS)
    ref = run(2)
    natural = ops.plan(x.shape, groups, dtype, "fwd", 1)
    residency = natural.residency
    configs: list[tuple[str, object, int | str]] = [
        ("auto", NATURAL_CHOOSE_TEAMS, "auto"),
        ("2-pass", NATURAL_CHOOSE_TEAMS, 2),
        ("1-pass natural", NATURAL_CHOOSE_TEAMS, 1),
    ]
    seen = {natural.teams.team_size}
    for k in () if natural_only else (1, 2, 3, 4, 6, 8, 12, 16):
        m = min(residency // k, natural.tiling.tiles_per_task)
        if m >= 1 and m not in seen:
            seen.add(m)
            configs.append((f"1-pass m={m}", forced_teams(m), 1))
    runs = [(label, choose, passes, (0, 2)) for label, choose, passes in configs]
    for ns, phases in staggers:
        runs += [(f"{label} st={ns}:{phases}", choose, passes, (ns, phases))
                 for label, choose, passes in configs if passes == 1]  # fmt: skip
    for label, choose, passes, (ns, phases) in runs:
        use_teams(choose)
        p = ops.plan(x.shape, groups, dtype, "fwd", passes)
        with ops.team_stagger(ns, phases):
            y = run(passes)
            same = torch.equal(y, ref)
            bad += not same
            timing = time_cuda(
                lambda passes=passes: run(passes),
                reps=30,
                warmup=3,
                min_reps=10,
                max_seconds=0.2,
                timer=timer,
            )
        row = {"shape": name, "dtype": dname, "config": label, "us": round(timing.median_us, 1),
               "bitwise_equal_2pass": same, "stagger_ns": ns if passes == 1 else 0,
               **describe(p)}  # fmt: skip
        rows.append(row)
        print(
            f"{name:24} {dname} {label:26} {row['us']:8.1f} us  m={row['m']} teams={row['teams']} "
            f"rounds={row['rounds']} chunks={row['chunks']} over={row['over']} slots={row['slots']} "
            f"L2={row['l2_mib']} MiB sched={row['sched']} {'' if same else 'NOT BITWISE EQUAL'}",
            flush=True,
        )
        del y
    use_teams(NATURAL_CHOOSE_TEAMS)
    return rows, bad


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="fp16")
    ap.add_argument("--shapes", help="comma-separated NxCxHxW of SHAPES to keep (default: all)")
    ap.add_argument("--json")
    ap.add_argument("--natural-only", action="store_true", help="only auto, 2-pass and the natural plan")
    ap.add_argument("--stagger", default="", help="comma-separated NS[:PHASES] team staggers to time too")
    args = ap.parse_args()
    try:
        staggers = [ops._parse_stagger(v) for v in args.stagger.split(",") if v]
    except ValueError as exc:
        ap.error(str(exc))
    shapes = list(SHAPES)
    if args.shapes:
        known = {"x".join(map(str, s[0])): s for s in SHAPES}
        shapes = []
        for spec in args.shapes.split(","):
            dims, _, groups = spec.partition(":")
            try:
                case = known.get(spec) or (tuple(int(d) for d in dims.split("x")), int(groups or 32), None)
            except ValueError:
                ap.error(f"--shapes: {spec!r} is not NxCxHxW[:G]")
            shapes.append(case)
    timer = EventTimer(torch.device("cuda", torch.cuda.current_device()))
    rows, bad = [], 0
    for dname in args.dtypes.split(","):
        for shape, groups, act in shapes:
            r, b = sweep(shape, groups, act, dname, timer, staggers, args.natural_only)
            rows += r
            bad += b
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    if bad:
        print(f"FAILED: {bad} forced plans differ from the two-launch y", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
