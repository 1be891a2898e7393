"""convert_groupnorm / revert_groupnorm on the CPU (torch's native path computes the results)."""

from __future__ import annotations

import copy
import importlib.util
import inspect
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from model_step_helpers import assert_same_step
from torch import nn

import gn_module
from gn_module.convert import (
    DEFAULT_FUSE_ACTS,
    FUSABLE_ACTS,
    ActSlot,
    SiLUSlot,
    act_of_module,
    check_options,
    convert_groupnorm,
    resolve_fuse_acts,
    revert_groupnorm,
)


def block(c: int = 8) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.GroupNorm(4, c), nn.SiLU(), nn.Conv2d(c, c, 1))


class PlainSubclass(nn.GroupNorm):
    """Subclass that keeps nn.GroupNorm.forward: convertible."""


class CustomForward(nn.GroupNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


class ExtraState(nn.GroupNorm):
    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.scale = nn.Parameter(torch.ones(1))


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = block()
        self.layers = nn.ModuleList([block(), nn.Sequential(nn.GroupNorm(2, 8), nn.Identity(), nn.SiLU())])
        self.heads = nn.ModuleDict({"a": PlainSubclass(4, 8), "b": CustomForward(4, 8)})
        self.extra = ExtraState(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return self.extra(self.heads["b"](self.heads["a"](x)))


def randomize(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-1, 1)
    return model


def make_pair(model: nn.Module, **kwargs: object):
    randomize(model)
    ref = copy.deepcopy(model)
    params = dict(model.named_parameters())
    converted, report = convert_groupnorm(model, **kwargs)
    return ref, converted, report, params


def names_of(model: nn.Module, cls: type) -> list[str]:
    return [n for n, m in model.named_modules() if type(m) is cls]


def test_nested_model_swaps_fuses_and_skips_with_reasons():
    ref, model, report, params = make_pair(Nested())
    assert sorted(report.swapped) == ["heads.a", "layers.0.1", "layers.1.0", "stem.1"]
    assert sorted(report.fused) == ["layers.0.1", "stem.1"]
    assert "overrides forward" in report.skipped["heads.b"]
    assert "parameter scale" in report.skipped["extra"]
    assert report.summary() == {"swapped": 4, "fused": 2, "already": 0, "skipped": 2}
    assert isinstance(model.stem[2], SiLUSlot) and isinstance(model.stem[2], nn.Identity)
    assert model.stem[1].act == "silu" and model.layers[1][0].act is None  # Identity in between
    assert type(model.layers[1][2]) is nn.SiLU
    # Same Parameter objects under the same names.
    assert dict(model.named_parameters()).keys() == params.keys()
    assert all(p is params[n] for n, p in model.named_parameters())
    x = torch.randn(2, 8, 6, 6)
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)


def test_outputs_and_grads_equal_original():
    ref, model, _, _ = make_pair(Nested())
    x = torch.randn(2, 8, 5, 7)
    model(x).square().sum().backward()
    ref(x).square().sum().backward()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=n)


def test_state_dict_unchanged_and_loads_both_ways_strict():
    ref, model, _, _ = make_pair(Nested())
    sd_ref, sd = ref.state_dict(), model.state_dict()
    assert list(sd) == list(sd_ref)
    for key in sd:
        torch.testing.assert_close(sd[key], sd_ref[key], rtol=0, atol=0)
    plain = randomize(Nested())
    plain.load_state_dict(sd, strict=True)
    model.load_state_dict(randomize(Nested()).state_dict(), strict=True)


def test_optimizer_keeps_updating_the_same_tensors():
    model = randomize(Nested())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, _ = convert_groupnorm(model)
    weight = model.stem[1].weight
    before = weight.detach().clone()
    model(torch.randn(2, 8, 4, 4)).sum().backward()
    opt.step()
    assert any(weight is p for p in opt.param_groups[0]["params"])
    assert not torch.equal(before, weight.detach())


def test_training_mode_requires_grad_dtype_preserved():
    model = block().double()
    model[1].weight.requires_grad_(False)
    model.eval()
    model, _ = convert_groupnorm(model)
    norm = model[1]
    assert isinstance(norm, gn_module.GroupNorm)
    assert not norm.training and not model[2].training
    assert not norm.weight.requires_grad and norm.bias.requires_grad
    assert norm.weight.dtype == torch.float64 and norm.weight.device.type == "cpu"


def test_affine_false_bias_false_and_eps_kept():
    model = nn.Sequential(nn.GroupNorm(2, 4, eps=1e-3, affine=False), nn.GroupNorm(2, 4, bias=False))
    ref = copy.deepcopy(model)
    model, report = convert_groupnorm(model)
    assert report.summary()["swapped"] == 2
    assert model[0].weight is None and model[0].eps == 1e-3
    assert model[1].bias is None and list(model.state_dict()) == list(ref.state_dict())
    x = torch.randn(3, 4, 5)
    torch.testing.assert_close(model(x), ref(x))


