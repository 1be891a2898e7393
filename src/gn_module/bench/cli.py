"""`python -m gn_module.bench` (the CLI): ours vs PyTorch eager vs torch.compile on issue 6's shapes.

Prints a table (median us, TB/s, fraction of SOL, speedups), times each row's floor (`floor`: one launch
moving the row's minimum bytes), checks the speed targets (reports pass/miss, never fails on a miss; a SOL or
latency target the floor rules out is judged at 90 % of the floor), and optionally writes JSON, a Markdown
section for benchmarks/RESULTS.md and a PNG chart. What exactly is timed: see gn_module.bench.timing
(protocol) and gn_module.bench.impls (calls).

Exit status: 0 after a run (even with target misses or per-implementation errors, which the table
shows); 2 for bad arguments; 3 when no CUDA device is available, or GN_EXPECT_GPU names another GPU than
the one selected (nothing is measured either way).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import shlex
import sys
import time
from collections.abc import Callable, Sequence

from gn_module.bench.cases import (
    ALL_DTYPES,
    CASES,
    DIRECTIONS,
    DTYPES,
    IMPLS,
    OURS,
    QUICK_NAMES,
    Case,
    select_cases,
)
from gn_module.bench.results import Result
from gn_module.bench.targets import check_targets

EXIT_NO_CUDA = 3
#: Defaults sized so the full run (10 shapes x 2 dtypes x 2 directions x 6 implementations, 80 compiled
#: graphs) stays under ~6 minutes on an H200; the compiles dominate.
DEFAULTS = {"reps": 100, "warmup": 5, "min_reps": 10, "max_seconds": 0.4, "copy_mib": 1024}
QUICK = {"reps": 30, "warmup": 3, "min_reps": 5, "max_seconds": 0.15, "copy_mib": 512}


def _csv(choices: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated subset of {','.join(choices)}, got {text!r}"
            )
        return items

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gn_module.bench",
        description=__doc__.split("\n\n")[0] + " Needs a CUDA GPU (exit status 3 without one).",
        epilog="Shapes: "
        + "; ".join(c.name for c in CASES)
        + f". --quick: {', '.join(QUICK_NAMES)}. Saved pytest-benchmark runs: "
        + "'python -m gn_module.bench history --help', '... gate --help', '... table --help'. "
        + "Whole-model training steps with and without the swap: 'python -m gn_module.bench models --help'.",
    )
    p.add_argument(
        "--shapes", help="comma-separated substrings of shape names to keep, e.g. '1x128x1024,G16'"
    )
    p.add_argument(
        "--dtypes",
        type=_csv(ALL_DTYPES),
        help="default fp16,bf16 (quick: fp16); fp16-autocast / bf16-autocast: 16-bit x, float32 weight and "
        "bias, every implementation under CUDA autocast (float32 y and dy)",
    )
    p.add_argument("--directions", type=_csv(DIRECTIONS), default=list(DIRECTIONS), help="default fwd,bwd")
    p.add_argument("--impls", type=_csv(IMPLS), default=list(IMPLS), help=f"default {','.join(IMPLS)}")
    p.add_argument(
        "--quick", action="store_true", help="3 shapes, fp16 only, fewer repetitions (about a minute)"
    )
    p.add_argument(
        "--reps", type=int, help=f"timed repetitions (default {DEFAULTS['reps']}, quick {QUICK['reps']})"
    )
    p.add_argument("--warmup", type=int, help="warm-up calls before timing")
    p.add_argument("--max-seconds", type=float, help="GPU-time budget per measurement; reps shrink to fit it")
    p.add_argument("--min-reps", type=int, help="never fewer repetitions than this")
    p.add_argument("--copy-mib", type=int, help="buffer size of the copy-bandwidth (SOL) measurement, MiB")
    p.add_argument(
        "--no-flush", action="store_true", help="do not flush L2 between repetitions (flatters small shapes)"
    )
    p.add_argument(
        "--no-floors",
        action="store_true",
        help="skip timing each row's floor (one launch moving its minimum bytes), which lowers a SOL, "
        "latency or speedup target the floor rules out to 90 %% of what the floor allows",
    )
    p.add_argument(
        "--chain-floors",
        metavar="PATH",
        help="JSON of scripts/chain_floor.py measured on this GPU: a SOL, latency or speedup target its "
        "bare read-reduce-write chain rules out is judged at 90 %% of what that chain floor allows",
    )
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (default: torch's default)")
    p.add_argument("--device", default="cuda", help="CUDA device, e.g. cuda:1")
    p.add_argument("--json", metavar="PATH", help="write every result, the targets and the context as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write a Markdown section for benchmarks/RESULTS.md")
    p.add_argument(
        "--plot", metavar="PATH", help="write a PNG of TB/s against tensor size (needs matplotlib)"
    )
    return p


def resolve_settings(args: argparse.Namespace) -> dict[str, object]:
    base = QUICK if args.quick else DEFAULTS
    settings = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in base.items()}
    for k in ("reps", "warmup", "min_reps", "copy_mib"):
        if int(settings[k]) < (0 if k == "warmup" else 1):
            raise ValueError(f"--{k.replace('_', '-')} must be positive, got {settings[k]}")
    settings["flush_l2"] = not args.no_flush
    settings["compile_mode"] = args.compile_mode
    settings["floors"] = not args.no_floors
    return settings


def measure_floors(
    cases: list[Case], dtypes: list[str], directions: list[str], timer: object
) -> dict[tuple[str, str, str], float]:
    """Each judged row's floor in microseconds (`floor.measure_floor`), by `Result.key`; printed as measured.
    A row whose floor cannot be timed (out of memory) is left out: its targets stay the issue's."""
    from gn_module.bench.floor import measure_floor

    floors = {}
    for case in cases:
        for dtype in dtypes:
            for direction in directions:
                try:
                    floor = measure_floor(case, dtype, direction, timer)
                except Exception as exc:
                    print(
                        f"{case.name:26} {dtype} {direction} floor: {type(exc).__name__}: {exc}", flush=True
                    )
                    continue
                floors[(case.name, dtype, direction)] = floor.us
                kernels = ", ".join(f"{k} {v:.2f} us" for k, v in floor.kernels_us.items())
                print(f"{case.name:26} {dtype} {direction} floor {floor.us:9.2f} us ({kernels})", flush=True)
    return floors


