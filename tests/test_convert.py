"""convert_groupnorm / revert_groupnorm on the CPU (torch's native path computes the results)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import gn_module
from gn_module.convert import SiLUSlot, convert_groupnorm, revert_groupnorm


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
    model = nn.Sequential(gn_module.GroupNorm(2, 4), gn_module.GroupNorm(2, 4, act="silu"))
    model, report = revert_groupnorm(model)
    assert type(model[0]) is nn.GroupNorm and report.swapped == ["0"]
    assert "SiLUSlot" in report.skipped["1"] and isinstance(model[1], gn_module.GroupNorm)


@pytest.mark.parametrize(
    "model, why",
    [
        (nn.Sequential(nn.GroupNorm(4, 8), nn.Identity(), nn.SiLU()), "SiLU not directly after"),
        (nn.Sequential(nn.GroupNorm(4, 8), nn.ReLU()), "not a SiLU"),
        (nn.Sequential(nn.GroupNorm(4, 8), nn.GELU()), "not a SiLU"),
        (nn.ModuleList([nn.GroupNorm(4, 8), nn.SiLU()]), "ModuleList has no data flow"),
    ],
)
def test_fusion_negative_cases(model: nn.Module, why: str):
    model, report = convert_groupnorm(model)
    assert report.fused == [], why
    assert model[0].act is None and not any(isinstance(m, SiLUSlot) for m in model.modules())


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
            }
        )
    )
    ref = copy.deepcopy(model)
    model, report = convert_groupnorm(model)
    assert sorted(report.swapped) == ["gn", "ident", "silu"] and report.fused == ["silu"]
    assert model["silu"].act == "silu" and model["ident"].act is None
    assert "ReLU" in report.skipped["relu"]
    x = torch.randn(2, 4, 3)
    for key in model:
        torch.testing.assert_close(model[key](x), ref[key](x), msg=key)
    assert list(model.state_dict()) == list(ref.state_dict())
    model, _ = revert_groupnorm(model)
    assert type(model["silu"]) is act_cls and type(model["silu"].act) is nn.SiLU

    _, report = convert_groupnorm(act_cls(2, 4, nn.SiLU()), fuse_silu=False)
    assert "fuse_silu=False" in report.skipped[""]


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