def test_shared_module_converted_once_and_stays_shared():
    shared = nn.GroupNorm(4, 8)
    model = nn.Sequential(nn.Sequential(shared, nn.SiLU()), nn.ModuleList([shared]), shared)
    model, report = convert_groupnorm(model)
    assert report.swapped == ["0.0"]
    assert model[0][0] is model[1][0] is model[2]
    # Fusing would change the other two places, where no SiLU follows.
    assert model[0][0].act is None and type(model[0][1]) is nn.SiLU
    assert report.skipped["0.0+0.1"].startswith("not fused")


def test_shared_sequential_fused_once():
    seq = nn.Sequential(nn.GroupNorm(4, 8), nn.SiLU())
    model = nn.Sequential(seq, seq)
    model, report = convert_groupnorm(model)
    assert model[0] is model[1] and model[0][0].act == "silu" and report.fused == ["0.0"]


def test_idempotent():
    model = randomize(Nested())
    model, first = convert_groupnorm(model)
    modules = list(model.modules())
    model, second = convert_groupnorm(model)
    assert second.swapped == [] and second.fused == []
    assert sorted(second.already) == sorted(first.swapped)
    assert second.skipped == first.skipped
    assert all(a is b for a, b in zip(modules, model.modules(), strict=True))


def test_revert_restores_original_objects_and_unfuses():
    model = randomize(Nested())
    originals = {n: m for n, m in model.named_modules() if isinstance(m, nn.GroupNorm | nn.SiLU)}
    ref = copy.deepcopy(model)
    model, _ = convert_groupnorm(model)
    model, report = revert_groupnorm(model)
    assert str(report).startswith("reverted 4, unfused 2, already 2, skipped 0")  # 2 never converted
    assert sorted(report.fused) == ["layers.0.1", "stem.1"]
    assert sorted(report.swapped) == ["heads.a", "layers.0.1", "layers.1.0", "stem.1"]
    now = {n: m for n, m in model.named_modules() if isinstance(m, nn.GroupNorm | nn.SiLU)}
    assert now.keys() == originals.keys() and all(now[n] is originals[n] for n in now)
    assert not any(isinstance(m, gn_module.GroupNorm | SiLUSlot) for m in model.modules())
    x = torch.randn(2, 8, 3, 3)
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)


def test_revert_shares_current_parameters_and_mode():
    model = block()
    model, _ = convert_groupnorm(model)
    new_weight = nn.Parameter(torch.full((8,), 3.0))
    model.load_state_dict({**model.state_dict(), "1.weight": new_weight}, assign=True)
    model.eval()
    model, _ = revert_groupnorm(model)
    assert type(model[1]) is nn.GroupNorm and model[1].weight is model.get_parameter("1.weight")
    assert torch.equal(model[1].weight, torch.full((8,), 3.0)) and not model[1].training


def test_revert_of_user_built_layers():
    model = nn.Sequential(
        gn_module.GroupNorm(2, 4),
        gn_module.GroupNorm(2, 4, act="silu"),
        gn_module.GroupNorm(2, 4, act="identity"),
        gn_module.GroupNorm(2, 4, act="relu"),
        ActSlot(act="gelu"),  # follows a relu GroupNorm: not its slot
    )
    model, report = revert_groupnorm(model)
    assert type(model[0]) is nn.GroupNorm and type(model[2]) is nn.GroupNorm and report.swapped == ["0", "2"]
    assert report.skipped["1"] == "fused act='silu' has no ActSlot after it to move back into"
    assert report.skipped["3"] == "fused act='relu' has no ActSlot after it to move back into"
    assert "ActSlot (act='gelu') does not follow" in report.skipped["4"]
    assert isinstance(model[1], gn_module.GroupNorm) and model[3].act == "relu"


@pytest.mark.parametrize(
    "model, why",
    [
        (nn.Sequential(nn.GroupNorm(4, 8), nn.Identity(), nn.SiLU()), "SiLU not directly after"),
        (nn.Sequential(nn.GroupNorm(4, 8), nn.LeakyReLU()), "no kernel epilogue"),
        (nn.Sequential(nn.GroupNorm(4, 8), nn.ReLU6()), "no kernel epilogue"),
        (nn.Sequential(nn.GroupNorm(4, 8), nn.Mish()), "no kernel epilogue"),
        (nn.Sequential(nn.GroupNorm(4, 8), type("MyReLU", (nn.ReLU,), {})()), "a subclass may differ"),
        (nn.ModuleList([nn.GroupNorm(4, 8), nn.SiLU()]), "ModuleList has no data flow"),
        (nn.ModuleList([nn.GroupNorm(4, 8), nn.ReLU()]), "ModuleList has no data flow"),
    ],
)
def test_fusion_negative_cases(model: nn.Module, why: str):
    model, report = convert_groupnorm(model, fuse_acts=True)  # not fused even with every act opted in
    assert report.fused == [], why
    assert model[0].act is None and not any(isinstance(m, ActSlot) for m in model.modules())


