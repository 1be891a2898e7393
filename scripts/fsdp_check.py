"""FSDP/FSDP2 check for GNSwapCallback: sharded training must follow the 1-GPU loss curve.

    python scripts/fsdp_check.py --out DIR --json DIR/fsdp_check.json    # whole matrix, 1 and 2 GPUs
    python scripts/fsdp_check.py --strategies fsdp2 --precisions bf16-mixed --devices 2
    python scripts/fsdp_check.py --accelerator cpu --tiny                  # FSDP2 logic on CPU (gloo)

The small UNet of examples/train_unet.py, built in `configure_model` as large models are, on synthetic
data whose global batch k is the same for any number of devices. One process group per device count
(1, then 2) runs every configuration in turn:
  single            1 device, no sharding, swapped, all steps in one fit: the reference;
  STRATEGY-N-PREC-{swap,plain}
                    N devices; fsdp = FSDPStrategy (FULL_SHARD, one FSDP unit per ResBlock), fsdp2 =
                    ModelParallelStrategy (fully_shard per ResBlock and on the UNet in configure_model);
                    32-true, or bf16-mixed with bf16 parameters and fp32 gradient reduction; with and
                    without GNSwapCallback. Half the steps, a sharded checkpoint, a new Trainer and model
                    resumed from it, the other half.
Checks (otol: max|a - b| / max|b| on a fixed batch; rtol: per-step relative loss difference):
  loss    every run vs `single`: rtol 2e-2 (32-true), 5e-2 (bf16-mixed), or, where sharding alone moves
          the loss further (FSDP1 keeps bf16 parameters under bf16-mixed), at most PLAIN_MARGIN x the
          unswapped run's difference under the same strategy, devices and precision; fails only swapped
          runs, the unswapped ones show what sharding alone does
  kernels swapped runs on CUDA: every GroupNorm layer ran our kernels in the first batch
  load    swapped: the final sharded checkpoint loaded by an unswapped model under the same strategy;
          plain: the final full checkpoint loaded by a swapped model; outputs vs the trained model's,
          otol 1e-4 (32-true), 5e-2 (bf16-mixed)
  revert  swapped: revert_groupnorm after training leaves only nn.GroupNorm, outputs as before (otol)
  consol  swapped: the sharded checkpoint consolidated (dcp_to_torch_save) into a plain UNet and into a
          converted one on one device in fp32: outputs vs the trained model's (otol) and ours vs
          torch's GroupNorm (1e-4)
TF32 is off so that fp32 differences are about GroupNorm. Prints a table last and writes --json.
Exits 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = ("32-true", "bf16-mixed")
STRATEGIES = ("fsdp", "fsdp2")
LOSS_RTOL = {"32-true": 2e-2, "bf16-mixed": 5e-2}
#: A swapped run may differ from `single` by up to this multiple of the unswapped sharded run's difference.
PLAIN_MARGIN = 1.25
OUT_TOL = {"32-true": 1e-4, "bf16-mixed": 5e-2}
KERNEL_TOL = 1e-4  # ours vs torch's GroupNorm, same fp32 weights, one device
CHILD_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


# ---------------------------------------------------------------------------------------------
# Configurations


def config_name(strategy: str, devices: int, precision: str, swap: bool) -> str:
    return f"{strategy}-{devices}-{precision}-{'swap' if swap else 'plain'}"


def matrix(args: argparse.Namespace) -> dict[int, list[dict[str, Any]]]:
    """Configurations per device count; the reference `single` runs first in the 1-device group."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for devices in args.devices:
        configs = []
        for precision in args.precisions:
            if devices == 1:
                configs.append(
                    {
                        "name": f"single-1-{precision}-swap",
                        "strategy": "single",
                        "devices": 1,
                        "precision": precision,
                        "swap": True,
                    }
                )
            for strategy in args.strategies:
                for swap in (True, False):
                    configs.append(
                        {
                            "name": config_name(strategy, devices, precision, swap),
                            "strategy": strategy,
                            "devices": devices,
                            "precision": precision,
                            "swap": swap,
                        }
                    )
        groups[devices] = configs
    return groups


