"""GNSwapCallback in CPU Trainers (the swapped layers run torch's native path here)."""

from __future__ import annotations

import inspect
import logging
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import gn_module
from gn_module.callback import GNSwapCallback
from gn_module.convert import DEFAULT_FUSE_ACTS, ActSlot, SiLUSlot, convert_groupnorm

warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*GPU available but not used.*")


class Net(LightningModule):
    """Conv/GroupNorm/SiLU net; optionally adds layers in ``setup`` and ``configure_model``."""

    def __init__(self, late_layers: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.SiLU())
        self.head = nn.Conv2d(8, 3, 1)
        self.seen_in_configure_optimizers: list[type] = []

    def setup(self, stage: str) -> None:
        if self.hparams.late_layers and not hasattr(self, "from_setup"):
            self.from_setup = nn.GroupNorm(4, 8)

    def configure_model(self) -> None:
        if self.hparams.late_layers and not hasattr(self, "from_configure"):
            self.from_configure = nn.Sequential(nn.GroupNorm(2, 8), nn.SiLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        if self.hparams.late_layers:
            h = self.from_configure(self.from_setup(h))
        return self.head(h)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        (x,) = batch
        loss = (self(x) - x).square().mean()
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", (self(batch[0]) - batch[0]).square().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        self.seen_in_configure_optimizers = [type(m) for m in self.modules() if isinstance(m, nn.GroupNorm)]
        return torch.optim.Adam(self.parameters(), lr=1e-2)

    def train_dataloader(self) -> DataLoader:
        data = torch.randn(8, 3, 6, 6, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(data), batch_size=4)

    val_dataloader = train_dataloader


def trainer(tmp_path, callbacks=(), **kwargs) -> Trainer:
    options = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": tmp_path,
        "max_epochs": 1,
        **kwargs,
    }
    return Trainer(callbacks=list(callbacks), **options)


def norms(model: nn.Module) -> dict[str, nn.GroupNorm]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.GroupNorm)}