def test_no_fusion_in_sequential_subclass_with_custom_forward():
    class Residual(nn.Sequential):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self[0](x)  # the GroupNorm output is used twice
            return self[1](h) + h

    model = randomize(Residual(nn.GroupNorm(4, 8), nn.SiLU()))
    ref = copy.deepcopy(model)
    model, report = convert_groupnorm(model)
    assert report.swapped == ["0"] and report.fused == []
    x = torch.randn(2, 8, 3, 3)
    torch.testing.assert_close(model(x), ref(x))


def test_no_fusion_with_hooks_and_hooks_move_with_the_layer():
    model = nn.Sequential(nn.GroupNorm(4, 8), nn.SiLU())
    seen = []
    handle = model[0].register_forward_hook(lambda mod, args, out: seen.append(type(mod)))
    model, report = convert_groupnorm(model)
    assert report.fused == [] and "hooks" in report.skipped["0+1"]
    model(torch.randn(1, 8, 2, 2))
    assert seen == [gn_module.GroupNorm]
    handle.remove()  # the handle made before the swap still works
    model(torch.randn(1, 8, 2, 2))
    assert len(seen) == 1
    model, report = convert_groupnorm(model)
    assert report.fused == ["0"]


def test_inplace_silu_fuses_with_equal_results():
    model = randomize(nn.Sequential(nn.Conv2d(8, 8, 1), nn.GroupNorm(4, 8), nn.SiLU(inplace=True)))
    ref = copy.deepcopy(model)
    model, report = convert_groupnorm(model)
    assert report.fused == ["1"]
    x = torch.randn(2, 8, 3, 3)
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)
    model, _ = revert_groupnorm(model)
    assert model[2].inplace


def test_fuse_silu_false():
    model, report = convert_groupnorm(block(), fuse_silu=False)
    assert report.fused == [] and type(model[2]) is nn.SiLU and model[1].act is None


def test_include_exclude_min_channels():
    def model() -> nn.Module:
        return nn.ModuleDict({"enc": block(8), "dec": block(16), "out": nn.GroupNorm(1, 4)})

    _, report = convert_groupnorm(model(), include="enc.*")
    assert report.swapped == ["enc.1"] and "include" in report.skipped["dec.1"]
    _, report = convert_groupnorm(model(), include=["enc.*", "out"], exclude=("enc.*",))
    assert report.swapped == ["out"] and "exclude pattern 'enc.*'" in report.skipped["enc.1"]
    converted, report = convert_groupnorm(model(), min_channels=16)
    assert report.swapped == ["dec.1"] and "min_channels" in report.skipped["out"]
    assert type(converted["enc"][2]) is nn.SiLU  # not swapped, so not fused


def test_root_groupnorm_is_replaced():
    norm = nn.GroupNorm(2, 4)
    new, report = convert_groupnorm(norm)
    assert isinstance(new, gn_module.GroupNorm) and new.weight is norm.weight and report.swapped == [""]
    back, _ = revert_groupnorm(new)
    assert back is norm


def timm_like(name: str, module: str):
    """Classes named like timm's (timm is not a dependency); forward deliberately not nn.GroupNorm's."""

    class GN(nn.GroupNorm):
        def __init__(self, groups: int, channels: int, act: nn.Module | None = None) -> None:
            super().__init__(groups, channels)
            if act is not None:
                self.act, self.drop = act, nn.Identity()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = nn.functional.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
            return self.act(self.drop(y)) if hasattr(self, "act") else y

    GN.__module__, GN.__qualname__, GN.__name__ = module, name, name
    return GN


