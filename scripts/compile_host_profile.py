"""Where a compiled training step's host time goes: one model, baseline (torch's GroupNorm) and swapped
(convert_groupnorm), each torch.compile'd the way `python -m gn_module.bench models --compile` builds it
(gn_module.bench.models.prepare), then per configuration:

- the step's wall time and the host's time to issue it from an idle GPU (medians);
- dynamo's frame and graph-break counters;
- a cProfile of `--profile-steps` steps: the top functions by own time, and the calls of our ops;
- with `--code-dir`, Inductor's generated wrappers (TORCHINDUCTOR_CACHE_DIR is set to that folder before
  torch is imported), so the code around each op call can be read afterwards.

    python scripts/compile_host_profile.py --model unet --precision bf16 --out OUT/host.txt \
        --code-dir OUT/inductor [--compile-mode reduce-overhead]

Benchmarks/RESULTS.md, sessions 20-21: the compiled swapped UNet's step waits on the host (33-44 ms against
26-27 ms for the baseline, 19-20 ms of GPU work each), and its 58 op calls account for 7-9 ms of that.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="unet", help="a gn_module.bench models name (default unet)")
    p.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    p.add_argument("--configs", default="channels_last,swapped", help="comma-separated configurations")
    p.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    p.add_argument("--profile-steps", type=int, default=10, help="steps under cProfile")
    p.add_argument("--top", type=int, default=30, help="functions listed per configuration")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (default: torch's default)")
    p.add_argument("--code-dir", type=Path, help="keep Inductor's generated code here")
    p.add_argument("--out", type=Path, help="also write the report here")
    return p.parse_args(argv)


def profile_text(prof: cProfile.Profile, top: int, steps: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    ours = io.StringIO()
    pstats.Stats(prof, stream=ours).sort_stats("cumulative").print_stats(r"gn_module", 15)
    mine = f"-- gn_module's functions by cumulative time --\n{ours.getvalue()}"
    return f"(per {steps} steps)\n{out.getvalue()}\n{mine}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.code_dir is not None:
        args.code_dir.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(args.code_dir.resolve())
    import torch
    from torch._dynamo.utils import counters

    from gn_module.bench import model_zoo, models

    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    spec = model_zoo.MODELS[args.model]
    settings = models.Settings(compile_mode=args.compile_mode)
    gen = torch.Generator().manual_seed(settings.seed)
    batch_cpu = spec.make_batch(False, models.batch_size(spec, settings), gen)
    title = f"{args.model} {args.precision} torch.compile mode={args.compile_mode}, torch {torch.__version__}"
    report = [title]
    for config in args.configs.split(","):
        counters.clear()
        with models._compile_context(True):
            t = models.prepare(spec, config, args.precision, True, batch_cpu, device, settings)
            if t.step is None:
                report.append(f"== {config}: failed: {t.m.error}")
                continue
            walls = []
            for _ in range(args.steps):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                t.step()
                torch.cuda.synchronize()
                walls.append((time.perf_counter() - t0) * 1e3)
            issue = models.host_submit_ms(t.step, args.steps, device)
            prof = cProfile.Profile()
            torch.cuda.synchronize()
            prof.enable()
            for _ in range(args.profile_steps):
                t.step()
                torch.cuda.synchronize()
            prof.disable()
            frames = {k: dict(v) for k, v in counters.items() if k in ("frames", "graph_break", "stats")}
            report += [
                f"== {config}: compile {t.m.first_step_s:.1f} s, step {statistics.median(walls):.2f} ms "
                f"(min {min(walls):.2f}), host issue {issue:.2f} ms",
                f"dynamo counters: {frames}",
                profile_text(prof, args.top, args.profile_steps),
            ]
            del t
            models._free(device)
    text = "\n".join(report)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
