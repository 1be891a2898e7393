"""DDP check for GNSwapCallback: 2-device training must follow the 1-device loss curve.

    NCCL_NVLS_ENABLE=0 python scripts/ddp_check.py                    # 2 GPUs, 32-true
    python scripts/ddp_check.py --precision bf16-mixed
    python scripts/ddp_check.py --accelerator cpu --tiny                # logic check without GPUs

Runs examples/train_unet.py three times with the same seed and the same global batches:
  single:     1 device,  --swap,    batch B
  ddp:        2 devices, --swap,    batch B/2 per device
  ddp-plain:  2 devices, --no-swap, batch B/2 per device (what DDP alone does, for scale)
and prints the per-step losses and the largest relative difference of each curve from `single`.
Exits 1 when `ddp` differs from `single` by more than --rtol at any step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RTOL = {"32-true": 2e-2, "16-mixed": 5e-2, "bf16-mixed": 5e-2, "bf16-true": 1e-1}


def run(name: str, devices: int, batch: int, swap: bool, args: argparse.Namespace, out: Path) -> dict:
    log = out / f"{name}.json"
    cmd = [
        sys.executable,
        str(ROOT / "examples" / "train_unet.py"),
        "--swap" if swap else "--no-swap",
        "--devices",
        str(devices),
        "--batch-size",
        str(batch),
        "--accelerator",
        args.accelerator,
        "--precision",
        args.precision,
        "--steps",
        str(args.steps),
        "--seed",
        str(args.seed),
        "--loss-log",
        str(log),
        *(["--tiny"] if args.tiny else []),
        *args.extra,
    ]
    print(f"$ {' '.join(cmd)}", flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
        raise SystemExit(f"{name} run failed with exit status {proc.returncode}")
    result = json.loads(log.read_text())
    print(
        f"  {name}: steps/s {result['steps_per_s']:.3f}, final loss {result['final_loss']:.5f}, "
        f"peak {result['peak_memory_mib']:.0f} MiB, swap {result['swap_summary']}",
        flush=True,
    )
    return result


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    # NVLink SHARP multicast must stay off on the lent machines.
    if env.setdefault("NCCL_NVLS_ENABLE", "0") != "0":
        print(f"warning: NCCL_NVLS_ENABLE={env['NCCL_NVLS_ENABLE']} (expected 0)")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def max_rel_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precision", default="32-true")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=32, help="global batch (even)")
    p.add_argument("--accelerator", default="gpu")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--rtol", type=float, default=None, help="per-step relative tolerance (default by precision)"
    )
    p.add_argument("--out", default=None, help="folder for the JSON logs (default: a temporary one)")
    p.add_argument("extra", nargs="*", help="more train_unet.py flags, after --")
    args = p.parse_args()
    if args.batch_size % 2:
        p.error("--batch-size must be even (it is split over 2 devices)")
    rtol = args.rtol if args.rtol is not None else DEFAULT_RTOL.get(args.precision, 5e-2)
    out = Path(args.out or tempfile.mkdtemp(prefix="ddp_check_"))
    out.mkdir(parents=True, exist_ok=True)

    single = run("single", 1, args.batch_size, True, args, out)
    ddp = run("ddp", 2, args.batch_size // 2, True, args, out)
    plain = run("ddp-plain", 2, args.batch_size // 2, False, args, out)

    print("\nstep   single      ddp         ddp-plain")
    for i, values in enumerate(zip(single["losses"], ddp["losses"], plain["losses"], strict=True)):
        print(f"{i + 1:4d}   " + "  ".join(f"{v:.6f}" for v in values))
    diff_ddp = max_rel_diff(ddp["losses"], single["losses"])
    diff_plain = max_rel_diff(plain["losses"], single["losses"])
    print(
        f"\nmax relative loss difference vs single: ddp {diff_ddp:.3e}, ddp-plain {diff_plain:.3e} "
        f"(tolerance {rtol:.1e}, precision {args.precision}, logs in {out})"
    )
    ok = diff_ddp <= rtol
    print("DDP CHECK " + ("PASSED" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