def test_timm_groupnorm_and_groupnormact():
    gn_cls = timm_like("GroupNorm", "timm.layers.norm")
    act_cls = timm_like("GroupNormAct", "timm.layers.norm_act")
    model = randomize(
        nn.ModuleDict(
            {
                "gn": gn_cls(2, 4),
                "silu": act_cls(2, 4, nn.SiLU()),
                "ident": act_cls(2, 4, nn.Identity()),
                "relu": act_cls(2, 4, nn.ReLU()),
                "leaky": act_cls(2, 4, nn.LeakyReLU()),
            }
        )
    )
    ref = copy.deepcopy(model)
    model, report = convert_groupnorm(model, fuse_acts=True)
    assert sorted(report.swapped) == ["gn", "ident", "relu", "silu"]
    assert sorted(report.fused) == ["relu", "silu"]
    assert model["silu"].act == "silu" and model["ident"].act is None and model["relu"].act == "relu"
    assert "act=LeakyReLU has no fused kernel" in report.skipped["leaky"]
    x = torch.randn(2, 4, 3)
    for key in model:
        torch.testing.assert_close(model[key](x), ref[key](x), msg=key)
    assert list(model.state_dict()) == list(ref.state_dict())
    model, _ = revert_groupnorm(model)
    assert type(model["silu"]) is act_cls and type(model["silu"].act) is nn.SiLU
    assert type(model["relu"]) is act_cls and type(model["relu"].act) is nn.ReLU

    _, report = convert_groupnorm(act_cls(2, 4, nn.SiLU()), fuse_silu=False)
    assert "fuse_silu=False" in report.skipped[""]
    _, report = convert_groupnorm(act_cls(2, 4, nn.ReLU()), fuse_acts=("silu", "gelu"))
    assert report.skipped[""] == "its activation is 'relu', which fuse_acts excludes (fused: silu, gelu)"
    _, report = convert_groupnorm(act_cls(2, 4, nn.SiLU()), fuse_acts=("relu",))
    assert report.skipped[""] == "its activation is 'silu', which fuse_acts excludes (fused: relu)"
    _, report = convert_groupnorm(act_cls(2, 4, nn.GELU()), fuse_acts=False)
    assert report.skipped[""] == "its activation is 'gelu', which fuse_acts excludes (fused: none)"


def test_instance_forward_override_skipped():
    norm = nn.GroupNorm(2, 4)
    norm.forward = lambda x: x
    _, report = convert_groupnorm(norm)
    assert "instance" in report.skipped[""]


def test_parametrized_groupnorm_skipped():
    model = nn.Sequential(nn.GroupNorm(2, 4))
    torch.nn.utils.parametrize.register_parametrization(model[0], "weight", nn.Identity())
    _, report = convert_groupnorm(model)
    assert report.swapped == [] and "0" in report.skipped


def test_bad_arguments():
    with pytest.raises(TypeError, match=r"nn\.Module"):
        convert_groupnorm("model")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_channels"):
        convert_groupnorm(block(), min_channels=-1)
    with pytest.raises(TypeError, match="include"):
        convert_groupnorm(block(), include=[1])  # type: ignore[list-item]
    with pytest.raises(
        TypeError,
        match=r"convert_groupnorm\(\): exclude must be a string \(fnmatch pattern\), an iterable of strings, "
        r"or None, got int 5",
    ):
        convert_groupnorm(block(), exclude=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"nn\.Module"):
        revert_groupnorm(None)  # type: ignore[arg-type]


def test_report_text():
    _, report = convert_groupnorm(nn.Sequential(block(), CustomForward(4, 8)))
    text = str(report)
    assert "swapped 1, fused 1" in text and "skipped 1: test_convert.CustomForward overrides forward" in text


def test_deepcopy_of_converted_model_reverts_independently():
    model, _ = convert_groupnorm(block())
    clone = copy.deepcopy(model)
    clone, _ = revert_groupnorm(clone)
    assert clone[1].weight is not model[1].weight
    assert dict(clone.named_parameters()).keys() == dict(model.named_parameters()).keys()
    assert all(p is clone.get_parameter(n) for n, p in clone[1].named_parameters(prefix="1"))


def test_subclass_of_fast_groupnorm_with_own_forward_is_not_fused_or_reverted():
    class Doubled(gn_module.GroupNorm):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    model = nn.Sequential(Doubled(2, 4), nn.SiLU())
    model, report = convert_groupnorm(model)
    assert report.fused == [] and model[0].act is None and type(model[1]) is nn.SiLU
    model, report = revert_groupnorm(model)
    assert type(model[0]) is Doubled and "overrides forward" in report.skipped["0"]


@pytest.mark.parametrize("in_place", [False, True])
def test_autocast_output_reaches_every_swapped_layer_and_revert_drops_it(in_place):
    model = nn.Sequential(nn.Conv2d(3, 8, 1), nn.GroupNorm(4, 8), nn.SiLU(), nn.GroupNorm(2, 8))
    converted, report = gn_module.convert_groupnorm(model, autocast_output="input", in_place=in_place)
    norms = [m for m in converted.modules() if isinstance(m, gn_module.GroupNorm)]
    assert len(norms) == 2 == len(report.swapped)
    assert all(m.autocast_output == "input" for m in norms)
    reverted, _ = gn_module.revert_groupnorm(converted)
    plain = [m for m in reverted.modules() if isinstance(m, nn.GroupNorm)]
    assert all(type(m) is nn.GroupNorm and "autocast_output" not in vars(m) for m in plain)
    default, _ = gn_module.convert_groupnorm(nn.Sequential(nn.GroupNorm(4, 8)), in_place=in_place)
    assert default[0].autocast_output == "float32"
    with pytest.raises(ValueError, match=r"convert_groupnorm\(\): autocast_output must be one of"):
        gn_module.convert_groupnorm(model, autocast_output="bfloat16")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------- activations
