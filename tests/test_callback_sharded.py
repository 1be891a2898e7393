"""GNSwapCallback under sharding strategies, on the CPU.

FSDP2 (`ModelParallelStrategy`, ``fully_shard`` in ``configure_model``) runs for real here: two
processes on gloo, started by running this file as a script (Lightning starts the second rank by
running it again). FSDP1 needs an accelerator, so `FSDPStrategy` runs without its process group
and wrapping, recording what the wrapping step receives. DeepSpeed is not installed: its refusal is
tested on the real strategy class.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import (
    DDPStrategy,
    DeepSpeedStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
    SingleDeviceStrategy,
    Strategy,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import gn_module
from gn_module.callback import (
    DEEPSPEED_REFUSAL,
    GNSwapCallback,
    LayerCall,
    is_sharded,
    strategy_kind,
    summarize_first_calls,
)
from gn_module.convert import SiLUSlot, convert_groupnorm, revert_groupnorm

warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*GPU available but not used.*")

ROOT = Path(__file__).resolve().parents[1]


class Block(nn.Module):
    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.GroupNorm(4, c), nn.SiLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.layers(x)


class LossLog(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))

    def finite(self) -> bool:
        return bool(self.losses) and bool(torch.isfinite(torch.tensor(self.losses)).all())


class BuiltInConfigureModel(LightningModule):
    """Nothing exists until configure_model, which (for FSDP2) also applies fully_shard, as large
    models do; records what each lifecycle step saw."""

    def __init__(self, fsdp2: bool = False, param_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.fsdp2, self.param_dtype = fsdp2, param_dtype
        self.net: nn.Sequential | None = None
        self.built: dict[str, int] = {}
        self.seen_by_optimizer: list[str] = []
        self.out: torch.Tensor | None = None

    def configure_model(self) -> None:
        if self.net is not None:
            return
        torch.manual_seed(0)
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), Block(), Block(), nn.GroupNorm(2, 8), nn.Conv2d(8, 3, 1)
        )
        if self.fsdp2:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            policy = MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=torch.float32)
            mesh = self.device_mesh["data_parallel"]
            for block in self.net[1:3]:
                fully_shard(block, mesh=mesh, mp_policy=policy)
            fully_shard(self.net, mesh=mesh, mp_policy=policy)
        self.built = {n: id(m) for n, m in self.named_modules() if isinstance(m, nn.GroupNorm)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return (self(batch[0]).float() - batch[0]).square().mean()

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.out = self(batch[0]).float().detach().cpu()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        self.seen_by_optimizer = [type(m).__name__ for m in self.modules() if isinstance(m, nn.GroupNorm)]
        return torch.optim.Adam(self.parameters(), lr=1e-2)

    def train_dataloader(self) -> DataLoader:
        data = torch.randn(8, 3, 6, 6, generator=torch.Generator().manual_seed(1))
        return DataLoader(TensorDataset(data), batch_size=2)

    val_dataloader = train_dataloader


# ---------------------------------------------------------------------------------------------
# Strategy detection and DeepSpeed


def test_strategy_kinds_of_real_lightning_strategies():
    class MyFSDP(FSDPStrategy):
        pass

    deepspeed = DeepSpeedStrategy.__new__(DeepSpeedStrategy)  # its __init__ needs deepspeed installed
    kinds = {
        "single": strategy_kind(SingleDeviceStrategy(device=torch.device("cpu"))),
        "ddp": strategy_kind(DDPStrategy()),
        "fsdp": strategy_kind(FSDPStrategy()),
        "fsdp subclass": strategy_kind(MyFSDP()),
        "model parallel": strategy_kind(ModelParallelStrategy()),
        "deepspeed": strategy_kind(deepspeed),
    }
    assert kinds == {
        "single": "replicated",
        "ddp": "replicated",
        "fsdp": "fsdp",
        "fsdp subclass": "fsdp",
        "model parallel": "fsdp2",
        "deepspeed": "deepspeed",
    }


def test_deepspeed_is_refused_with_the_way_out():
    strategy = DeepSpeedStrategy.__new__(DeepSpeedStrategy)
    fake_trainer = SimpleNamespace(strategy=strategy)
    with pytest.raises(RuntimeError) as info:
        GNSwapCallback().setup(fake_trainer, BuiltInConfigureModel(), "fit")  # type: ignore[arg-type]
    message = str(info.value)
    assert message == DEEPSPEED_REFUSAL
    for words in ("DeepSpeed is not installed", "FSDPStrategy", "ModelParallelStrategy", "configure_model"):
        assert words in message
    assert "setup" not in vars(strategy)  # refused before anything was patched


def test_fsdp_and_fsdp2_are_not_refused():
    for strategy in (FSDPStrategy(), ModelParallelStrategy()):
        callback = GNSwapCallback()
        callback.setup(SimpleNamespace(strategy=strategy), BuiltInConfigureModel(), "fit")  # type: ignore[arg-type]
        assert "setup" in vars(strategy)  # the swap is scheduled
        callback.teardown(SimpleNamespace(strategy=strategy), BuiltInConfigureModel(), "fit")  # type: ignore[arg-type]
        assert "setup" not in vars(strategy)


def test_is_sharded_is_false_for_a_plain_model():
    assert not is_sharded(nn.Sequential(nn.Conv2d(3, 8, 1), nn.GroupNorm(4, 8)))


# ---------------------------------------------------------------------------------------------
# In-place conversion (what the callback uses under FSDP)


def test_in_place_conversion_keeps_module_objects_and_reverts():
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block(), nn.GroupNorm(2, 8))
    x = torch.randn(2, 8, 5, 5)
    expected = model(x)
    norms = {n: m for n, m in model.named_modules() if type(m) is nn.GroupNorm}
    params = {n: p for n, p in model.named_parameters()}
    keys = list(model.state_dict())

    _, report = convert_groupnorm(model, in_place=True)
    assert sorted(report.swapped) == sorted(norms) and sorted(report.fused) == ["0.layers.1", "1.layers.1"]
    for name, module in model.named_modules():
        if name in norms:
            assert module is norms[name] and type(module) is gn_module.GroupNorm
    assert model[2].act is None and model[0].layers[1].act == "silu"
    assert isinstance(model[0].layers[2], SiLUSlot)
    assert all(p is params[n] for n, p in model.named_parameters())
    assert list(model.state_dict()) == keys
    torch.testing.assert_close(model(x), expected)

    _, back = revert_groupnorm(model)
    assert sorted(back.swapped) == sorted(norms)
    for name, module in model.named_modules():
        if name in norms:
            assert module is norms[name] and type(module) is nn.GroupNorm and not hasattr(module, "act")
    assert type(model[0].layers[2]) is nn.SiLU
    torch.testing.assert_close(model(x), expected)


def test_in_place_conversion_skips_classes_it_cannot_retype():
    class PlainSubclass(nn.GroupNorm):
        pass

    model = nn.Sequential(PlainSubclass(2, 8), nn.GroupNorm(2, 8))
    _, report = convert_groupnorm(model, in_place=True)
    assert report.swapped == ["1"]
    assert "in_place=True converts only plain nn.GroupNorm" in report.skipped["0"]
    assert type(model[0]) is PlainSubclass
    _, replaced = convert_groupnorm(nn.Sequential(PlainSubclass(2, 8)))  # the default replaces it
    assert replaced.swapped == ["0"]


def test_state_dict_hooks_do_not_block_fusion_but_forward_hooks_do():
    # FSDP2 puts a load_state_dict post-hook on every module that owns a parameter.
    with_load_hook = Block()
    with_load_hook.layers[1].register_load_state_dict_post_hook(lambda module, keys: None)
    _, report = convert_groupnorm(with_load_hook)
    assert report.fused == ["layers.1"]

    with_forward_hook = Block()
    with_forward_hook.layers[1].register_forward_hook(lambda module, args, out: None)
    _, report = convert_groupnorm(with_forward_hook)
    assert report.fused == [] and "hooks" in report.skipped["layers.1+layers.2"]


# ---------------------------------------------------------------------------------------------
# FSDP1: order of the swap, configure_model and wrapping


class RecordingFSDP(FSDPStrategy):
    """FSDPStrategy minus what needs CUDA: no process group, no launcher, and `_setup_model` (where
    FSDP wraps the model) records what it receives instead of wrapping."""

    def setup_environment(self) -> None:
        Strategy.setup_environment(self)

    def _configure_launcher(self) -> None:
        self._launcher = None

    def _setup_model(self, model: nn.Module) -> nn.Module:
        self.received = {n: (type(m), id(m)) for n, m in model.named_modules() if isinstance(m, nn.GroupNorm)}
        self.conv_weight_channels_last = model.net[0].weight.is_contiguous(memory_format=torch.channels_last)
        return model


def cpu_trainer(tmp_path: Path, strategy: Any, callbacks: list[Any], **kwargs: Any) -> Trainer:
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "strategy": strategy,
        "callbacks": callbacks,
        "max_steps": 2,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "limit_val_batches": 0,
        "default_root_dir": tmp_path,
        **kwargs,
    }
    return Trainer(**options)


def test_fsdp_swaps_in_place_after_configure_model_and_before_wrapping(tmp_path, caplog):
    strategy, model = RecordingFSDP(auto_wrap_policy={Block}), BuiltInConfigureModel()
    with caplog.at_level(logging.INFO):
        cpu_trainer(tmp_path, strategy, [GNSwapCallback()]).fit(model)
    # What FSDP would wrap: the layers built in configure_model, the same objects, already ours.
    assert {n: i for n, (_, i) in strategy.received.items()} == model.built
    assert {t for t, _ in strategy.received.values()} == {gn_module.GroupNorm}
    assert model.seen_by_optimizer == ["GroupNorm"] * 3 and isinstance(model.net[3], gn_module.GroupNorm)
    assert isinstance(model.net[1].layers[2], SiLUSlot)
    # Parameters keep their layout (FSDP flattens them; on the CPU nothing is restrided anyway).
    assert not strategy.conv_weight_channels_last
    assert "the trainer's device is cpu" in caplog.text


def test_fsdp_with_a_cuda_target_says_to_use_channels_last_inputs(caplog):
    # The swap runs before the model moves: the trainer's device (faked CUDA here), not where the
    # parameters are, decides. Under FSDP parameters keep their layout and the log says what to do.
    strategy = FSDPStrategy(parallel_devices=[torch.device("cuda", 0)])
    model = BuiltInConfigureModel()
    model.configure_model()
    trainer = SimpleNamespace(strategy=strategy, is_global_zero=True, loggers=[])
    with caplog.at_level(logging.INFO):
        GNSwapCallback().swap(trainer, model)  # type: ignore[arg-type]
    assert isinstance(model.net[3], gn_module.GroupNorm)
    assert not model.net[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert "parameters keep their memory format under FSDPStrategy" in caplog.text


def test_ddp_like_strategies_still_replace_layers(tmp_path):
    model = BuiltInConfigureModel()
    cpu_trainer(tmp_path, "auto", [GNSwapCallback()]).fit(model)
    now = {n: id(m) for n, m in model.named_modules() if isinstance(m, nn.GroupNorm)}
    assert now.keys() == model.built.keys() and not set(now.values()) & set(model.built.values())
    # The trainer's device is the CPU: the memory format is left as is (test_callback.py has the CUDA case).
    assert not model.net[0].weight.is_contiguous(memory_format=torch.channels_last)


# ---------------------------------------------------------------------------------------------
# The first-batch probe and its log


def test_probe_records_dtypes_and_logs_why_torch_ran(tmp_path, caplog):
    model, callback = BuiltInConfigureModel(), GNSwapCallback()
    trainer = cpu_trainer(tmp_path, "auto", [callback], precision="bf16-mixed")
    with caplog.at_level(logging.INFO):
        trainer.fit(model)
    # CPU autocast: conv outputs bf16, parameters stay fp32; the CPU is never our kernels' device.
    assert set(callback.first_calls) == {"net.1.layers.1", "net.2.layers.1", "net.3"}
    assert {(c.input_dtype, c.weight_dtype) for c in callback.first_calls.values()} == {
        (torch.bfloat16, torch.float32)
    }
    assert "(on_train_batch_end): in the first batch 0 GroupNorm layers ran our kernels" in caplog.text
    assert (
        "3 ran torch's path: input is on cpu, not CUDA (net.1.layers.1, net.2.layers.1, net.3)" in caplog.text
    )
    # The probe hooks are gone after the first batch.
    assert all(not m._forward_pre_hooks for m in model.modules() if isinstance(m, gn_module.GroupNorm))


def test_summary_warns_only_for_cuda_fallbacks():
    fast = LayerCall(torch.bfloat16, torch.float32, "cuda", None)
    mixed = LayerCall(
        torch.bfloat16,
        torch.float16,
        "cuda",
        "weight dtype torch.float16 is neither float32 nor the input's torch.bfloat16",
    )
    calls = {f"block{i}.norm": fast for i in range(3)} | {f"odd{i}": mixed for i in range(6)}
    message, warn = summarize_first_calls(calls, "on_train_batch_end")
    assert warn
    assert message.splitlines() == [
        "GNSwapCallback (on_train_batch_end): in the first batch 3 GroupNorm layers ran our kernels",
        "  6 ran torch's path: weight dtype torch.float16 is neither float32 nor the input's torch.bfloat16 "
        "(odd0, odd1, odd2, odd3 and 2 more)",
    ]
    assert summarize_first_calls({"a": fast}, "h") == (
        "GNSwapCallback (h): in the first batch 1 GroupNorm layers ran our kernels",
        False,
    )
    cpu = LayerCall(torch.float32, torch.float32, "cpu", "input is on cpu, not CUDA")
    assert summarize_first_calls({"a": cpu}, "h")[1] is False
    assert summarize_first_calls({}, "h") == ("", False)


# ---------------------------------------------------------------------------------------------
# FSDP2 for real: two gloo processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def fsdp2_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both ranks started at once (Lightning sees LOCAL_RANK and starts none), importing in parallel."""
    out = tmp_path_factory.mktemp("fsdp2")
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "WORLD_SIZE", "NODE_RANK")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2", NODE_RANK="0")
    env.update(
        OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    )
    cmd = [sys.executable, str(Path(__file__).resolve()), str(out)]
    logs = [(out / f"rank{rank}.log").open("w") for rank in (0, 1)]
    procs = [
        subprocess.Popen(cmd, env={**env, "LOCAL_RANK": str(rank)}, stdout=log, stderr=subprocess.STDOUT)
        for rank, log in enumerate(logs)
    ]
    try:
        codes = [proc.wait(timeout=240) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for log in logs:
            log.close()
    tails = "\n".join((out / f"rank{rank}.log").read_text()[-4000:] for rank in (0, 1))
    assert codes == [0, 0], tails
    return json.loads((out / "fsdp2.json").read_text())


def test_fsdp2_swaps_after_fully_shard_and_checkpoints_cross_over(fsdp2_run):
    r = fsdp2_run["fit"]
    assert r["sharded_in_configure_model"]  # fully_shard ran before the swap
    assert (
        r["same_objects"] and r["types_after_fit"] == ["GroupNorm"] * 3 and r["module"] == "gn_module.module"
    )
    assert r["seen_by_optimizer"] == ["GroupNorm"] * 3
    assert r["report"] == {"swapped": 3, "fused": 2, "already": 0, "skipped": 0}
    assert r["params_are_dtensors"] and r["params_changed"]
    assert r["losses_finite"]
    # Sharded checkpoint from the swapped model -> unswapped model: strict load, same outputs.
    assert r["plain_types"] == ["torch.nn.modules.normalization"] * 3
    assert r["plain_load_err"] == 0.0
    # revert_groupnorm after training: plain layers, same objects, FSDP2 still runs them.
    assert r["reverted"] == 3 and r["reverted_types"] == ["torch.nn.modules.normalization"] * 3
    assert r["reverted_same_objects"] and r["revert_err"] == 0.0


def test_fsdp2_mixed_precision_policies_reach_our_layers(fsdp2_run):
    r = fsdp2_run["mixed"]
    # bf16 parameters under bf16 autocast: x and weight bf16, a pair our kernels take (on CUDA).
    assert r["bf16"]["dtypes"] == [["torch.bfloat16", "torch.bfloat16"]]
    # fp16 parameters under bf16 autocast: fp16 weights meet bf16 conv outputs, and fp32 where a
    # residual adds the fp16 block input to a bf16 branch; no pair our kernels take, torch's path
    # runs them (with the reason logged on CUDA) and training goes on.
    assert r["fp16"]["dtypes"] == [["torch.bfloat16", "torch.float16"], ["torch.float32", "torch.float16"]]
    assert r["bf16"]["losses_finite"] and r["fp16"]["losses_finite"]


def _fsdp2_scenarios(out: Path) -> None:
    """Runs on both ranks; rank 0 writes the observations."""
    records: dict[str, dict[str, Any]] = {"fit": {}, "mixed": {}}

    def trainer(callbacks: list[Any], **kwargs: Any) -> Trainer:
        options = {
            "accelerator": "cpu",
            "devices": 2,
            "strategy": ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
            "callbacks": callbacks,
            "max_steps": 3,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "limit_val_batches": 1,
            "default_root_dir": out,
            **kwargs,
        }
        return Trainer(**options)

    def norm_modules(model: nn.Module) -> dict[str, nn.Module]:
        return {n: m for n, m in model.named_modules() if isinstance(m, nn.GroupNorm)}

    # 1. fit in 32-true, the sharded checkpoint into a plain model, revert after training.
    record = records["fit"]
    model, callback = BuiltInConfigureModel(fsdp2=True), GNSwapCallback()

    class Recorder(LossLog):
        def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
            record["sharded_in_configure_model"] = is_sharded(pl_module)
            self.initial = {n: p.full_tensor().clone() for n, p in pl_module.named_parameters()}

    recorder = Recorder()
    t = trainer([callback, recorder])
    t.fit(model)
    norms = norm_modules(model)
    from torch.distributed.tensor import DTensor

    record.update(
        same_objects={n: id(m) for n, m in norms.items()} == model.built,
        types_after_fit=[type(m).__name__ for m in norms.values()],
        module=type(next(iter(norms.values()))).__module__,
        seen_by_optimizer=model.seen_by_optimizer,
        report=callback.report.summary(),
        params_are_dtensors=all(isinstance(p, DTensor) for p in model.parameters()),
        params_changed=all(
            not torch.equal(p.full_tensor(), recorder.initial[n]) for n, p in model.named_parameters()
        ),
        losses_finite=recorder.finite(),
    )
    t.validate(model, verbose=False)
    swapped_out = model.out
    path = out / "sharded.ckpt"
    t.save_checkpoint(path)

    plain = BuiltInConfigureModel(fsdp2=True)
    trainer([]).validate(plain, ckpt_path=path, verbose=False)
    record["plain_types"] = [type(m).__module__ for m in norm_modules(plain).values()]
    record["plain_load_err"] = (plain.out - swapped_out).abs().max().item()

    before = {n: id(m) for n, m in norm_modules(model).items()}
    _, report = revert_groupnorm(model)
    t.callbacks = [c for c in t.callbacks if c is not callback]  # validate must not swap again
    t.validate(model, verbose=False)
    record.update(
        reverted=len(report.swapped),
        reverted_types=[type(m).__module__ for m in norm_modules(model).values()],
        reverted_same_objects={n: id(m) for n, m in norm_modules(model).items()} == before,
        revert_err=(model.out - swapped_out).abs().max().item(),
    )

    # 2. Mixed precision policies: the dtypes FSDP2 gives our layers.
    record = records["mixed"]
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        model, callback, log = (
            BuiltInConfigureModel(fsdp2=True, param_dtype=dtype),
            GNSwapCallback(),
            LossLog(),
        )
        trainer([callback, log], precision="bf16-mixed", limit_val_batches=0).fit(model)
        pairs = {(str(c.input_dtype), str(c.weight_dtype)) for c in callback.first_calls.values()}
        record[name] = {"dtypes": sorted(pairs), "losses_finite": log.finite()}
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        (out / "fsdp2.json").write_text(json.dumps(records))


if __name__ == "__main__":
    _fsdp2_scenarios(Path(sys.argv[1]))
