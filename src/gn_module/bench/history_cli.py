"""`python -m gn_module.bench history|gate|table|save`: saved runs, no GPU needed.

history: every saved run under --storage, per (shape, dtype, direction): ours in us and in fraction of
SOL across runs (commit, date), with the speedup over the best torch.compile of the same run;
--plot writes SOL over commits, one line per shape.

gate: one run (a --benchmark-json file, or the newest saved run) against a baseline (default: each
benchmark's newest time among the other saved runs in --storage timed on the same GPU, name and SM count,
so a partial run, e.g. -k fwd, leaves the other benchmarks gated against the run before it; a run on a GPU
no saved run has is not gated). Exit 1 when one of OUR medians is more than
--threshold percent slower; eager, torch.compile and foreign implementations are reported but never
fail the gate. --recheck: the flagged benchmarks timed again; one within the threshold there is
reported as cleared, not failing.

table: one saved run (--run, default the newest) as Markdown tables, one per dtype and direction: every
implementation's median, and for ours-auto its SOL, its speedup over the best torch.compile and over eager,
and its time in --against (default: each benchmark's newest time among the other saved runs of its GPU) with
the ratio.

save: copy a run (--run, a --benchmark-json file) into the history under the name pytest-benchmark's
autosave gives it, numbered after the runs in --storage and named by the commit the run records
(GN_BENCH_COMMIT, the full sha, where the tree has no current git); --into writes it under another folder
(the same relative path), e.g. a GPU call's output, to be copied into .benchmarks/ and committed.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Sequence
from pathlib import Path

from gn_module.bench import history

EXIT_REGRESSION = 1
EXIT_USAGE = 2


def build_parser(command: str) -> argparse.ArgumentParser:
    doc = (__doc__ or "").split("\n\n")
    p = argparse.ArgumentParser(
        prog=f"python -m gn_module.bench {command}",
        description={"history": doc[1], "gate": doc[2], "table": doc[3], "save": doc[4]}[command],
    )
    p.add_argument(
        "--storage",
        default=".benchmarks",
        help="pytest-benchmark storage folder, plain or file:// (default .benchmarks)",
    )
    if command == "history":
        p.add_argument(
            "--impl", default=history.OURS, help=f"implementation to follow (default {history.OURS})"
        )
        p.add_argument("--plot", metavar="PATH", help="write a PNG of SOL over runs (needs matplotlib)")
        p.add_argument("--newest", action="store_true", help="print only the path of the newest saved run")
        p.add_argument(
            "--gpu",
            metavar="NAME:SMS",
            help="with --newest: the newest run timed on this GPU (torch's device name and SM count), "
            "where one is saved",
        )
        return p
    if command == "save":
        p.add_argument("--run", metavar="JSON", required=True, help="the run (a --benchmark-json file)")
        p.add_argument("--into", metavar="DIR", help="write it under DIR instead of --storage")
        return p
    # gate and table: one run, the newest saved one unless named
    p.add_argument("--run", metavar="JSON", help="the run to judge or show (default: the newest saved run)")
    if command == "table":
        p.add_argument(
            "--against",
            metavar="JSON",
            help="the run to compare with (default: each benchmark's newest time in the other saved runs)",
        )
        p.add_argument("--no-against", action="store_true", help="leave out the comparison columns")
    else:
        p.add_argument(
            "--baseline",
            metavar="JSON",
            help="the baseline (default: each benchmark's newest time in the other saved runs)",
        )
        p.add_argument("--recheck", metavar="JSON", help="the flagged benchmarks timed again (optional)")
        p.add_argument(
            "--threshold",
            type=float,
            default=history.DEFAULT_THRESHOLD * 100,
            help="percent slower that fails (default %(default)s)",
        )
    return p


def main(command: str, argv: Sequence[str]) -> int:
    parser = build_parser(command)
    args = parser.parse_args(list(argv))
    try:
        if command == "history":
            if args.newest:
                gpu = history.parse_gpu(args.gpu) if args.gpu else None
                print(history.newest_run(args.storage, gpu=gpu).path)
                return 0
            runs = history.load_runs(args.storage)
            print(history.render_history(runs, args.impl))
            if args.plot:
                if history.write_history_plot(runs, args.plot, args.impl):
                    print(f"wrote {args.plot}")
                else:
                    print("matplotlib is not installed; no plot written (pip install matplotlib)")
            return 0
        if command == "save":
            target = history.saved_name(args.storage, args.run)
            if args.into:
                target = Path(args.into) / target.relative_to(history.storage_path(args.storage))
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(args.run, target)
            print(target)
            return 0
        current = history.load_run(args.run) if args.run else history.newest_run(args.storage)
        gpu = history.run_gpu(current)  # (defaults compare with runs of the same GPU only)
        if command == "table":
            against = None
            if args.against:
                against = history.load_run(args.against)
            elif not args.no_against and len(history.load_runs(args.storage)) > 1:
                try:
                    against = history.newest_per_benchmark(args.storage, exclude=[current.path], gpu=gpu)
                except history.NoBaselineOnThisGpu as exc:
                    print(f"{exc}: the tables without a comparison")
            print(history.run_tables(current, against))
            return 0
        if args.baseline:
            baseline = history.load_run(args.baseline)
        else:
            try:
                baseline = history.newest_per_benchmark(args.storage, exclude=[current.path], gpu=gpu)
            except history.NoBaselineOnThisGpu as exc:
                print(f"{exc}: nothing to gate; this run is the first of its GPU (saved, it starts one)")
                return 0
        recheck = history.load_run(args.recheck) if args.recheck else None
        result = history.gate(baseline, current, args.threshold / 100, recheck=recheck)
    except ValueError as exc:
        parser.error(str(exc))
    print(history.render_gate(result, baseline, current))
    return 0 if result.ok else EXIT_REGRESSION