def timm_act(name: str) -> nn.Module:
    """An instance of a class named like timm's stateless GELU / GELUTanh (timm is not a dependency)."""
    approximate = "tanh" if name == "GELUTanh" else "none"
    cls = type(
        name, (nn.Module,), {"forward": lambda self, x: nn.functional.gelu(x, approximate=approximate)}
    )
    cls.__module__, cls.__qualname__ = "timm.layers.activations", name
    return cls()


ACT_MODULES = {
    "SiLU": (lambda: nn.SiLU(), "silu"),
    "SiLU-inplace": (lambda: nn.SiLU(inplace=True), "silu"),
    "ReLU": (lambda: nn.ReLU(), "relu"),
    "ReLU-inplace": (lambda: nn.ReLU(inplace=True), "relu"),
    "GELU": (lambda: nn.GELU(), "gelu"),
    "GELU-tanh": (lambda: nn.GELU(approximate="tanh"), "gelu_tanh"),
    "timm-GELU": (lambda: timm_act("GELU"), "gelu"),
    "timm-GELUTanh": (lambda: timm_act("GELUTanh"), "gelu_tanh"),
}


def test_act_of_module():
    for key, (make, act) in ACT_MODULES.items():
        assert act_of_module(make()) == act, key
    overridden = nn.ReLU()
    overridden.forward = lambda x: x
    stateful = nn.ReLU()
    stateful.register_buffer("scale", torch.ones(1))
    for module in (
        nn.Identity(),
        nn.LeakyReLU(),
        nn.PReLU(),
        type("R", (nn.ReLU,), {})(),
        overridden,
        stateful,
    ):
        assert act_of_module(module) is None, module
    assert act_of_module(None) is None


@pytest.mark.parametrize("key", list(ACT_MODULES))
def test_sequential_fuses_each_act_and_reverts_bitwise(key: str):
    make, act = ACT_MODULES[key]
    model = randomize(nn.Sequential(nn.Conv2d(8, 8, 1), nn.GroupNorm(4, 8), make(), nn.Conv2d(8, 8, 1)))
    ref = copy.deepcopy(model)
    originals = dict(model.named_modules())
    model, report = convert_groupnorm(model, fuse_acts=True)
    assert report.swapped == ["1"] and report.fused == ["1"] and model[1].act == act
    assert type(model[2]) is (SiLUSlot if act == "silu" else ActSlot) and model[2].act == act
    assert repr(model[2]) == f"{type(model[2]).__name__}(act={act!r})"
    assert list(model.state_dict()) == list(ref.state_dict())
    x = torch.randn(2, 8, 5, 3)
    assert_same_step(model, ref, x)
    model, report = revert_groupnorm(model)
    assert report.fused == ["1"] and report.swapped == ["1"] and report.skipped == {}
    now = dict(model.named_modules())
    assert now.keys() == originals.keys() and all(now[n] is originals[n] for n in now)
    assert getattr(model[2], "inplace", False) == getattr(ref[2], "inplace", False)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)


def test_inplace_relu_fused_where_its_input_is_a_leaf_view():
    # An in-place ReLU straight on the GroupNorm output: fused, the GroupNorm writes relu(y) itself.
    model = randomize(nn.Sequential(nn.GroupNorm(2, 4), nn.ReLU(inplace=True), nn.GroupNorm(2, 4)))
    ref = copy.deepcopy(model)
    model, report = convert_groupnorm(model, fuse_acts=True)
    assert report.fused == ["0"] and model[2].act is None
    x = torch.randn(3, 4, 6, requires_grad=True)
    model(x).sum().backward()
    grad = x.grad.clone()
    x.grad = None
    ref(x).sum().backward()
    torch.testing.assert_close(grad, x.grad, rtol=0, atol=0)


def test_shared_activation_instance_fuses_in_every_slot():
    act = nn.ReLU()
    model = randomize(nn.Sequential(nn.GroupNorm(2, 4), act, nn.Conv1d(4, 4, 1), nn.GroupNorm(2, 4), act))
    ref = copy.deepcopy(model)
    model, report = convert_groupnorm(model, fuse_acts=["relu"])
    assert report.fused == ["0", "3"] and model[1] is not model[4]  # two slots, each keeping `act`
    x = torch.randn(2, 4, 5)
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)
    model, _ = revert_groupnorm(model)
    assert model[1] is act and model[4] is act


def all_acts_model() -> nn.Sequential:
    return nn.Sequential(
        nn.GroupNorm(2, 4), nn.SiLU(), nn.GroupNorm(2, 4), nn.ReLU(), nn.GroupNorm(2, 4), nn.GELU(),
        nn.GroupNorm(2, 4), nn.GELU(approximate="tanh"),
    )  # fmt: skip