def test_fast_dev_run_swaps_before_optimizer(tmp_path):
    model, callback = Net(), GNSwapCallback()
    params_before = dict(model.named_parameters())
    trainer(tmp_path, [callback], fast_dev_run=True).fit(model)
    assert isinstance(model.body[1], gn_module.GroupNorm) and model.body[1].act == "silu"
    assert isinstance(model.body[2], SiLUSlot)
    assert model.seen_in_configure_optimizers == [gn_module.GroupNorm]
    assert all(p is params_before[n] for n, p in model.named_parameters())
    assert callback.report is not None and callback.report.summary()["swapped"] == 1
    # The trainer's device is the CPU: the memory format is left as is (see test_cpu_target_*).
    assert model.body[0].weight.is_contiguous()
    assert not model.body[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_layers_from_setup_and_configure_model_are_swapped(tmp_path):
    model, callback = Net(late_layers=True), GNSwapCallback()
    trainer(tmp_path, [callback], fast_dev_run=True).fit(model)
    assert sorted(callback.report.swapped) == ["body.1", "from_configure.0", "from_setup"]
    assert model.from_configure[0].act == "silu"
    # The optimizer was built after the swap: it saw only converted layers.
    assert model.seen_in_configure_optimizers == [gn_module.GroupNorm] * 3
    optimizer = model.trainer.optimizers[0]
    in_optimizer = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert id(model.from_configure[0].weight) in in_optimizer


def test_summary_logged_and_recorded_in_hparams(tmp_path, caplog):
    logger = CSVLogger(tmp_path)
    with caplog.at_level(logging.INFO):
        trainer(tmp_path, [GNSwapCallback(exclude="nothing")], logger=logger, max_steps=1).fit(Net())
    assert "GNSwapCallback: swapped 1, fused 1" in caplog.text
    # Said once, in the summary: on the CPU torch's kernel runs underneath.
    assert caplog.text.count("the trainer's device is cpu, where the swapped layers run torch's own") == 1
    hparams = logger.experiment.hparams
    assert hparams["gn_swap/swapped"] == 1 and hparams["gn_swap/fused"] == 1
    assert hparams["gn_swap/channels_last"] is True
    assert "late_layers" in hparams  # the model's own hparams are still there
    assert "gn_swap/swapped: 1" in (tmp_path / "lightning_logs/version_0/hparams.yaml").read_text()


def test_options_reach_convert(tmp_path):
    model = Net(late_layers=True)
    callback = GNSwapCallback(channels_last=False, fuse_silu=False, exclude=["from_*"])
    trainer(tmp_path, [callback], fast_dev_run=True).fit(model)
    assert callback.report.swapped == ["body.1"] and callback.report.fused == []
    assert type(model.from_setup) is nn.GroupNorm and type(model.body[2]) is nn.SiLU
    assert model.body[0].weight.is_contiguous()
    assert not model.body[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_restore_on_teardown(tmp_path):
    model = Net()
    original_norm, original_silu = model.body[1], model.body[2]
    trainer(tmp_path, [GNSwapCallback(restore_on_teardown=True)], fast_dev_run=True).fit(model)
    assert model.body[1] is original_norm and model.body[2] is original_silu
    assert model.body[0].weight.is_contiguous()
    assert "setup" not in vars(model.trainer.strategy)


def test_second_stage_finds_layers_already_swapped(tmp_path):
    model, callback = Net(), GNSwapCallback()
    t = trainer(tmp_path, [callback], fast_dev_run=True)
    t.fit(model)
    first = callback.report
    t.validate(model, verbose=False)
    assert callback.report is first  # nothing new to report
    assert "setup" not in vars(t.strategy)


def test_checkpoint_from_swapped_loads_into_plain_and_back(tmp_path):
    model = Net()
    t = trainer(tmp_path, [GNSwapCallback()], max_steps=2)
    t.fit(model)
    path = tmp_path / "swapped.ckpt"
    t.save_checkpoint(path)
    plain = Net.load_from_checkpoint(path, strict=True)
    assert type(plain.body[1]) is nn.GroupNorm
    x = torch.randn(2, 3, 6, 6)
    model.eval()
    torch.testing.assert_close(plain(x), model(x))

    # A plain model's checkpoint loads into a converted one.
    converted, _ = convert_groupnorm(Net())
    converted.load_state_dict(torch.load(path, weights_only=True)["state_dict"], strict=True)
    plain_sd = Net().state_dict()
    model.load_state_dict(plain_sd, strict=True)
    torch.testing.assert_close(model.body[1].weight, plain_sd["body.1.weight"])


def test_resume_training_matches_uninterrupted(tmp_path):
    torch.manual_seed(0)
    initial = Net().state_dict()

    def fresh() -> Net:
        net = Net()
        net.load_state_dict(initial)
        return net

    straight = fresh()
    trainer(tmp_path, [GNSwapCallback()], max_epochs=2).fit(straight)

    # Epoch 1 without the callback, epoch 2 resumed with it: the plain checkpoint restores the
    # swapped model's weights and the Adam state for the same Parameters.
    first = trainer(tmp_path, max_epochs=1)
    first.fit(fresh())
    path = tmp_path / "epoch1.ckpt"
    first.save_checkpoint(path)
    resumed = fresh()
    t = trainer(tmp_path, [GNSwapCallback()], max_epochs=2)
    t.fit(resumed, ckpt_path=path)
    assert t.global_step == 4 and isinstance(resumed.body[1], gn_module.GroupNorm)
    for (name, p), q in zip(straight.named_parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=name)


def test_patch_removed_when_setup_fails(tmp_path):
    class Broken(Net):
        def configure_model(self) -> None:
            raise ValueError("boom")

    t = trainer(tmp_path, [GNSwapCallback()], fast_dev_run=True)
    with pytest.raises(ValueError, match="boom"):
        t.fit(Broken())
    assert "setup" not in vars(t.strategy)


def test_bad_options_fail_at_construction():
    with pytest.raises(ValueError, match="min_channels"):
        GNSwapCallback(min_channels=-3)
    with pytest.raises(TypeError, match="exclude"):
        GNSwapCallback(exclude=[None])  # type: ignore[list-item]


def test_bad_option_types_name_the_parameter():
    expected = r"a string \(fnmatch pattern\), an iterable of strings, or None"
    with pytest.raises(TypeError, match=rf"GNSwapCallback\(\): include must be {expected}, got int 5"):
        GNSwapCallback(include=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"GNSwapCallback\(\): exclude must be .*got an item of type int"):
        GNSwapCallback(exclude=["body.*", 3])  # type: ignore[list-item]
    with pytest.raises(
        TypeError, match=r"GNSwapCallback\(\): channels_last must be True or False, got str 'yes'"
    ):
        GNSwapCallback(channels_last="yes")  # type: ignore[arg-type]
    for flag in ("fuse_silu", "restore_on_teardown", "log_hyperparams"):
        with pytest.raises(TypeError, match=f"{flag} must be True or False, got int 1"):
            GNSwapCallback(**{flag: 1})
    with pytest.raises(ValueError, match=r"GNSwapCallback\(\): autocast_output must be one of"):
        GNSwapCallback(autocast_output="fp32")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"GNSwapCallback\(\): fuse_acts must be True, False, or names"):
        GNSwapCallback(fuse_acts=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"GNSwapCallback\(\): fuse_acts must be .* got 'mish'"):
        GNSwapCallback(fuse_acts=("relu", "mish"))
    assert GNSwapCallback(autocast_output="input").convert_kwargs["autocast_output"] == "input"


def test_include_given_as_a_generator_still_applies(tmp_path):
    callback = GNSwapCallback(include=(p for p in ["body.*"]))  # consumed once, by the validation
    model = Net(late_layers=True)
    trainer(tmp_path, [callback], fast_dev_run=True).fit(model)
    assert callback.report.swapped == ["body.1"]


def stub_trainer(device: str) -> SimpleNamespace:
    """What `GNSwapCallback.swap` reads from a Trainer, with the strategy's target device faked."""
    return SimpleNamespace(
        strategy=SingleDeviceStrategy(torch.device(device)), is_global_zero=True, loggers=[]
    )


@pytest.mark.parametrize("channels_last", [True, False])
def test_cuda_target_gets_channels_last(caplog, channels_last):
    # The swap runs before the model moves: its parameters are still on the CPU here, and the
    # trainer's target device decides.
    model, callback = Net(), GNSwapCallback(channels_last=channels_last)
    with caplog.at_level(logging.INFO):
        callback.swap(stub_trainer("cuda:0"), model)
    assert model.body[0].weight.device.type == "cpu"
    assert model.body[0].weight.is_contiguous(memory_format=torch.channels_last) is channels_last
    assert "GNSwapCallback: swapped 1, fused 1" in caplog.text
    assert "torch's own GroupNorm" not in caplog.text


def test_cpu_target_keeps_memory_format(caplog):
    model, callback = Net(), GNSwapCallback()
    with caplog.at_level(logging.INFO):
        callback.swap(stub_trainer("cpu"), model)
    assert isinstance(model.body[1], gn_module.GroupNorm)
    assert not model.body[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert "memory format left as is (channels_last=True applies on CUDA only)" in caplog.text


FROZEN_CONV_FIT = """
import torch
from lightning.pytorch import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gn_module import GNSwapCallback


class Frozen(LightningModule):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1).requires_grad_(False)  # frozen: its output needs no grad
        self.norm = nn.GroupNorm(4, 8)  # whose weight does
        self.head = nn.Conv2d(8, 3, 1)

    def training_step(self, batch, batch_idx):
        return self.head(self.norm(self.stem(batch[0]))).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 3, 6, 6)), batch_size=4)


model = Frozen()
trainer = Trainer(accelerator="cpu", devices=1, max_steps=2, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, callbacks=[GNSwapCallback()])
trainer.fit(model)
assert trainer.global_step == 2 and type(model.norm).__module__ == "gn_module.module"
print("fit ok")
"""


def test_cpu_fit_with_frozen_first_conv_does_not_crash(tmp_path):
    # torch 2.13's CPU GroupNorm backward segfaults on a channels_last input that needs no grad and a
    # weight that does (plain F.group_norm, no gn_module code): the callback must not make the model
    # channels_last on the CPU. A subprocess, so that a crash fails this test only.
    script = tmp_path / "frozen_conv_fit.py"
    script.write_text(textwrap.dedent(FROZEN_CONV_FIT))
    src = Path(__file__).resolve().parents[1] / "src"
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "fit ok" in proc.stdout


def test_fuse_acts_reaches_convert_and_may_be_a_generator(tmp_path):
    callback = GNSwapCallback(fuse_acts=("relu", "gelu"))  # SiLU not among them
    model = Net()
    trainer(tmp_path, [callback], fast_dev_run=True).fit(model)
    assert callback.report.swapped == ["body.1"] and callback.report.fused == []
    assert type(model.body[2]) is nn.SiLU and model.body[1].act is None
    callback = GNSwapCallback(fuse_acts=(a for a in ["silu"]))  # consumed once, kept as a tuple
    assert callback.convert_kwargs["fuse_acts"] == ("silu",)
    model = Net()
    trainer(tmp_path, [callback], fast_dev_run=True).fit(model)
    assert callback.report.fused == ["body.1"] and isinstance(model.body[2], SiLUSlot)


class GroupNormAct(nn.GroupNorm):
    """Named like timm's GroupNormAct (timm is not a dependency): act(drop(group_norm(x)))."""

    def __init__(self, groups: int, channels: int, act: nn.Module) -> None:
        super().__init__(groups, channels)
        self.act, self.drop = act, nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
        return self.act(self.drop(y))


GroupNormAct.__module__, GroupNormAct.__qualname__ = "timm.layers.norm_act", "GroupNormAct"


class ReLUNet(Net):
    """Net with GroupNorm -> ReLU in its nn.Sequential, then a timm-style GroupNormAct(ReLU) and a
    GroupNormAct(SiLU)."""

    def __init__(self) -> None:
        super().__init__()
        self.body[2] = nn.ReLU()
        self.relu_act = GroupNormAct(4, 8, nn.ReLU(inplace=True))
        self.silu_act = GroupNormAct(2, 8, nn.SiLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.silu_act(self.relu_act(self.body(x))))


def test_default_fuses_every_act_and_a_narrower_list_leaves_the_others(tmp_path):
    """The default (`DEFAULT_FUSE_ACTS`, all four since their epilogues passed the GPU suite) fuses the ReLU
    after a GroupNorm and a GroupNormAct(ReLU); fuse_acts=("silu",) leaves both, saying why."""
    default = inspect.signature(GNSwapCallback).parameters["fuse_acts"].default
    assert default is DEFAULT_FUSE_ACTS == ("silu", "relu", "gelu", "gelu_tanh")
    callback = GNSwapCallback(fuse_acts=("silu",))
    assert callback.convert_kwargs["fuse_acts"] == ("silu",)
    model = ReLUNet()
    relu, relu_act = model.body[2], model.relu_act
    trainer(tmp_path, [callback], fast_dev_run=True).fit(model)
    report = callback.report
    assert report.swapped == ["body.1", "silu_act"] and report.fused == ["silu_act"]
    assert list(report.skipped) == ["relu_act"] and "which fuse_acts excludes" in report.skipped["relu_act"]
    assert isinstance(model.body[1], gn_module.GroupNorm) and model.body[1].act is None
    assert model.body[2] is relu and model.relu_act is relu_act and type(relu_act) is GroupNormAct
    assert isinstance(model.silu_act, gn_module.GroupNorm) and model.silu_act.act == "silu"

    callback = GNSwapCallback()
    model = ReLUNet()
    trainer(tmp_path, [callback], fast_dev_run=True).fit(model)
    assert callback.report.swapped == ["body.1", "relu_act", "silu_act"] and callback.report.skipped == {}
    assert callback.report.fused == ["body.1", "relu_act", "silu_act"]
    assert model.body[1].act == "relu" and isinstance(model.body[2], ActSlot) and model.relu_act.act == "relu"
