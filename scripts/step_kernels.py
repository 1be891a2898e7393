"""Where a training step's GPU time goes, configuration by configuration: kernels by their launching op.

`python -m gn_module.bench models` says how much GPU time a step takes with torch's GroupNorm, with ours
and with no GroupNorm at all (`--gn-free`); this script says which kernels make the difference. It
profiles a few steps of each configuration of one model (torch.profiler, CPU and CUDA activities) and
sums each kernel's device time under a key: the autograd node (backward) or the outermost op (forward)
that launched it, and the kernel's short name. Then it prints, per key, the milliseconds per step of every
configuration, sorted by how much more the first configuration spends than the second.

    python scripts/step_kernels.py --model vae --precision bf16 --configs swapped,gn_free,contiguous
    python scripts/step_kernels.py --model vae --fuse-calls --autocast-output input --json out.json

Configurations are `gn_module.bench.models`'s: contiguous and channels_last (torch's GroupNorm), swapped
(`convert_groupnorm`, channels_last), gn_free (the swapped model with every GroupNorm replaced by identity,
the activations the swap fused into them included) and gn_free_dtypes (the same with torch's output dtype).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence

from gn_module.bench.gn_share import device_us, is_device_event

NODE_PREFIX = "autograd::engine::evaluate_function: "


def short_kernel(name: str) -> str:
    """A kernel's name without its return type, cut to 100 characters (torch's elementwise kernels are
    told apart by their template arguments: direct_copy_kernel_cuda, silu, ...)."""
    return name.removeprefix("void ")[:100]


def launcher(event: object) -> str:
    """The autograd node (backward) or the outermost op (forward) above a CPU op event."""
    chain = [event]
    while getattr(chain[-1], "cpu_parent", None) is not None:
        chain.append(chain[-1].cpu_parent)
    for e in chain:
        if e.name.startswith(NODE_PREFIX):
            return f"bwd {e.name.removeprefix(NODE_PREFIX)}"
    named = [e for e in chain if e.name.startswith(("aten::", "gn_module::")) or "::" not in e.name]
    outer = named[-1] if named else chain[-1]
    return f"fwd {outer.name}"


UNLINKED = "(no CPU op)"


def kernel_table(events: Iterable[object], steps: int) -> dict[tuple[str, str], float]:
    """ms per step of device time by (launcher, short kernel name). Device events the profiler linked to
    no CPU op (it misses some launches) are keyed by UNLINKED, so the table's total is the step's device
    time."""
    events = list(events)
    table: dict[tuple[str, str], float] = defaultdict(float)
    linked: dict[str, float] = defaultdict(float)
    for e in events:
        for k in getattr(e, "kernels", ()):
            table[(launcher(e), short_kernel(k.name))] += k.duration * 1e-3 / steps
            linked[k.name] += k.duration
    device: dict[str, float] = defaultdict(float)
    for e in events:
        if is_device_event(e):
            device[e.name] += device_us(e)
    for name, us in device.items():
        if us - linked.get(name, 0.0) > 0.5:  # microseconds, summed over the profiled steps
            table[(UNLINKED, short_kernel(name))] += (us - linked.get(name, 0.0)) * 1e-3 / steps
    return dict(table)


def render(tables: dict[str, dict[tuple[str, str], float]], top: int) -> str:
    configs = list(tables)
    keys = set().union(*tables.values())
    first, second = configs[0], configs[1] if len(configs) > 1 else configs[0]

    def diff(k: tuple[str, str]) -> float:
        return tables[first].get(k, 0.0) - tables[second].get(k, 0.0)

    lines = ["total ms/step: " + ", ".join(f"{c} {sum(t.values()):.2f}" for c, t in tables.items())]
    lines.append(f"sorted by {first} - {second}, the {top} largest differences either way")
    head = " | ".join(f"{c:>12}" for c in configs)
    lines.append(f"{'launcher':48} {'kernel':70} {head} {'diff':>8}")
    ranked = sorted(keys, key=lambda k: -abs(diff(k)))[:top]
    for k in sorted(ranked, key=lambda k: -diff(k)):
        cells = " | ".join(f"{tables[c].get(k, 0.0):12.3f}" for c in configs)
        lines.append(f"{k[0][:48]:48} {k[1][:70]:70} {cells} {diff(k):8.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vae")
    p.add_argument("--precision", default="bf16", choices=("fp32", "bf16"))
    p.add_argument("--configs", default="swapped,gn_free,contiguous")
    p.add_argument("--steps", type=int, default=3, help="profiled steps per configuration")
    p.add_argument("--fuse-calls", action="store_true")
    p.add_argument("--autocast-output", default="float32", choices=("float32", "input"))
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--json", help="write every configuration's table here")
    args = p.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from gn_module.bench import models

    if not torch.cuda.is_available():
        print("step_kernels: needs a CUDA device", file=sys.stderr)
        return 3
    device = torch.device("cuda")
    spec = models.MODELS[args.model]
    settings = models.Settings(fuse_calls=args.fuse_calls, autocast_output=args.autocast_output)
    gen = torch.Generator().manual_seed(settings.seed)
    batch_cpu = spec.make_batch(False, models.batch_size(spec, settings), gen)
    tables: dict[str, dict[tuple[str, str], float]] = {}
    for config in args.configs.split(","):
        t = models.prepare(spec, config, args.precision, False, batch_cpu, device, settings)
        if t.step is None:
            print(f"{config}: {t.m.error}", file=sys.stderr)
            continue
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                t.step()
            torch.cuda.synchronize()
        tables[config] = kernel_table(prof.events(), args.steps)
        t.step = None
        del t
        torch.cuda.empty_cache()
    options = f"fuse_calls={args.fuse_calls}, autocast_output={args.autocast_output}"
    print(f"{args.model} {args.precision}, {options}")
    print(render(tables, args.top))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({c: [[k[0], k[1], v] for k, v in t.items()] for c, t in tables.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