@pytest.mark.parametrize(
    "kwargs, fused",
    [
        ({}, ["0", "2", "4", "6"]),  # DEFAULT_FUSE_ACTS: every act
        ({"fuse_acts": DEFAULT_FUSE_ACTS}, ["0", "2", "4", "6"]),
        ({"fuse_acts": "silu"}, ["0"]),
        ({"fuse_acts": True}, ["0", "2", "4", "6"]),
        ({"fuse_acts": FUSABLE_ACTS}, ["0", "2", "4", "6"]),
        ({"fuse_acts": ("relu", "gelu")}, ["2", "4"]),
        ({"fuse_acts": "gelu_tanh"}, ["6"]),
        ({"fuse_acts": iter(["silu"])}, ["0"]),
        ({"fuse_acts": False}, []),
        ({"fuse_acts": ()}, []),
        ({"fuse_silu": False}, ["2", "4", "6"]),  # SiLU out of the default
        ({"fuse_silu": False, "fuse_acts": True}, ["2", "4", "6"]),
        ({"fuse_silu": False, "fuse_acts": ["silu", "relu"]}, ["2"]),
    ],
)
def test_fuse_acts_picks_the_activations(kwargs: dict, fused: list[str]):
    model = randomize(all_acts_model())
    ref = copy.deepcopy(model)
    model, report = convert_groupnorm(model, **kwargs)
    assert len(report.swapped) == 4 and report.fused == fused
    assert [model[int(k)].act for k in fused] == [act_of_module(ref[int(k) + 1]) for k in fused]
    assert sum(isinstance(m, ActSlot) for m in model) == len(fused)
    x = torch.randn(2, 4, 7)
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)
    # A second conversion with SiLU fuses it if the first left it; the default then fuses the rest.
    model, again = convert_groupnorm(model, fuse_acts="silu")
    assert again.fused == ([] if "0" in fused else ["0"]) and len(again.already) == 4
    model, rest = convert_groupnorm(model)
    assert sorted(again.fused + rest.fused + fused) == ["0", "2", "4", "6"] and len(rest.already) == 4
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)


def test_default_fuses_every_act_and_silu_only_leaves_the_others():
    assert DEFAULT_FUSE_ACTS == FUSABLE_ACTS
    for fn in (convert_groupnorm, check_options, resolve_fuse_acts):
        assert inspect.signature(fn).parameters["fuse_acts"].default is DEFAULT_FUSE_ACTS, fn.__name__
    assert resolve_fuse_acts() == resolve_fuse_acts(True) == frozenset(FUSABLE_ACTS)
    assert resolve_fuse_acts("silu") == frozenset({"silu"})

    # fuse_acts="silu", nn.Sequential GroupNorm -> ReLU: the GroupNorm is swapped, the ReLU stays as it is;
    # the SiLU fuses.
    model = randomize(
        nn.Sequential(nn.Conv2d(4, 4, 1), nn.GroupNorm(2, 4), nn.ReLU(), nn.GroupNorm(2, 4), nn.SiLU())
    )
    ref, relu = copy.deepcopy(model), model[2]
    model, report = convert_groupnorm(model, fuse_acts="silu")
    assert report.swapped == ["1", "3"] and report.fused == ["3"] and report.skipped == {}
    assert isinstance(model[1], gn_module.GroupNorm) and model[1].act is None and model[2] is relu
    assert model[3].act == "silu" and isinstance(model[4], SiLUSlot)
    x = torch.randn(2, 4, 5, 3)
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)
    model, report = convert_groupnorm(model)  # the default fuses the ReLU
    assert report.fused == ["1"] and model[1].act == "relu" and isinstance(model[2], ActSlot)
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)

    # timm GroupNormAct under fuse_acts="silu": with ReLU or GELU skipped (left as it is), the reason
    # saying so; with SiLU swapped and fused.
    act_cls = timm_like("GroupNormAct", "timm.layers.norm_act")
    layers = {"relu": nn.ReLU(inplace=True), "gelu": nn.GELU(approximate="tanh"), "silu": nn.SiLU()}
    timm_model = randomize(nn.ModuleDict({k: act_cls(2, 4, act) for k, act in layers.items()}))
    ref, kept = copy.deepcopy(timm_model), dict(timm_model.named_modules())
    timm_model, report = convert_groupnorm(timm_model, fuse_acts="silu")
    assert report.swapped == ["silu"] and report.fused == ["silu"] and timm_model["silu"].act == "silu"
    assert sorted(report.skipped) == ["gelu", "relu"]
    assert report.skipped["relu"] == "its activation is 'relu', which fuse_acts excludes (fused: silu)"
    assert report.skipped["gelu"] == "its activation is 'gelu_tanh', which fuse_acts excludes (fused: silu)"
    assert "skipped relu: its activation is 'relu'" in str(report)
    for key in ("relu", "gelu"):
        assert timm_model[key] is kept[key] and type(timm_model[key]) is act_cls
        assert timm_model[key].act is kept[f"{key}.act"]
    for key in timm_model:
        torch.testing.assert_close(timm_model[key](x), ref[key](x), rtol=0, atol=0, msg=key)
    timm_model, report = convert_groupnorm(timm_model)
    assert sorted(report.fused) == ["gelu", "relu"] and report.already == ["silu"] and report.skipped == {}
    assert timm_model["relu"].act == "relu" and timm_model["gelu"].act == "gelu_tanh"