def run_case(
    impl: str, case: Case, dtype: str, direction: str, device: object, settings: dict, timer: object
) -> Result:
    """Prepare and time one implementation; any exception becomes the result's error."""
    from gn_module.bench import impls
    from gn_module.bench.timing import time_cuda

    t0 = time.perf_counter()
    prepared = None
    try:
        prepared = impls.prepare(impl, case, dtype, direction, device, compile_mode=settings["compile_mode"])
        timing = time_cuda(
            prepared.fn,
            reps=int(settings["reps"]),
            warmup=int(settings["warmup"]),
            min_reps=int(settings["min_reps"]),
            max_seconds=float(settings["max_seconds"]),
            timer=timer,
        )
        return Result(
            case, dtype, direction, impl, timing, plan=prepared.plan, setup_s=time.perf_counter() - t0
        )
    except Exception as exc:
        plan = prepared.plan if prepared is not None else None
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        return Result(
            case, dtype, direction, impl, None, error=error, plan=plan, setup_s=time.perf_counter() - t0
        )
    finally:
        del prepared


#: Subcommands that read saved pytest-benchmark runs (gn_module.bench.history_cli); no GPU needed.
SUBCOMMANDS = ("history", "gate", "table", "save")
#: Model-level training-step benchmark (gn_module.bench.models).
MODELS_COMMAND = "models"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        from gn_module.bench import history_cli

        return history_cli.main(argv[0], argv[1:])
    if argv and argv[0] == MODELS_COMMAND:
        from gn_module.bench import models

        return models.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = resolve_settings(args)
        cases = select_cases(args.shapes.split(",") if args.shapes else None, quick=args.quick)
    except ValueError as exc:
        parser.error(str(exc))
    dtypes = args.dtypes or (["fp16"] if args.quick else list(DTYPES))

    import torch

    if not torch.cuda.is_available():
        print(
            f"gn_module.bench: no CUDA device (torch {torch.__version__}, "
            f"CUDA runtime {torch.version.cuda}); the benchmarks time CUDA kernels and need an NVIDIA GPU. "
            "Nothing was measured.",
            file=sys.stderr,
        )
        return EXIT_NO_CUDA

    from gn_module.bench import report as bench_report
    from gn_module.bench.device import device_info, device_label, unexpected_gpu
    from gn_module.bench.timing import EventTimer, copy_bandwidth, cuda_device

    try:
        device = cuda_device(args.device)
    except (RuntimeError, ValueError) as exc:
        parser.error(f"--device: {exc}")
    torch.cuda.set_device(device)
    if (why := unexpected_gpu(torch.cuda.get_device_name(device))) is not None:
        print(f"gn_module.bench: {why}.", file=sys.stderr)
        return EXIT_NO_CUDA
    chain = None
    if args.chain_floors:
        from gn_module.bench.chain_floors import ChainFloorError, load_chain_floors

        try:
            chain = load_chain_floors(args.chain_floors, torch.cuda.get_device_name(device))
        except ChainFloorError as exc:
            parser.error(f"--chain-floors: {exc}")
        for (name, dtype, direction), us in chain.us.items():
            print(f"{name:26} {dtype} {direction} chain floor {us:9.2f} us ({args.chain_floors})", flush=True)
        for (name, dtype, direction), why in chain.skipped.items():
            print(f"{name:26} {dtype} {direction} chain floor left out: {why}", flush=True)
    info = device_info(device)
    print(f"device: {device_label(info)}", flush=True)
    timer = EventTimer(device, flush=bool(settings["flush_l2"]))
    if not timer.can_delay:
        print("warning: torch.cuda._sleep is missing; host overhead may leak into small-shape timings")
    copy = copy_bandwidth(int(settings["copy_mib"]) << 20, timer=timer)
    print(f"copy bandwidth (SOL): {copy.tbps:.3f} TB/s", flush=True)
    judged = settings["floors"] and OURS in args.impls
    floors = measure_floors(cases, dtypes, args.directions, timer) if judged else {}

    results: list[Result] = []
    started = time.perf_counter()
    for case in cases:
        for dtype in dtypes:
            for direction in args.directions:
                for impl in args.impls:
                    r = run_case(impl, case, dtype, direction, device, settings, timer)
                    results.append(r)
                    shown = r.error or (
                        f"{r.median_us:9.1f} us  {r.tbps:6.3f} TB/s  SOL {r.sol(copy.tbps):5.3f}  "
                        f"(n={r.timing.reps}, iqr {r.timing.iqr_us:.1f} us, setup {r.setup_s:.1f} s)"
                    )
                    print(f"{case.name:26} {dtype} {direction} {impl:13} {shown}", flush=True)
            gc.collect()
            torch.cuda.empty_cache()  # shapes differ a lot in size; avoid fragmentation OOMs
    elapsed = time.perf_counter() - started

    report = bench_report.Report(
        date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        command="python -m gn_module.bench " + shlex.join(argv),
        device=info,
        copy=copy.as_dict(),
        results=results,
        checks=check_targets(results, copy.tbps, floors, chain.us if chain else None),
        floors=floors,
        chain_floors=chain.us if chain else {},
        settings={**settings, "dtypes": ",".join(dtypes), "elapsed_s": round(elapsed, 1)},
    )
    print()
    print(bench_report.render_console(report))
    if args.json:
        bench_report.write_json(report, args.json)
        print(f"wrote {args.json}")
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(bench_report.render_markdown_report(report))
        print(f"wrote {args.markdown}")
    if args.plot:
        if bench_report.write_plot(report, args.plot):
            print(f"wrote {args.plot}")
        else:
            print("matplotlib is not installed; no plot written (pip install matplotlib)")
    print(f"benchmark time: {elapsed:.0f} s")
    return 0