# ---------------------------------------------------------------------------------------------
# Worker: one process group, every configuration of one device count in turn


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("train_unet", ROOT / "examples" / "train_unet.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_worker(args: argparse.Namespace) -> int:
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, Sampler, TensorDataset

    from gn_module import GNSwapCallback, convert_groupnorm, revert_groupnorm
    from gn_module.module import GroupNorm

    ex = load_example()
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    configs = json.loads(args.worker_configs)
    out = Path(args.out)
    results_path = out / f"devices{args.worker_devices}.json"
    results: list[dict[str, Any]] = []
    steps_per_epoch = args.steps // 2
    sizes = tiny_sizes() if args.tiny else full_sizes()

    class StepSampler(Sampler[int]):
        """Global step k of epoch e reads samples [(e*S + k)*B, (e*S + k + 1)*B), split over ranks as
        DistributedSampler(shuffle=False) would; Lightning calls set_epoch, also after a resume."""

        def __init__(self, rank: int, world: int) -> None:
            self.rank, self.world, self.epoch = rank, world, 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self):
            start = self.epoch * steps_per_epoch * sizes["batch"]
            return iter(range(start + self.rank, start + steps_per_epoch * sizes["batch"], self.world))

        def __len__(self) -> int:
            return steps_per_epoch * sizes["batch"] // self.world

    def eval_batch(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1234)
        x = torch.randn(4, 3, sizes["image"], sizes["image"], generator=g)
        t = torch.rand(4, generator=g)
        return x.contiguous(memory_format=torch.channels_last).to(device), t.to(device)

    class ShardedDiffusion(ex.Diffusion):
        """train_unet's Diffusion, but the UNet is built (and, for FSDP2, sharded) in configure_model."""

        def __init__(self, strategy: str, precision: str) -> None:
            pl.LightningModule.__init__(self)  # Diffusion.__init__ would build the UNet now
            self.args = argparse.Namespace(
                channels=sizes["channels"],
                blocks=sizes["blocks"],
                groups=sizes["groups"],
                lr=args.lr,
                channels_last=True,
                seed=args.seed,
                batch_size=sizes["batch"],
                image_size=sizes["image"],
            )
            self.strategy_name, self.precision_name = strategy, precision
            self.unet: torch.nn.Module | None = None
            self.eval_out: torch.Tensor | None = None

        def configure_model(self) -> None:
            if self.unet is not None:
                return
            # Same initial weights in every configuration: CPU RNG, fixed seed, whatever the context.
            with torch.device("cpu"), torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.args.seed)
                unet = ex.UNet(self.args.channels, self.args.blocks, self.args.groups)
            if self.strategy_name == "fsdp2":
                from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

                policy = MixedPrecisionPolicy()
                if self.precision_name == "bf16-mixed":
                    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                mesh = self.device_mesh["data_parallel"]
                for module in unet.modules():
                    if isinstance(module, ex.ResBlock):
                        fully_shard(module, mesh=mesh, mp_policy=policy)
                fully_shard(unet, mesh=mesh, mp_policy=policy)
            self.unet = unet

        def train_dataloader(self) -> DataLoader:
            data = ex.SyntheticImages(args.steps * sizes["batch"], sizes["image"], args.seed)
            sampler = StepSampler(self.global_rank, self.trainer.world_size)
            return DataLoader(data, batch_size=sizes["batch"] // self.trainer.world_size, sampler=sampler)

        def val_dataloader(self) -> DataLoader:
            x, t = eval_batch(torch.device("cpu"))
            return DataLoader(TensorDataset(x, t), batch_size=len(x))  # the same batch on every rank

        def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
            x, t = batch
            self.eval_out = self(x.contiguous(memory_format=torch.channels_last), t).float().cpu()

    def make_strategy(cfg: dict[str, Any], full_checkpoint: bool = False) -> Any:
        from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

        timeout = timedelta(seconds=args.pg_timeout)
        if cfg["strategy"] == "single":
            return "auto"
        if cfg["strategy"] == "fsdp":
            from torch.distributed.fsdp import MixedPrecision

            mixed = None
            if cfg["precision"] == "bf16-mixed":
                mixed = MixedPrecision(
                    param_dtype=torch.bfloat16, reduce_dtype=torch.float32, buffer_dtype=torch.bfloat16
                )
            return FSDPStrategy(
                auto_wrap_policy={ex.ResBlock},
                sharding_strategy="FULL_SHARD",
                state_dict_type="full" if full_checkpoint else "sharded",
                mixed_precision=mixed,
                timeout=timeout,
            )
        return ModelParallelStrategy(
            data_parallel_size=cfg["devices"],
            tensor_parallel_size=1,
            save_distributed_checkpoint=not full_checkpoint,
            timeout=timeout,
        )

    def make_trainer(
        cfg: dict[str, Any],
        callbacks: list[pl.Callback],
        epochs: int,
        *,
        validate: bool = False,
        full_checkpoint: bool = False,
    ) -> pl.Trainer:
        return pl.Trainer(
            accelerator=args.accelerator,
            devices=cfg["devices"],
            strategy=make_strategy(cfg, full_checkpoint),
            precision=cfg["precision"],
            max_epochs=epochs,
            callbacks=callbacks,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            use_distributed_sampler=False,
            num_sanity_val_steps=0,
            limit_val_batches=1 if validate else 0,
            inference_mode=False,
            default_root_dir=out,
        )

    def fixed_batch_outputs(trainer: pl.Trainer, pl_module: pl.LightningModule) -> torch.Tensor:
        """The model's outputs on the fixed batch, through the strategy's wrapper (FSDP1's root unit),
        in the precision's forward context, as validation would compute them."""
        x, t = eval_batch(trainer.strategy.root_device)  # FSDP1 moves parameters, not pl_module.device
        pl_module.eval()
        with torch.no_grad(), trainer.precision_plugin.forward_context():
            y = trainer.strategy.model(x, t)
        pl_module.train()
        return y.float().cpu()

    class EndOfFit(pl.Callback):
        """At the end of fit, while the strategy is still set up: save a checkpoint; on the last segment
        also record the outputs on the fixed batch, then revert_groupnorm and record them again."""

        def __init__(self, path: Path, evaluate: bool, revert: bool) -> None:
            self.path, self.evaluate, self.revert = path, evaluate, revert
            self.out: torch.Tensor | None = None
            self.revert_result: dict[str, Any] | None = None
            self.revert_error: str | None = None

        def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            trainer.save_checkpoint(self.path)  # written by the swapped model, on swapped runs
            if not self.evaluate:
                return
            self.out = fixed_batch_outputs(trainer, pl_module)
            if self.revert:
                try:
                    _, report = revert_groupnorm(pl_module)
                    left = [n for n, m in pl_module.named_modules() if isinstance(m, GroupNorm)]
                    after = fixed_batch_outputs(trainer, pl_module)
                    self.revert_result = {
                        "reverted": len(report.swapped),
                        "left": len(left),
                        "err": rel(after, self.out),
                    }
                except Exception:
                    self.revert_error = traceback.format_exc(limit=-3)

    def rel(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
        if a is None or b is None:
            return float("nan")
        return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12)).item()

    def probe_summary(callback: GNSwapCallback | None) -> dict[str, Any] | None:
        if callback is None:
            return None
        reasons: dict[str, int] = {}
        for call in callback.first_calls.values():
            if call.reason is not None:
                reasons[call.reason] = reasons.get(call.reason, 0) + 1
        calls = callback.first_calls
        fast = sum(call.reason is None for call in calls.values())
        dtypes = sorted({f"x {c.input_dtype} w {c.weight_dtype}" for c in calls.values()})
        slow = [name for name, call in calls.items() if call.reason is not None][:10]
        return {
            "layers": len(calls),
            "fast": fast,
            "fallback": reasons,
            "fallback_layers": slow,
            "dtypes": dtypes,
        }

    def consolidated_outputs(folder: Path, reference: torch.Tensor | None) -> dict[str, Any]:
        """Rank 0: the sharded checkpoint as one state dict, into a plain and a converted UNet."""
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        single_file = folder.with_suffix(".consolidated.pt")
        dcp_to_torch_save(folder, single_file)
        state = torch.load(single_file, map_location="cpu", weights_only=False)
        state = state.get("model", state.get("state_dict", state))  # FSDP1 vs ModelParallel key
        prefix = "unet."
        unet_state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        device = torch.device("cuda", 0) if args.accelerator != "cpu" else torch.device("cpu")
        plain = ex.UNet(sizes["channels"], sizes["blocks"], sizes["groups"])
        plain.load_state_dict(unet_state, strict=True)
        plain = plain.to(device).eval()
        converted = ex.UNet(sizes["channels"], sizes["blocks"], sizes["groups"])
        converted.load_state_dict(unet_state, strict=True)
        converted, report = convert_groupnorm(converted.to(device).to(memory_format=torch.channels_last))
        converted.eval()
        x, t = eval_batch(device)
        with torch.no_grad():
            y_plain, y_ours = plain(x, t).float().cpu(), converted(x, t).float().cpu()
        single_file.unlink()
        return {
            "plain_vs_trained": rel(y_plain, reference),
            "ours_vs_plain": rel(y_ours, y_plain),
            "converted_layers": len(report.swapped),
        }

    def run_config(cfg: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = {**cfg, "errors": {}}
        folder = Path(args.ckpt_dir) / cfg["name"]
        folder.mkdir(parents=True, exist_ok=True)
        pl.seed_everything(args.seed, verbose=False)
        if cfg["strategy"] == "single":
            meter, swap_cb = ex.Meter(0), GNSwapCallback()
            trainer = make_trainer(cfg, [meter, swap_cb], epochs=2)
            trainer.fit(ShardedDiffusion(cfg["strategy"], cfg["precision"]))
            result["losses"] = [float(v) for v in meter.losses]
            result["kernels"] = probe_summary(swap_cb)
            result["swap_summary"] = swap_cb.report.summary() if swap_cb.report else None
            return result

        # Segment 1: half the steps, then a sharded checkpoint.
        mid, end = folder / "mid.ckpt", folder / "end.ckpt"
        meter1, swap1 = ex.Meter(0), GNSwapCallback() if cfg["swap"] else None
        callbacks = [meter1, EndOfFit(mid, evaluate=False, revert=False)] + ([swap1] if swap1 else [])
        make_trainer(cfg, callbacks, epochs=1).fit(ShardedDiffusion(cfg["strategy"], cfg["precision"]))
        result["kernels"] = probe_summary(swap1)
        result["swap_summary"] = swap1.report.summary() if swap1 and swap1.report else None

        # Segment 2: a new model and Trainer resume from it. Swapped runs end with a sharded
        # checkpoint (loaded by a plain model below), plain runs with a full one (loaded by a swapped one).
        meter2, swap2 = ex.Meter(0), GNSwapCallback() if cfg["swap"] else None
        end_of_fit = EndOfFit(end, evaluate=True, revert=cfg["swap"])
        callbacks = [meter2, end_of_fit] + ([swap2] if swap2 else [])
        trainer = make_trainer(cfg, callbacks, epochs=2, full_checkpoint=not cfg["swap"])
        trainer.fit(ShardedDiffusion(cfg["strategy"], cfg["precision"]), ckpt_path=mid)
        result["losses"] = [float(v) for v in meter1.losses + meter2.losses]
        result["resumed_at"] = len(meter1.losses) if len(meter2.losses) == args.steps // 2 else -1
        trained_out = end_of_fit.out
        if end_of_fit.revert_result is not None:
            result["revert"] = end_of_fit.revert_result
        if end_of_fit.revert_error is not None:
            result["errors"]["revert"] = end_of_fit.revert_error
        try:
            other = ShardedDiffusion(cfg["strategy"], cfg["precision"])
            loader = make_trainer(cfg, [] if cfg["swap"] else [GNSwapCallback()], epochs=2, validate=True)
            loader.validate(other, ckpt_path=end, verbose=False)
            result["load"] = {
                "format": "sharded" if cfg["swap"] else "full",
                "into": "plain" if cfg["swap"] else "swapped",
                "err": rel(other.eval_out, trained_out),
            }
        except Exception:
            result["errors"]["load"] = traceback.format_exc(limit=-3)
        if cfg["swap"] and trainer.is_global_zero:
            try:
                result["consol"] = consolidated_outputs(end, trained_out)
            except Exception:
                result["errors"]["consol"] = traceback.format_exc(limit=-3)
        return result

    rank = int(os.environ.get("LOCAL_RANK", "0"))
    for cfg in configs:
        started = time.perf_counter()
        try:
            result = run_config(cfg)
        except Exception:
            result = {**cfg, "errors": {"run": traceback.format_exc(limit=-4)}}
            traceback.print_exc()
        result["seconds"] = round(time.perf_counter() - started, 1)
        result["platform"] = f"torch {torch.__version__}, lightning {pl.__version__}, " + (
            torch.cuda.get_device_name() if args.accelerator != "cpu" else "cpu"
        )
        print(f"[fsdp_check rank {rank}] {cfg['name']} done in {result['seconds']} s", flush=True)
        if rank == 0 and int(os.environ.get("NODE_RANK", "0")) == 0:
            results.append(result)
            results_path.write_text(json.dumps(results, indent=1))
    return 0


def full_sizes() -> dict[str, Any]:
    return {"channels": (64, 128), "blocks": 1, "groups": 32, "image": 32, "batch": 16}


def tiny_sizes() -> dict[str, Any]:
    return {"channels": (16, 32), "blocks": 1, "groups": 8, "image": 16, "batch": 4}


# ---------------------------------------------------------------------------------------------
# Parent: launch the groups, compare, print


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(CHILD_ENV)  # NVLink SHARP multicast must stay off on the lent machines
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def launch_group(
    devices: int, configs: list[dict[str, Any]], args: argparse.Namespace, out: Path
) -> str | None:
    """Run one worker (Lightning starts its other ranks); returns an error text or None."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker-devices",
        str(devices),
        "--worker-configs",
        json.dumps(configs),
        "--out",
        str(out),
        "--accelerator",
        args.accelerator,
        "--steps",
        str(args.steps),
        "--seed",
        str(args.seed),
        "--lr",
        str(args.lr),
        "--pg-timeout",
        str(args.pg_timeout),
        "--ckpt-dir",
        str(args.ckpt_dir),
        *(["--tiny"] if args.tiny else []),
    ]
    log = out / f"devices{devices}.log"
    print(f"[fsdp_check] {devices} device(s): {len(configs)} runs, log {log}", flush=True)
    started = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=child_env(), stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=args.group_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker and the ranks Lightning started
            proc.wait()
            return f"timed out after {args.group_timeout} s (see {log})"
    print(
        f"[fsdp_check] {devices} device(s): exit {code} after {time.perf_counter() - started:.0f} s",
        flush=True,
    )
    return None if code == 0 else f"exit status {code} (see {log})"


def max_rel_diff(a: list[float], b: list[float]) -> float:
    if len(a) != len(b) or not a:
        return float("nan")
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


def judge_all(results: list[dict[str, Any]], accelerator: str) -> None:
    """Judge every run: unswapped ones first, whose loss differences bound their swapped twins'."""
    reference = {r["precision"]: r for r in results if r["strategy"] == "single"}
    plain = {r["name"]: r for r in results if not r["swap"]}
    for r in sorted(results, key=lambda r: r["swap"]):
        twin = plain.get(plain_twin(r["name"])) if r["swap"] else None
        judge(r, reference.get(r["precision"]), accelerator, twin.get("loss_diff") if twin else None)


def plain_twin(name: str) -> str:
    """The unswapped run under the same strategy, devices and precision."""
    return name.removesuffix("-swap") + "-plain"


def judge(
    result: dict[str, Any],
    reference: dict[str, Any] | None,
    accelerator: str,
    plain_diff: float | None = None,
) -> dict[str, Any]:
    """Fill result["checks"]: name -> (value text, ok or None when informational)."""
    precision, swap = result["precision"], result["swap"]
    checks: dict[str, tuple[str, bool | None]] = {}
    if result["errors"].get("run"):
        checks["run"] = ("error", False)
    losses = result.get("losses")
    if result["strategy"] == "single":
        checks["loss"] = ("(ref)", None)
    elif losses and reference and reference.get("losses"):
        diff = max_rel_diff(losses, reference["losses"])
        bound = max(LOSS_RTOL[precision], PLAIN_MARGIN * plain_diff if plain_diff is not None else 0.0)
        checks["loss"] = (f"{diff:.2e}", (diff <= bound) if swap else None)
        result["loss_diff"] = diff
    else:
        checks["loss"] = ("n/a", False if swap else None)
    kernels = result.get("kernels")
    if swap and kernels:
        ok = kernels["fast"] == kernels["layers"] > 0 if accelerator != "cpu" else None
        checks["kernels"] = (f"{kernels['fast']}/{kernels['layers']}", ok)
    elif swap:
        checks["kernels"] = ("n/a", False)
    if "resumed_at" in result:
        ok = result["resumed_at"] == len(result["losses"]) // 2
        checks["resume"] = (f"@{result['resumed_at']}", ok)
    for name in ("load", "revert"):
        if name in result:
            err = result[name]["err"]
            ok = err <= OUT_TOL[precision]
            if name == "revert":
                ok = ok and result[name]["left"] == 0 and result[name]["reverted"] > 0
            checks[name] = (f"{err:.1e}", ok)
        elif result["errors"].get(name):
            checks[name] = ("error", False)
    if "consol" in result:
        c = result["consol"]
        ok = c["plain_vs_trained"] <= OUT_TOL[precision] and c["ours_vs_plain"] <= KERNEL_TOL
        checks["consol"] = (f"{c['plain_vs_trained']:.1e}/{c['ours_vs_plain']:.0e}", ok)
    elif result["errors"].get("consol"):
        checks["consol"] = ("error", False)
    result["checks"] = {k: {"value": v, "ok": ok} for k, (v, ok) in checks.items()}
    result["passed"] = all(ok is not False for _, ok in checks.values())
    return result


def print_table(results: list[dict[str, Any]]) -> None:
    columns = ("loss", "kernels", "resume", "load", "revert", "consol")
    header = f"{'run':<26}" + "".join(f"{c:>{w}}" for c, w in zip(columns, (10, 8, 7, 9, 9, 15), strict=True))
    print(header + "   result")
    for r in results:
        cells = []
        for c, w in zip(columns, (10, 8, 7, 9, 9, 15), strict=True):
            check = r.get("checks", {}).get(c)
            text = "-" if check is None else check["value"] + ("!" if check["ok"] is False else "")
            cells.append(f"{text:>{w}}")
        verdict = "PASS" if r.get("passed") else "FAIL"
        if r["strategy"] == "single":
            verdict = "ref" if r.get("passed") else "FAIL"
        elif not r["swap"] and r.get("passed"):
            verdict = "ok (scale)"
        print(f"{r['name']:<26}" + "".join(cells) + f"   {verdict}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", default="1,2", help="device counts to run, comma-separated. Default: 1,2")
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="fsdp, fsdp2. Default: fsdp,fsdp2")
    p.add_argument("--precisions", default=",".join(PRECISIONS), help="Default: 32-true,bf16-mixed")
    p.add_argument(
        "--steps", type=int, default=20, help="optimizer steps (even: half, checkpoint, half). Default: 20"
    )
    p.add_argument(
        "--accelerator", default="gpu", help="gpu, or cpu for a logic check (FSDP2 only). Default: gpu"
    )
    p.add_argument("--tiny", action="store_true", help="smaller UNet and batch (CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--out", default=None, help="folder for logs, checkpoints, results. Default: a temporary one"
    )
    p.add_argument("--json", default=None, help="write all results and checks to this JSON file")
    p.add_argument("--group-timeout", type=int, default=270, help="seconds per device count. Default: 270")
    p.add_argument("--pg-timeout", type=int, default=90, help="collective timeout in seconds. Default: 90")
    p.add_argument(
        "--rejudge",
        metavar="JSON",
        default=None,
        help="judge the runs of a saved --json again and print the table",
    )
    p.add_argument("--worker-devices", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-configs", default=None, help=argparse.SUPPRESS)
    p.add_argument("--ckpt-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker_devices is not None:
        return run_worker(args)
    if args.rejudge:
        results = json.loads(Path(args.rejudge).read_text())["results"]
        for r in results:
            r.pop("checks", None)
            r.pop("passed", None)
        judge_all(results, "gpu")
        print_table(results)
        ok = all(r["passed"] for r in results)
        print("FSDP CHECK " + ("PASSED" if ok else "FAILED") + f" (rejudged {args.rejudge})")
        return 0 if ok else 1

    args.devices = [int(d) for d in args.devices.split(",")]
    args.strategies = [s for s in args.strategies.split(",") if s]
    args.precisions = [s for s in args.precisions.split(",") if s]
    bad = [s for s in args.strategies if s not in STRATEGIES] + [
        s for s in args.precisions if s not in PRECISIONS
    ]
    if bad or any(d not in (1, 2) for d in args.devices) or args.steps < 2 or args.steps % 2:
        p.error(
            f"strategies in {STRATEGIES}, precisions in {PRECISIONS}, devices 1 and/or 2, even --steps >= 2"
        )
    began = time.perf_counter()
    out = Path(args.out or tempfile.mkdtemp(prefix="fsdp_check_")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    groups = matrix(args)
    skipped: dict[str, str] = {}
    if args.accelerator == "cpu" and "fsdp" in args.strategies:
        skipped["fsdp"] = (
            "FSDPStrategy needs CUDA (Lightning refuses accelerator='cpu'; FSDP1 needs an accelerator)"
        )
        groups = {d: [c for c in cs if c["strategy"] != "fsdp"] for d, cs in groups.items()}
    if 1 not in groups:  # the reference always runs
        groups = {
            1: [
                c
                for c in matrix(argparse.Namespace(**{**vars(args), "devices": [1]}))[1]
                if c["strategy"] == "single"
            ],
            **groups,
        }
    if args.accelerator != "cpu":
        import torch

        available = torch.cuda.device_count()
        for d in [d for d in groups if d > available]:
            skipped[f"{d} devices"] = f"only {available} CUDA device(s)"
            del groups[d]

    group_errors = {}
    # Checkpoints (about 20 MB each) stay out of --out, which may be copied back from a remote machine.
    args.ckpt_dir = tempfile.mkdtemp(prefix="fsdp_check_ckpt_")
    try:
        for devices, configs in sorted(groups.items()):
            if configs:
                error = launch_group(devices, configs, args, out)
                if error:
                    group_errors[devices] = error
    finally:
        shutil.rmtree(args.ckpt_dir, ignore_errors=True)
    results: list[dict[str, Any]] = []
    for devices, configs in sorted(groups.items()):
        path = out / f"devices{devices}.json"
        done = {r["name"]: r for r in json.loads(path.read_text())} if path.exists() else {}
        for cfg in configs:
            results.append(
                done.get(cfg["name"], {**cfg, "errors": {"run": group_errors.get(devices, "not run")}})
            )
    judge_all(results, args.accelerator)

    ok = all(r["passed"] for r in results)
    summary = {
        "passed": ok,
        "tolerances": {"loss_rtol": LOSS_RTOL, "output_tol": OUT_TOL, "kernel_tol": KERNEL_TOL},
        "skipped": skipped,
        "group_errors": group_errors,
        "args": {k: v for k, v in vars(args).items() if not k.startswith("worker")},
        "results": results,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1, default=str))
    for r in results:
        for name, text in r["errors"].items():
            print(f"--- {r['name']} {name}:\n{str(text)[-1500:]}")
    for devices, error in group_errors.items():
        print(f"--- {devices} device(s): {error}")
        log = out / f"devices{devices}.log"
        if log.exists():
            print("".join(log.read_text(errors="replace").splitlines(keepends=True)[-25:]))
    platform = next((r["platform"] for r in results if "platform" in r), "no run finished")
    print(
        f"\nGNSwapCallback under FSDP/FSDP2, {args.steps} steps, {platform}, "
        f"{time.perf_counter() - began:.0f} s, out {out}\n"
        f"loss: max relative per-step difference vs single (rtol {LOSS_RTOL}); kernels: layers on our "
        f"kernels in the first batch; resume: step the sharded checkpoint resumed at; load/revert: "
        f"max|a-b|/max|b| vs the trained model (tol {OUT_TOL}); consol: consolidated plain UNet vs trained, "
        f"ours vs torch (tol {KERNEL_TOL:.0e}); '!' marks a failed check"
    )
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    print_table(results)
    print("FSDP CHECK " + ("PASSED" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
