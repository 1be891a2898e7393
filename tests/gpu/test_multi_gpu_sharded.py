"""GNSwapCallback under FSDP and FSDP2 on two GPUs (skipped with fewer).

    pytest tests/gpu/test_multi_gpu_sharded.py -v

The ranks are two processes of this file run as a script (NCCL_NVLS_ENABLE=0 and
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are set for them, as the lent machines need). What only a GPU shows:
FSDP1 with layers already wrapped in ``configure_model`` (FSDP1 cannot run on the CPU), our kernels
actually running under sharding, the CUDA fallback warning for a mixed-precision pair our kernels do
not take, and scripts/fsdp_check.py on a reduced matrix.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
CHILD_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"
)


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "RANK")}
    env.update(CHILD_ENV)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def two_gpu_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("sharded_gpu")
    env = child_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2", NODE_RANK="0")
    cmd = [sys.executable, str(Path(__file__).resolve()), str(out)]
    logs = [(out / f"rank{rank}.log").open("w") for rank in (0, 1)]
    procs = [
        subprocess.Popen(cmd, env={**env, "LOCAL_RANK": str(rank)}, stdout=log, stderr=subprocess.STDOUT)
        for rank, log in enumerate(logs)
    ]
    try:
        codes = [proc.wait(timeout=480) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for log in logs:
            log.close()
    tails = "\n".join((out / f"rank{rank}.log").read_text()[-4000:] for rank in (0, 1))
    assert codes == [0, 0], tails
    return json.loads((out / "sharded_gpu.json").read_text())


def test_fsdp1_with_blocks_wrapped_in_configure_model(two_gpu_run):
    r = two_gpu_run["fsdp1_manual_wrap"]
    assert r["wrapped_before_swap"]  # the swap met FSDP units, as with `wrap()` in configure_model
    assert r["report"]["swapped"] == 3 and r["report"]["fused"] == 2
    assert r["same_objects"] and r["types"] == ["GroupNorm"] * 3
    assert r["reasons"] == [None] * 3, r["reasons"]  # our kernels ran in every layer
    assert r["losses_finite"] and r["params_changed"]
    assert r["revert_types"] == ["torch.nn.modules.normalization"] * 3 and r["revert_err"] <= 1e-4


def test_fsdp2_unsupported_dtype_pair_warns_on_cuda(two_gpu_run):
    r = two_gpu_run["fsdp2_fp16_params"]
    # which input dtype a layer sees depends on its place (the first sees the fp32 batch, later ones bf16
    # activations); every layer with fp16 weights must be named with the reason
    assert "weight dtype torch.float16 is neither float32 nor the input's torch." in r["warnings"]
    assert r["losses_finite"]
    ok = two_gpu_run["fsdp2_bf16_params"]
    assert ok["reasons"] == [None] * 3, ok["reasons"]
    assert not ok["warnings"]


def test_fsdp_check_script_two_gpus(tmp_path):
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "fsdp_check.py"),
        "--devices",
        "2",
        "--steps",
        "8",
        "--out",
        str(tmp_path),
        "--json",
        str(tmp_path / "fsdp_check.json"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=child_env())
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "fsdp_check.json").read_text())
    assert summary["passed"] and len(summary["results"]) == 2 + 8  # 2 references, 2x2x2 sharded runs


# ---------------------------------------------------------------------------------------------
# The two ranks


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.GroupNorm(8, c), nn.SiLU(), nn.Conv2d(c, c, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.layers(x)


def _ranks(out: Path) -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy
    from torch.utils.data import DataLoader, TensorDataset

    from gn_module import GNSwapCallback, revert_groupnorm
    from gn_module.callback import is_sharded

    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    records: dict[str, Any] = {}

    class Net(pl.LightningModule):
        def __init__(self, mode: str, param_dtype: torch.dtype | None = None) -> None:
            super().__init__()
            self.mode, self.param_dtype = mode, param_dtype
            self.net: nn.Sequential | None = None
            self.built: dict[str, int] = {}

        def configure_model(self) -> None:
            if self.net is not None:
                return
            torch.manual_seed(0)
            blocks = [Block(32), Block(32)]
            net = nn.Sequential(
                nn.Conv2d(3, 32, 3, padding=1), *blocks, nn.GroupNorm(8, 32), nn.Conv2d(32, 3, 1)
            )
            if self.mode == "fsdp1":
                from torch.distributed.fsdp.wrap import wrap

                # Inside Lightning's enable_wrap context: every block, then the rest, are FSDP units now.
                for i in (1, 2):
                    net[i] = wrap(net[i])
                net = wrap(net)
            self.net = net
            if self.mode == "fsdp2":
                from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

                policy = MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=torch.float32)
                mesh = self.device_mesh["data_parallel"]
                for block in self.net[1:3]:
                    fully_shard(block, mesh=mesh, mp_policy=policy)
                fully_shard(self.net, mesh=mesh, mp_policy=policy)
            self.built = {n: id(m) for n, m in self.named_modules() if isinstance(m, nn.GroupNorm)}
            self.sharded_in_configure_model = is_sharded(self)  # configure_model runs before the swap

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            x = batch[0].contiguous(memory_format=torch.channels_last)
            return (self(x).float() - x.float()).square().mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.Adam(self.parameters(), lr=1e-3)

        def train_dataloader(self) -> DataLoader:
            data = torch.randn(16, 3, 16, 16, generator=torch.Generator().manual_seed(1))
            return DataLoader(TensorDataset(data), batch_size=4)

    class Observe(pl.Callback):
        def __init__(self) -> None:
            self.losses: list[float] = []
            self.initial: dict[str, torch.Tensor] = {}
            self.out: torch.Tensor | None = None
            self.after_revert: torch.Tensor | None = None
            self.types: list[str] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.losses.append(float(outputs["loss"]))

        def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            if pl_module.mode != "fsdp1":  # FSDP1 parameters are local shards; DTensors are not compared
                return
            with torch.no_grad():
                self.initial = {n: p.detach().float().sum().cpu() for n, p in pl_module.named_parameters()}

        def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
            x = x.to(trainer.strategy.root_device).contiguous(memory_format=torch.channels_last)
            self.types = [type(m).__name__ for m in pl_module.modules() if isinstance(m, nn.GroupNorm)]
            with torch.no_grad():
                self.out = trainer.strategy.model(x).float().cpu()
                if pl_module.mode == "fsdp1":
                    revert_groupnorm(pl_module)
                    self.after_revert = trainer.strategy.model(x).float().cpu()

    def trainer(strategy: Any, callbacks: list[Any], precision: str) -> pl.Trainer:
        return pl.Trainer(
            accelerator="gpu",
            devices=2,
            strategy=strategy,
            precision=precision,
            callbacks=callbacks,
            max_steps=3,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
        )

    def finite(values: list[float]) -> bool:
        return bool(values) and bool(torch.isfinite(torch.tensor(values)).all())

    # FSDP1, wrapped by configure_model itself: the swap meets FSDP units and must keep the objects.
    model, swap, observe = Net("fsdp1"), GNSwapCallback(), Observe()
    trainer(FSDPStrategy(), [swap, observe], "32-true").fit(model)
    params_now = {n: p.detach().float().sum().cpu() for n, p in model.named_parameters()}
    norms = {n: m for n, m in model.named_modules() if isinstance(m, nn.GroupNorm)}
    records["fsdp1_manual_wrap"] = {
        "wrapped_before_swap": model.sharded_in_configure_model,
        "report": swap.report.summary(),
        "same_objects": {n: id(m) for n, m in norms.items()} == model.built,
        "types": observe.types,
        "reasons": [c.reason for c in swap.first_calls.values()],
        "losses_finite": finite(observe.losses),
        "params_changed": any(not torch.equal(params_now[n], v) for n, v in observe.initial.items()),
        "revert_types": [type(m).__module__ for m in norms.values()],
        "revert_err": ((observe.after_revert - observe.out).abs().max() / observe.out.abs().max()).item(),
    }

    # FSDP2 mixed precision: bf16 parameters are a pair our kernels take, fp16 ones under bf16 autocast
    # are not, and that must be a warning naming the reason.
    for name, dtype in (("fsdp2_bf16_params", torch.bfloat16), ("fsdp2_fp16_params", torch.float16)):
        model, swap, observe = Net("fsdp2", dtype), GNSwapCallback(), Observe()
        strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer(strategy, [swap, observe], "bf16-mixed").fit(model)
        records[name] = {
            "reasons": [c.reason for c in swap.first_calls.values()],
            "warnings": "\n".join(str(w.message) for w in caught if "GNSwapCallback" in str(w.message)),
            "losses_finite": finite(observe.losses),
        }
    if int(os.environ["LOCAL_RANK"]) == 0:
        (out / "sharded_gpu.json").write_text(json.dumps(records))


if __name__ == "__main__":
    _ranks(Path(sys.argv[1]))