def test_fuse_acts_bad_values():
    with pytest.raises(ValueError, match=r"convert_groupnorm\(\): fuse_acts must be True, False, or names"):
        convert_groupnorm(block(), fuse_acts=("tanh",))
    with pytest.raises(ValueError, match="'identity'"):
        convert_groupnorm(block(), fuse_acts=["identity"])  # no activation: nothing to fuse
    with pytest.raises(ValueError, match="None"):
        convert_groupnorm(block(), fuse_acts=[None])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"fuse_acts must be True, False, or names .* got int 5"):
        convert_groupnorm(block(), fuse_acts=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fuse_silu must be True or False"):
        convert_groupnorm(block(), fuse_silu="no")  # type: ignore[arg-type]


def test_in_place_conversion_fuses_relu_and_reverts():
    model = randomize(nn.Sequential(nn.Conv2d(4, 4, 1), nn.GroupNorm(2, 4), nn.ReLU(inplace=True)))
    ref = copy.deepcopy(model)
    norm, relu = model[1], model[2]
    model, report = convert_groupnorm(model, in_place=True, fuse_acts=True)
    assert model[1] is norm and type(norm) is gn_module.GroupNorm and norm.act == "relu"
    assert report.fused == ["1"] and isinstance(model[2], ActSlot)
    x = torch.randn(2, 4, 3, 3)
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)
    model, report = revert_groupnorm(model)
    assert model[1] is norm and type(norm) is nn.GroupNorm and model[2] is relu and report.skipped == {}
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)


def test_act_slots_pickle_and_old_silu_slots_still_revert():
    model, _ = convert_groupnorm(randomize(all_acts_model()), fuse_acts=True)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert [m.act for m in loaded if isinstance(m, ActSlot)] == ["silu", "relu", "gelu", "gelu_tanh"]
    loaded, report = revert_groupnorm(loaded)
    assert len(report.fused) == 4 and [type(m) for m in loaded] == [type(m) for m in all_acts_model()]
    assert loaded[7].approximate == "tanh"

    # A SiLUSlot pickled before slots had `act` (its instance dict has none): the class default.
    old = nn.Sequential(gn_module.GroupNorm(2, 4, act="silu"), SiLUSlot())
    del old[1].__dict__["act"]
    buf = io.BytesIO()
    torch.save(old, buf)
    buf.seek(0)
    old = torch.load(buf, weights_only=False)
    assert old[1].act == "silu"
    old, report = revert_groupnorm(old)
    assert report.fused == ["0"] and type(old[1]) is nn.SiLU and type(old[0]) is nn.GroupNorm

    # Slots built without their module revert to a default module of their activation.
    bare = nn.Sequential(gn_module.GroupNorm(2, 4, act="gelu_tanh"), ActSlot(act="gelu_tanh"))
    bare, _ = revert_groupnorm(bare)
    assert type(bare[1]) is nn.GELU and bare[1].approximate == "tanh"
    with pytest.raises(ValueError, match="ActSlot: act must be one of"):
        ActSlot(nn.LeakyReLU())


def test_timm_groupnormact_every_act_fused_and_reverted_bitwise():
    act_cls = timm_like("GroupNormAct", "timm.layers.norm_act")
    gn1_cls = timm_like("GroupNorm1Act", "timm.layers.norm_act")
    layers = {key.replace("-", "_"): act_cls(2, 4, make()) for key, (make, _) in ACT_MODULES.items()}
    layers["gn1_relu"] = gn1_cls(1, 4, nn.ReLU(inplace=True))
    model = randomize(nn.ModuleDict(layers))
    ref = copy.deepcopy(model)
    originals = dict(model.named_modules())
    model, report = convert_groupnorm(model, fuse_acts=True)
    assert sorted(report.swapped) == sorted(report.fused) == sorted(layers) and report.skipped == {}
    for key, (_, act) in ACT_MODULES.items():
        assert model[key.replace("-", "_")].act == act
    assert model["gn1_relu"].act == "relu"
    x = torch.randn(2, 4, 5)
    for key in model:
        torch.testing.assert_close(model[key](x), ref[key](x), rtol=0, atol=0, msg=key)
    model, report = revert_groupnorm(model)
    assert sorted(report.swapped) == sorted(layers) and report.skipped == {}
    now = dict(model.named_modules())
    assert now.keys() == originals.keys() and all(now[n] is originals[n] for n in now)
    for key in model:
        torch.testing.assert_close(model[key](x), ref[key](x), rtol=0, atol=0, msg=key)


TIMM_SCRIPT = r"""
import copy, json, sys
from collections import Counter

sys.path.insert(0, sys.argv[1])
try:
    import torchvision  # noqa: F401
except ImportError:
    import fake_torchvision

    fake_torchvision.install()
import timm
import timm.layers
import torch
from torch import nn

import gn_module

torch.manual_seed(0)


def silu_only(model):
    _, report = gn_module.convert_groupnorm(copy.deepcopy(model), fuse_acts="silu")
    return {"summary": report.summary(), "reasons": sorted(set(report.skipped.values()))}


def check(model, x):
    ref = copy.deepcopy(model)
    originals = dict(model.named_modules())
    model, report = gn_module.convert_groupnorm(model)  # fuse_acts left at its default: every act
    acts = Counter(str(m.act) for m in model.modules() if isinstance(m, gn_module.GroupNorm))
    y, y_ref = model(x), ref(x)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    grads = [(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters(), strict=True)]
    model, back = gn_module.revert_groupnorm(model)
    now = dict(model.named_modules())
    return {
        "summary": report.summary(), "acts": dict(acts), "skipped": report.skipped,
        "y_equal": torch.equal(y, y_ref),
        "grads_equal": all(a is not None and torch.equal(a, b) for a, b in grads),
        "reverted": back.summary(),
        "same_objects": now.keys() == originals.keys() and all(now[k] is originals[k] for k in now),
        "after_revert_equal": torch.equal(model(x), ref(x)),
    }


resnet = timm.create_model("resnetv2_50d_gn", num_classes=10)
silu = {"resnetv2_50d_gn": silu_only(resnet)}
out = {"resnetv2_50d_gn": check(resnet, torch.randn(2, 3, 64, 64))}
layers = nn.Sequential(
    *[timm.layers.GroupNormAct(8, 4, act_layer=a) for a in ("relu", "silu", "gelu", "gelu_tanh", nn.GELU)],
    timm.layers.GroupNormAct(8, 4, apply_act=False),
    timm.layers.GroupNorm1Act(8, act_layer="relu"),
    timm.layers.GroupNormAct(8, 4, act_layer="leaky_relu"),
)
silu["layers"] = silu_only(layers)
out["layers"] = check(layers, torch.randn(2, 8, 5, 5))
print("RESULT " + json.dumps({"default": out, "silu_only": silu}))
"""


def test_real_timm_models_swap_every_groupnormact(tmp_path):
    """timm itself (a fake torchvision stands in where torchvision is missing), in a subprocess so that
    no other test sees timm or the stand-in: by default resnetv2_50d_gn's 51 GroupNormAct(ReLU) are
    swapped and fused (issue 14: 0 of 51 before), as are GroupNormAct layers with every act timm builds;
    with fuse_acts="silu" the ReLU and GELU ones are skipped, the reason saying so."""
    if importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed")
    tests_dir = str(Path(__file__).resolve().parent)
    proc = subprocess.run([sys.executable, "-c", TIMM_SCRIPT, tests_dir], capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    silu = result["silu_only"]
    assert silu["resnetv2_50d_gn"]["summary"] == {"swapped": 0, "fused": 0, "already": 0, "skipped": 51}
    assert silu["resnetv2_50d_gn"]["reasons"] == [
        "its activation is 'relu', which fuse_acts excludes (fused: silu)"
    ]
    # silu and apply_act=False swapped; relu x2, gelu x2, gelu_tanh and leaky_relu skipped.
    assert silu["layers"]["summary"] == {"swapped": 2, "fused": 1, "already": 0, "skipped": 6}
    assert sum("which fuse_acts excludes" in why for why in silu["layers"]["reasons"]) == 3  # relu, gelu x2
    out = result["default"]
    resnet = out["resnetv2_50d_gn"]
    assert resnet["summary"] == {"swapped": 51, "fused": 51, "already": 0, "skipped": 0}
    assert resnet["acts"] == {"relu": 51}
    layers = out["layers"]
    assert layers["summary"] == {"swapped": 7, "fused": 6, "already": 0, "skipped": 1}
    assert layers["acts"] == {"relu": 2, "silu": 1, "gelu": 2, "gelu_tanh": 1, "None": 1}
    assert "act=LeakyReLU has no fused kernel" in layers["skipped"]["7"]
    for name, result in out.items():
        assert result["y_equal"] and result["grads_equal"], name  # torch's own path on CPU: same ops
        assert result["reverted"]["swapped"] == result["summary"]["swapped"], name
        assert result["same_objects"] and result["after_revert_equal"], name
