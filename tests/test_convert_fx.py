"""convert_groupnorm(fuse_calls=True): GroupNorm -> activation called inside forward, fused via torch.fx
(CPU)."""

from __future__ import annotations

import contextlib
import copy
import io
import warnings

import pytest
import torch
import torch.nn.functional as F
from model_step_helpers import assert_same_step
from torch import nn

import gn_module
from gn_module import fx_fusion
from gn_module.callback import GNSwapCallback
from gn_module.convert import convert_groupnorm, revert_groupnorm
from gn_module.fx_fusion import FusedForward


#: diffusers' get_activation names -> (module, functional form) of the block's nonlinearity.
@pytest.fixture(autouse=True)
def fresh_warnings():
    """fuse_calls warns once per module class and reason in a process: each test starts from none."""
    fx_fusion._WARNED.clear()
    yield
    fx_fusion._WARNED.clear()


ACT_FNS = {"silu": (nn.SiLU, F.silu), "relu": (nn.ReLU, F.relu), "gelu": (nn.GELU, F.gelu)}


class ResnetBlock2D(nn.Module):
    """diffusers' ResnetBlock2D, reduced: the nonlinearity is one module reused (nn.SiLU by default,
    diffusers' ``resnet_act_fn``), or its functional form (F.silu...)."""

    def __init__(
        self,
        cin: int,
        cout: int,
        temb: int | None = 16,
        functional: bool = False,
        dropout: float = 0.0,
        act_fn: str = "silu",
    ) -> None:
        super().__init__()
        self.functional = functional
        self.act_function = ACT_FNS[act_fn][1]
        self.norm1 = nn.GroupNorm(4, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb, cout) if temb is not None else None
        self.norm2 = nn.GroupNorm(4, cout)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.nonlinearity = ACT_FNS[act_fn][0]()
        self.conv_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def act(self, x: torch.Tensor) -> torch.Tensor:
        return self.act_function(x) if self.functional else self.nonlinearity(x)

    def forward(self, input_tensor: torch.Tensor, temb: torch.Tensor | None, *args, **kwargs) -> torch.Tensor:
        if len(args) > 0 or kwargs.get("scale") is not None:
            warnings.warn("scale is deprecated", FutureWarning, stacklevel=2)
        hidden_states = self.norm1(input_tensor)
        hidden_states = self.act(hidden_states)
        hidden_states = self.conv1(hidden_states)
        if self.time_emb_proj is not None:
            temb = self.act(temb)
            temb = self.time_emb_proj(temb)[:, :, None, None]
        if temb is not None:
            hidden_states = hidden_states + temb
        hidden_states = self.norm2(hidden_states)
        hidden_states = self.act(hidden_states)
        hidden_states = self.dropout(hidden_states)
        hidden_states = self.conv2(hidden_states)
        if self.conv_shortcut is not None:
            input_tensor = self.conv_shortcut(input_tensor)
        return input_tensor + hidden_states


class Attention(nn.Module):
    """A GroupNorm not followed by SiLU."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.group_norm = nn.GroupNorm(4, c)
        self.to_qkv = nn.Conv2d(c, 3 * c, 1)
        self.to_out = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q, k, v = self.to_qkv(self.group_norm(x)).flatten(2).chunk(3, dim=1)
        attn = torch.softmax(q.transpose(1, 2) @ k / c**0.5, dim=-1)
        return x + self.to_out((v @ attn.transpose(1, 2)).reshape(b, c, h, w))


class Untraceable(nn.Module):
    """Data-dependent control flow: fx cannot trace it."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(4, c)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.norm(x))
        if h.mean() > 0:
            h = h * 2
        return x + h


class TwoUsers(nn.Module):
    """The GroupNorm output feeds the SiLU and the residual: must not fuse."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(4, c)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return self.act(h) + h


class TinyUNet(nn.Module):
    def __init__(self, c: int = 8, temb: int = 16) -> None:
        super().__init__()
        self.time_mlp = nn.Sequential(nn.Linear(1, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.conv_in = nn.Conv2d(3, c, 3, padding=1)
        self.down = nn.ModuleList(
            [ResnetBlock2D(c, c), ResnetBlock2D(c, 2 * c, functional=True), ResnetBlock2D(2 * c, 2 * c)]
        )
        self.attn = Attention(2 * c)
        self.odd = Untraceable(2 * c)
        self.conv_norm_out = nn.GroupNorm(4, 2 * c)
        self.conv_act = nn.SiLU()
        self.conv_out = nn.Conv2d(2 * c, 3, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        temb = self.time_mlp(t[:, None])
        h = self.conv_in(x)
        for block in self.down:
            h = block(h, temb)
        h = self.odd(self.attn(h))
        h = self.conv_norm_out(h)
        h = self.conv_act(h)
        return self.conv_out(h)


FUSED_UNET = [
    "conv_norm_out",
    "down.0.norm1",
    "down.0.norm2",
    "down.1.norm1",
    "down.1.norm2",
    "down.2.norm1",
    "down.2.norm2",
]


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=gen) * 2 - 1)
    return model


def unet_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(2, 3, 6, 6, generator=gen), torch.rand(2, generator=gen)


def converted_unet(**kwargs: object):
    model = randomize(TinyUNet())
    ref = copy.deepcopy(model)
    params = dict(model.named_parameters())
    model, report = convert_groupnorm(model, fuse_calls=True, **kwargs)
    return ref, model, report, params


@pytest.mark.parametrize("act_fn", list(ACT_FNS))
@pytest.mark.parametrize("functional", [False, True], ids=["module", "functional"])
def test_resnet_block_fuses_both_norms(functional: bool, act_fn: str):
    block = randomize(ResnetBlock2D(8, 16, functional=functional, act_fn=act_fn))
    ref = copy.deepcopy(block)
    block, report = convert_groupnorm(block, fuse_calls=True, fuse_acts=True)
    assert report.fused == ["norm1", "norm2"] and report.rewritten == [""]
    assert report.summary() == {"swapped": 2, "fused": 2, "already": 0, "skipped": 0}
    assert block.norm1.act == act_fn and block.norm2.act == act_fn
    assert isinstance(vars(block)["forward"], FusedForward) and block.forward.acts == (act_fn, act_fn)
    # The activation on the time embedding stays: only the two after a GroupNorm went.
    calls = block.forward.code.count("self.nonlinearity(" if not functional else f"{act_fn}(")
    assert calls == 1
    x, temb = torch.randn(2, 8, 5, 5), torch.randn(2, 16)
    torch.testing.assert_close(block(x, temb), ref(x, temb), rtol=0, atol=0)  # torch's ops on CPU
    block, report = revert_groupnorm(block)
    assert report.fused == ["norm1", "norm2"] and "forward" not in vars(block)
    assert type(block.norm1) is nn.GroupNorm and type(block.nonlinearity) is type(ref.nonlinearity)
    torch.testing.assert_close(block(x, temb), ref(x, temb), rtol=0, atol=0)


def test_unet_counts_outputs_and_gradients():
    ref, model, report, params = converted_unet()
    assert sorted(report.fused) == FUSED_UNET  # 2 per resnet block + conv_norm_out/conv_act
    assert sorted(report.rewritten) == ["", "down.0", "down.1", "down.2"]
    assert report.summary()["swapped"] == 9
    assert "forward not traced for activation fusion (TraceError" in report.skipped["odd"]
    assert model.attn.group_norm.act is None and "forward" not in vars(model.attn)  # no SiLU after it
    assert model.odd.norm.act is None and "forward" not in vars(model.odd)  # left working, unfused
    assert "swapped 9, fused 7, already 0, skipped 1, forwards rewritten 4" in str(report)
    # Same Parameter objects under the same names.
    assert dict(model.named_parameters()).keys() == params.keys()
    assert all(p is params[n] for n, p in model.named_parameters())
    x, t = unet_inputs()
    for train in (True, False):
        model.train(train), ref.train(train)
        torch.testing.assert_close(model(x, t), ref(x, t))
    model.train(), ref.train()
    model(x, t).square().sum().backward()
    ref(x, t).square().sum().backward()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=n)


def test_without_the_option_nothing_changes():
    model = randomize(TinyUNet())
    model, report = convert_groupnorm(model)
    assert report.fused == [] and report.rewritten == []
    assert report.summary() == {"swapped": 9, "fused": 0, "already": 0, "skipped": 0}
    assert not any("forward" in vars(m) for m in model.modules())
    assert not any(isinstance(m, gn_module.GroupNorm) and m.act for m in model.modules())


def test_state_dict_keys_unchanged_and_load_both_ways_strict():
    ref, model, _, _ = converted_unet()
    sd_ref, sd = ref.state_dict(), model.state_dict()
    assert list(sd) == list(sd_ref)
    for key in sd:
        torch.testing.assert_close(sd[key], sd_ref[key], rtol=0, atol=0)
    plain = randomize(TinyUNet(), seed=3)
    plain.load_state_dict(sd, strict=True)
    other = randomize(TinyUNet(), seed=4)
    model.load_state_dict(other.state_dict(), strict=True)
    x, t = unet_inputs()
    torch.testing.assert_close(model(x, t), other(x, t))
    torch.testing.assert_close(plain(x, t), ref(x, t), rtol=0, atol=0)


def test_forward_uses_parameters_assigned_after_conversion():
    # The graph runs with the module itself as `self`: load_state_dict(assign=True) is seen.
    _, model, _, _ = converted_unet()
    other = randomize(TinyUNet(), seed=5)
    model.load_state_dict(other.state_dict(), assign=True)
    x, t = unet_inputs()
    torch.testing.assert_close(model(x, t), other(x, t))


def test_revert_restores_original_objects_and_forward_bitwise():
    model = randomize(TinyUNet())
    originals = dict(model.named_modules())
    ref = copy.deepcopy(model)
    model, _ = convert_groupnorm(model, fuse_calls=True)
    model, report = revert_groupnorm(model)
    assert sorted(report.fused) == FUSED_UNET
    assert sorted(report.rewritten) == ["", "down.0", "down.1", "down.2"]
    assert "forwards restored 4" in str(report)
    now = dict(model.named_modules())
    assert now.keys() == originals.keys() and all(now[n] is originals[n] for n in now)
    assert not any("forward" in vars(m) or isinstance(m, gn_module.GroupNorm) for m in model.modules())
    x, t = unet_inputs()
    torch.testing.assert_close(model(x, t), ref(x, t), rtol=0, atol=0)
    assert list(model.state_dict()) == list(ref.state_dict())


def test_two_users_not_fused():
    model = randomize(TwoUsers(8))
    ref = copy.deepcopy(model)
    model, report = convert_groupnorm(model, fuse_calls=True)
    assert report.swapped == ["norm"] and report.fused == [] and report.rewritten == []
    assert report.skipped["norm+act"] == "not fused: the GroupNorm output is also used elsewhere in forward"
    assert model.norm.act is None and "forward" not in vars(model)
    x = torch.randn(2, 8, 3, 3)
    torch.testing.assert_close(model(x), ref(x))


def test_untraceable_block_reported_and_left_working():
    model = randomize(nn.Sequential(Untraceable(8), ResnetBlock2D(8, 8, temb=None)))

    class Wrap(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner[1](self.inner[0](x), None)

    wrapped = Wrap()
    ref = copy.deepcopy(wrapped)
    wrapped, report = convert_groupnorm(wrapped, fuse_calls=True)
    assert "TraceError" in report.skipped["inner.0"] and "control flow" in report.skipped["inner.0"]
    # One untraceable module does not stop the others.
    assert report.fused == ["inner.1.norm1", "inner.1.norm2"]
    x = torch.randn(2, 8, 4, 4)
    torch.testing.assert_close(wrapped(x), ref(x))


def acts_seen(block: nn.Module) -> list[str | None]:
    """Record each GroupNorm's act as it is called (None: the call ran unfused)."""
    seen: list[str | None] = []
    for norm in (block.norm1, block.norm2):
        norm.register_forward_pre_hook(lambda m, args: seen.append(m.act))
    return seen


def test_a_vae_block_called_with_temb_none_runs_fused():
    block = randomize(ResnetBlock2D(8, 8, temb=None))  # VAE-style: temb is None
    ref = copy.deepcopy(block)
    block, report = convert_groupnorm(block, fuse_calls=True)
    assert report.fused == ["norm1", "norm2"]
    assert set(vars(block)["forward"].none_variants) == {frozenset({"temb"})}
    seen = acts_seen(block)  # (hooks added after conversion: they only watch)
    x = torch.randn(2, 8, 4, 4)
    # traced again with temb=None, where `temb is not None` is False: the fused graph of that call
    torch.testing.assert_close(block(x, None), ref(x, None), rtol=0, atol=0)
    assert seen == ["silu", "silu"]
    temb = torch.randn(2, 8, 1, 1)
    torch.testing.assert_close(block(x, temb), ref(x, temb), rtol=0, atol=0)  # the proxy trace's graph
    assert seen[2:] == ["silu", "silu"]
    with pytest.warns(FutureWarning), pytest.warns(RuntimeWarning, match="extra arguments"):
        torch.testing.assert_close(block(x, temb, scale=1.0), ref(x, temb))  # the original forward, unfused
    assert seen[4:] == [None, None] and block.norm1.act == "silu"  # fused again after the call
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # once per class and reason
        block(x, temb, scale=1.0)
    with pytest.raises(TypeError):  # the original forward's own error
        block()


def test_a_vae_block_with_temb_none_runs_fused_under_dynamo():
    block = randomize(ResnetBlock2D(8, 8, temb=None))
    ref = copy.deepcopy(block)
    block, _ = convert_groupnorm(block, fuse_calls=True)
    seen = acts_seen(block)
    x = torch.randn(2, 8, 4, 4)
    torch._dynamo.reset()
    compiled = torch.compile(block, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, None), ref(x, None), rtol=0, atol=0)
    assert seen and set(seen) == {"silu"}


class NoneUsed(nn.Module):
    """``b`` is read as a tensor whatever it is: traced as None, it raises."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2, self.act = nn.GroupNorm(2, 4), nn.GroupNorm(2, 4), nn.SiLU()

    def forward(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        return self.act(self.norm1(x)) + b.mean() + self.norm2(x)


class NoneChangesTheFusion(nn.Module):
    """With ``t`` None, norm1's output goes to the conv without its activation: a None trace would fuse
    other pairs than the proxy trace, so it is not kept."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2, self.act = nn.GroupNorm(2, 4), nn.GroupNorm(2, 4), nn.SiLU()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor | None) -> torch.Tensor:
        h = self.norm1(x)
        if t is None:
            return self.conv(h) + self.norm2(x)
        return self.conv(self.act(h)) + t + self.act(self.norm2(x))


def test_none_traces_that_fail_or_fuse_differently_are_not_kept():
    x, t = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3)
    for cls in (NoneUsed, NoneChangesTheFusion):
        block = randomize(cls())
        ref = copy.deepcopy(block)
        block, report = convert_groupnorm(block, fuse_calls=True)
        assert report.fused == (["norm1"] if cls is NoneUsed else ["norm1", "norm2"])
        assert vars(block)["forward"].none_variants == {}
        torch.testing.assert_close(block(x, t), ref(x, t), rtol=0, atol=0)
        with pytest.warns(
            RuntimeWarning, match=rf"{cls.__name__}.forward call ran unfused \(\w None, a call no"
        ):
            if cls is NoneUsed:
                with pytest.raises(AttributeError):  # the original forward's own error
                    block(x, None)
            else:  # the original forward, unfused: norm1 without its activation
                torch.testing.assert_close(block(x, None), ref(x, None), rtol=0, atol=0)
        assert block.norm1.act == "silu"


class TwoOptional(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2, self.act = nn.GroupNorm(2, 4), nn.GroupNorm(2, 4), nn.SiLU()

    def forward(self, x: torch.Tensor, a: torch.Tensor | None, b: torch.Tensor | None) -> torch.Tensor:
        h = self.act(self.norm1(x))
        if a is not None:
            h = h + a
        h = self.act(self.norm2(h))
        return h if b is None else h * b


def test_each_optional_parameter_none_alone_and_all_together():
    block = randomize(TwoOptional())
    ref = copy.deepcopy(block)
    block, report = convert_groupnorm(block, fuse_calls=True)
    assert report.fused == ["norm1", "norm2"]
    variants = vars(block)["forward"].none_variants
    assert set(variants) == {frozenset({"a"}), frozenset({"b"}), frozenset({"a", "b"})}
    seen = acts_seen(block)
    x, a, b = (torch.randn(2, 4, 3, 3) for _ in range(3))
    for args in ((x, a, b), (x, None, b), (x, a, None), (x, None, None)):
        torch.testing.assert_close(block(*args), ref(*args), rtol=0, atol=0)
    assert set(seen) == {"silu"} and len(seen) == 8
    copied = copy.deepcopy(block)  # the variants travel with deepcopy and pickle
    assert set(vars(copied)["forward"].none_variants) == set(variants)
    torch.testing.assert_close(copied(x, None, None), ref(x, None, None), rtol=0, atol=0)


def test_parameter_with_default_is_traced_at_its_default():
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.GroupNorm(2, 4)

        def forward(self, x: torch.Tensor, scale: float = 1.0, double: bool = False) -> torch.Tensor:
            h = F.silu(self.norm(x)) * scale
            return h * 2 if double else h

    model = randomize(Scaled())
    ref = copy.deepcopy(model)
    model, report = convert_groupnorm(model, fuse_calls=True)
    assert report.fused == ["norm"]
    x = torch.randn(2, 4, 3)
    for kwargs in ({}, {"scale": 1.0}, {"scale": 3.0}, {"double": True}, {"double": False}):
        traced = all(kwargs.get(k, v) == v for k, v in (("scale", 1.0), ("double", False)))
        with contextlib.nullcontext() if traced else pytest.warns(RuntimeWarning, match="not its default"):
            torch.testing.assert_close(model(x, **kwargs), ref(x, **kwargs), msg=str(kwargs))


class Drop(nn.Module):
    """A forward that reads self.training: fx freezes the branch, so each mode gets its graph."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(F.silu(self.norm(x)), 0.5, training=self.training)


class ShortcutBlock(nn.Module):
    """diffusers 0.42's ResnetBlock2D where it has a shortcut: ``input_tensor.contiguous()`` only in
    train mode (diffusers issue 12975), so its train and eval traces differ."""

    def __init__(self, cin: int = 4, cout: int = 8) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(2, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(2, cout)
        self.nonlinearity = nn.SiLU()
        self.conv_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, input_tensor: torch.Tensor) -> torch.Tensor:
        h = self.conv1(self.nonlinearity(self.norm1(input_tensor)))
        h = self.nonlinearity(self.norm2(h))
        if self.training:
            input_tensor = input_tensor.contiguous()
        return self.conv_shortcut(input_tensor) + h


def test_forward_reading_training_fuses_with_a_graph_per_mode():
    torch.manual_seed(0)
    model = Drop()
    ref = copy.deepcopy(model)
    model, report = convert_groupnorm(model, fuse_calls=True)
    assert report.fused == ["norm"] and report.rewritten == [""] and report.skipped == {}
    assert model.training and model.norm.training  # modes put back after tracing both
    assert "training = True" in model.forward.code and "F.silu" not in model.forward.code
    x = torch.randn(2, 4, 6, requires_grad=True)
    for mode in (True, False, True):  # the graph follows the mode set after the conversion
        model.train(mode)
        ref.train(mode)
        assert f"training = {mode}" in model.forward.code
        torch.manual_seed(1)
        out = model(x)
        (gx,) = torch.autograd.grad(out.sum(), x)
        torch.manual_seed(1)
        want = ref(x)
        (gx_want,) = torch.autograd.grad(want.sum(), x)
        torch.testing.assert_close(out, want, rtol=0, atol=0, msg=f"training={mode}")
        torch.testing.assert_close(gx, gx_want, rtol=0, atol=0, msg=f"training={mode}")
    for other in (copy.deepcopy(model), torch.load(_saved(model), weights_only=False)):
        other.eval()
        assert "training = False" in other.forward.code
        torch.testing.assert_close(other(x), ref.eval()(x), rtol=0, atol=0)
    model, report = revert_groupnorm(model)
    assert report.fused == ["norm"] and "forward" not in vars(model)


def _saved(model: nn.Module) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return buf


def test_diffusers_shortcut_block_fuses_both_norms_in_both_modes():
    block = randomize(ShortcutBlock())
    ref = copy.deepcopy(block)
    block.eval()  # converted in eval mode: the other mode's graph is traced all the same
    block, report = convert_groupnorm(block, fuse_calls=True)
    assert report.fused == ["norm1", "norm2"] and report.summary()["fused"] == 2
    assert not block.training and "contiguous" not in block.forward.code
    x = torch.randn(2, 4, 5, 5).to(memory_format=torch.channels_last)
    for mode in (False, True):
        block.train(mode)
        ref.train(mode)
        assert ("contiguous" in block.forward.code) == mode
        out = block(x)
        torch.testing.assert_close(out, ref(x), rtol=0, atol=0, msg=f"training={mode}")


def test_modes_that_fuse_different_norms_are_not_rewritten():
    class EvalReadsTwice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.GroupNorm(2, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.norm(x)
            return F.silu(h) if self.training else F.silu(h) + h

    model, report = convert_groupnorm(EvalReadsTwice(), fuse_calls=True)
    assert report.fused == [] and report.rewritten == []
    assert "self.training" in report.skipped[""] and "forward" not in vars(model)
    assert model.norm.act is None


def test_dropout_module_in_train_mode_matches_with_same_seed():
    block = randomize(ResnetBlock2D(8, 8, dropout=0.5))
    ref = copy.deepcopy(block)
    block, report = convert_groupnorm(block, fuse_calls=True)
    assert report.fused == ["norm1", "norm2"]
    x, temb = torch.randn(2, 8, 4, 4), torch.randn(2, 16)
    torch.manual_seed(0)
    out = block(x, temb)
    torch.manual_seed(0)
    torch.testing.assert_close(out, ref(x, temb))


def test_norm_called_twice_or_shared_or_hooked_is_not_fused():
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.GroupNorm(2, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.silu(self.norm(x)) + self.norm(x * 2)

    class Pair(nn.Module):
        def __init__(self, norm: nn.Module) -> None:
            super().__init__()
            self.norm = norm

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.silu(self.norm(x))

    _, report = convert_groupnorm(Twice(), fuse_calls=True)
    assert report.fused == [] and "also used elsewhere" in report.skipped["norm+F.silu"]

    shared = nn.GroupNorm(2, 4)
    model = nn.ModuleDict({"a": Pair(shared), "b": nn.Sequential(shared)})
    _, report = convert_groupnorm(model, fuse_calls=True)
    assert report.fused == [] and "also used elsewhere" in report.skipped["a.norm+F.silu"]

    hooked = Pair(nn.GroupNorm(2, 4))
    hooked.norm.register_forward_hook(lambda *args: None)
    _, report = convert_groupnorm(hooked, fuse_calls=True)
    assert report.fused == [] and "hooks" in report.skipped["norm+F.silu"]


def test_tensor_constants_refused_and_module_left_clean():
    class Const(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.GroupNorm(2, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.silu(self.norm(x)) * torch.tensor(2.0)

    model = Const()
    keys = set(vars(model))
    model, report = convert_groupnorm(model, fuse_calls=True)
    assert report.fused == [] and "tensor constants" in report.skipped[""]
    assert set(vars(model)) == keys


def test_idempotent_deepcopy_and_pickle():
    ref, model, _, _ = converted_unet()
    forwards = {n: vars(m)["forward"] for n, m in model.named_modules() if "forward" in vars(m)}
    model, second = convert_groupnorm(model, fuse_calls=True)
    assert second.fused == [] and second.rewritten == [] and second.swapped == []
    assert {n: vars(m)["forward"] for n, m in model.named_modules() if "forward" in vars(m)} == forwards
    x, t = unet_inputs()
    clone = copy.deepcopy(model)
    assert clone.forward.module is clone and clone.down[0].forward.module is clone.down[0]
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for other in (clone, loaded):
        torch.testing.assert_close(other(x, t), ref(x, t))
        other, report = revert_groupnorm(other)
        assert sorted(report.fused) == FUSED_UNET
        torch.testing.assert_close(other(x, t), ref(x, t), rtol=0, atol=0)
    assert model.down[0].norm1.act == "silu"  # the copies reverted on their own


def test_in_place_conversion_and_revert():
    ref, model, report, _ = converted_unet(in_place=True)
    assert sorted(report.fused) == FUSED_UNET
    norms = {n: m for n, m in model.named_modules() if isinstance(m, nn.GroupNorm)}
    x, t = unet_inputs()
    torch.testing.assert_close(model(x, t), ref(x, t))
    model, report = revert_groupnorm(model)
    assert len(report.swapped) == 9 and report.skipped == {}
    assert all(type(m) is nn.GroupNorm and m is norms[n] for n, m in model.named_modules() if n in norms)
    torch.testing.assert_close(model(x, t), ref(x, t), rtol=0, atol=0)


def test_option_checks():
    with pytest.raises(ValueError, match="fuse_calls=True fuses activations, but fuse_acts leaves none"):
        convert_groupnorm(TinyUNet(), fuse_acts=False, fuse_calls=True)
    with pytest.raises(ValueError, match="fuse_silu=False and fuse_acts leave none"):
        convert_groupnorm(TinyUNet(), fuse_silu=False, fuse_acts="silu", fuse_calls=True)
    with pytest.raises(TypeError, match="fuse_calls must be True or False"):
        convert_groupnorm(TinyUNet(), fuse_calls="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"GNSwapCallback\(\): fuse_calls must be True or False"):
        GNSwapCallback(fuse_calls=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"GNSwapCallback\(\): fuse_calls=True"):
        GNSwapCallback(fuse_acts=(), fuse_calls=True)
    with pytest.raises(ValueError, match=r"GNSwapCallback\(\): fuse_acts must be"):
        GNSwapCallback(fuse_acts=["swish"])
    # fuse_silu=False takes SiLU out of fuse_acts="silu": nothing is left to fuse.
    with pytest.raises(ValueError, match="fuse_silu=False and fuse_acts leave none"):
        convert_groupnorm(TinyUNet(), fuse_silu=False, fuse_acts="silu", fuse_calls=True)
    with pytest.raises(ValueError, match=r"GNSwapCallback\(\): fuse_calls=True .* fuse_silu=False"):
        GNSwapCallback(fuse_silu=False, fuse_acts=["silu"], fuse_calls=True)
    # fuse_silu=False with the default leaves ReLU and GELU to fuse: the UNet's SiLU calls stay.
    _, report = convert_groupnorm(TinyUNet(), fuse_silu=False, fuse_calls=True)
    assert report.fused == [] and report.rewritten == [] and len(report.swapped) == 9


def test_callback_passes_fuse_calls(tmp_path):
    from lightning.pytorch import LightningModule, Trainer
    from torch.utils.data import DataLoader, TensorDataset

    class Lit(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.unet = TinyUNet()

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            (x,) = batch
            return (self.unet(x, torch.zeros(len(x))) - x).square().mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> DataLoader:
            return DataLoader(TensorDataset(torch.randn(4, 3, 6, 6)), batch_size=2)

    def fit(callback: GNSwapCallback) -> Lit:
        model = Lit()
        options = {"accelerator": "cpu", "logger": False, "enable_checkpointing": False}
        options |= {"enable_progress_bar": False, "enable_model_summary": False, "fast_dev_run": True}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            Trainer(callbacks=[callback], default_root_dir=tmp_path, **options).fit(model)
        return model

    callback = GNSwapCallback(fuse_calls=True)
    model = fit(callback)
    assert sorted(callback.report.fused) == [f"unet.{n}" for n in FUSED_UNET]
    assert isinstance(vars(model.unet.down[0])["forward"], FusedForward)

    callback = GNSwapCallback(fuse_calls=True, restore_on_teardown=True)
    model = fit(callback)
    assert len(callback.report.fused) == 7
    assert not any("forward" in vars(m) or isinstance(m, gn_module.GroupNorm) for m in model.modules())

    callback = GNSwapCallback()
    fit(callback)
    assert callback.report.fused == []


class TimestepNet(nn.Module):
    """Like diffusers' UNet2DModel.forward: a type test on an alias of an argument."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(2, 4)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor, timestep: object) -> torch.Tensor:
        steps = timestep
        if not torch.is_tensor(steps):
            steps = torch.tensor([steps], dtype=torch.float32)
        return self.act(self.norm(x)) + steps.float().reshape(-1, 1, 1, 1)


def test_forward_with_type_tests_is_not_traced() -> None:
    torch.manual_seed(0)
    ref = TimestepNet()
    model, report = convert_groupnorm(copy.deepcopy(ref), fuse_calls=True)
    assert report.fused == [] and "tests types (is_tensor)" in report.skipped[""]
    x = torch.randn(2, 4, 3, 3)
    for t in (torch.tensor([3.0, 5.0]), 4):  # both branches still work
        torch.testing.assert_close(model(x, t), ref(x, t))


class EveryCall(nn.Module):
    """One GroupNorm per way of calling an activation on its output."""

    def __init__(self, c: int = 4) -> None:
        super().__init__()
        self.norms = nn.ModuleList([nn.GroupNorm(2, c) for _ in range(len(EVERY_CALL))])
        self.gelu = nn.GELU()
        self.gelu_tanh = nn.GELU(approximate="tanh")
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.norms
        h = F.relu(n[0](x), inplace=True)
        h = torch.relu(n[1](h)) + x
        h = n[2](h).relu_()
        h = n[3](h).relu() - x
        h = F.relu_(n[4](h))
        h = F.gelu(n[5](h), approximate="tanh")
        h = F.gelu(n[6](h)) * 2
        h = self.gelu(n[7](h))
        h = self.gelu_tanh(n[8](h))
        h = self.relu(n[9](h)) + x
        h = F.silu(n[10](h))
        return F.gelu(n[11](h), approximate="none")


#: (act, how the skipped key names the call) of each of EveryCall's norms, in order.
EVERY_CALL = [
    ("relu", "F.relu"), ("relu", "torch.relu"), ("relu", "Tensor.relu_"), ("relu", "Tensor.relu"),
    ("relu", "torch.relu_"), ("gelu_tanh", "F.gelu"), ("gelu", "F.gelu"), ("gelu", "gelu"),
    ("gelu_tanh", "gelu_tanh"), ("relu", "relu"), ("silu", "F.silu"), ("gelu", "F.gelu"),
]  # fmt: skip


def test_every_activation_call_fuses_outputs_gradients_and_revert_are_bitwise():
    model = randomize(EveryCall())
    ref = copy.deepcopy(model)
    originals = dict(model.named_modules())
    model, report = convert_groupnorm(model, fuse_calls=True, fuse_acts=True)
    assert report.fused == [f"norms.{i}" for i in range(len(EVERY_CALL))] and report.rewritten == [""]
    assert [norm.act for norm in model.norms] == [act for act, _ in EVERY_CALL]
    assert model.forward.acts == tuple(act for act, _ in EVERY_CALL)
    code = model.forward.code
    assert not any(call in code for call in ("relu", "gelu", "silu")), code
    x = torch.randn(2, 4, 3, 5)
    assert_same_step(model, ref, x)
    model, report = revert_groupnorm(model)
    assert len(report.fused) == len(EVERY_CALL) and report.rewritten == [""]
    now = dict(model.named_modules())
    assert now.keys() == originals.keys() and all(now[n] is originals[n] for n in now)
    assert "forward" not in vars(model) and model.relu.inplace
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)


def test_fuse_acts_limits_the_calls_fused():
    model, report = convert_groupnorm(
        randomize(EveryCall()), fuse_calls=True, fuse_acts=("gelu_tanh", "silu")
    )
    assert report.fused == ["norms.5", "norms.8", "norms.10"] and report.skipped == {}
    assert [norm.act for norm in model.norms] == [None] * 5 + ["gelu_tanh", None, None, "gelu_tanh", None,
                                                               "silu", None]  # fmt: skip


def test_silu_only_fuses_only_silu_calls():
    """fuse_acts="silu": of EveryCall's activation calls only F.silu is fused; the ReLU and GELU calls
    stay in the graph."""
    model = randomize(EveryCall())
    ref = copy.deepcopy(model)
    model, report = convert_groupnorm(model, fuse_calls=True, fuse_acts="silu")
    assert report.fused == ["norms.10"] and report.rewritten == [""] and report.skipped == {}
    assert len(report.swapped) == len(EVERY_CALL)
    assert [norm.act for norm in model.norms] == [None] * 10 + ["silu", None]
    assert model.forward.acts == ("silu",)
    code = model.forward.code
    assert "silu" not in code and "relu" in code and "gelu" in code, code
    x = torch.randn(2, 4, 3, 5)
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)
    # A diffusers-style block with ReLU: both GroupNorms swapped, neither fused, forward not rewritten.
    block = randomize(ResnetBlock2D(8, 8, act_fn="relu"))
    block, report = convert_groupnorm(block, fuse_calls=True, fuse_acts="silu")
    assert report.summary() == {"swapped": 2, "fused": 0, "already": 0, "skipped": 0}
    assert report.rewritten == [] and "forward" not in vars(block) and block.norm1.act is None
    block, report = convert_groupnorm(block, fuse_calls=True)  # the default fuses them
    assert report.fused == ["norm1", "norm2"] and block.forward.acts == ("relu", "relu")


class InPlaceTwoUsers(nn.Module):
    """An in-place ReLU on the GroupNorm output, which is read again afterwards: not fused (the
    GroupNorm output has two users), and the unfused forward still gives torch's result."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(2, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        self.act(h)  # result unused: h itself is now relu(h)
        return h * 2


def test_inplace_activation_whose_input_is_read_again_is_not_fused():
    model = randomize(InPlaceTwoUsers())
    ref = copy.deepcopy(model)
    model, report = convert_groupnorm(model, fuse_calls=True, fuse_acts=True)
    assert report.fused == [] and report.skipped["norm+act"].startswith("not fused: the GroupNorm output")
    x = torch.randn(2, 4, 3)
    torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)


def test_call_unlike_the_trace_restores_each_norms_own_act():
    block = randomize(ResnetBlock2D(8, 8, temb=None, act_fn="relu"))
    ref = copy.deepcopy(block)
    block, report = convert_groupnorm(block, fuse_calls=True, fuse_acts=True)
    assert report.fused == ["norm1", "norm2"]
    x = torch.randn(2, 8, 4, 4)
    with pytest.warns(FutureWarning), pytest.warns(RuntimeWarning, match="extra arguments"):
        torch.testing.assert_close(block(x, None, scale=1.0), ref(x, None))  # the original forward, unfused
    assert block.norm1.act == "relu" and block.norm2.act == "relu"  # fused again after the call


def test_fused_forward_pickled_before_acts_existed_means_silu():
    _, model, _, _ = converted_unet()
    forward = vars(model.down[0])["forward"]
    state = forward.__getstate__()
    assert state["acts"] == ("silu", "silu")
    del state["acts"]
    old = FusedForward.__new__(FusedForward)
    old.__setstate__(state)
    assert old.acts == ("silu", "silu")
    with pytest.raises(ValueError, match="2 fused GroupNorms but 1 acts"):
        FusedForward(model.down[0], forward.graph_module, forward.fused, ("relu",))


class ThroughIdentity(nn.Module):
    """timm's ResNet blocks: ``self.drop_block`` (an nn.Identity unless drop-block is on) between the
    GroupNorm and its activation; here also two in a row, a hooked one, one whose output is read
    twice, and a Dropout (not an identity) in between."""

    def __init__(self, c: int = 4) -> None:
        super().__init__()
        self.norms = nn.ModuleList([nn.GroupNorm(2, c) for _ in range(5)])
        self.drop_block, self.aa, self.hooked = nn.Identity(), nn.Identity(), nn.Identity()
        self.hooked.register_forward_hook(lambda *args: None)
        self.act = nn.ReLU(inplace=True)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = self.norms
        h = self.act(self.drop_block(n[0](x)))
        h = F.silu(self.aa(self.drop_block(n[1](h))))
        h = self.act(self.hooked(n[2](h)))
        d = self.drop_block(n[3](h))
        h = self.act(d) + d
        return self.act(self.dropout(n[4](h)))


def test_an_identity_between_the_groupnorm_and_its_activation_is_passed_through():
    model = randomize(ThroughIdentity())
    ref = copy.deepcopy(model)
    model, report = convert_groupnorm(model, fuse_calls=True)
    assert report.fused == ["norms.0", "norms.1"]
    assert [norm.act for norm in model.norms] == ["relu", "silu", None, None, None]
    assert "also used elsewhere" in report.skipped["norms.3+act"]
    assert "norms.2+act" not in report.skipped and "norms.4+act" not in report.skipped  # (no pair found)
    code = model.forward.code
    assert code.count("self.act(") == 3 and "silu" not in code and "self.drop_block(" in code, code
    x = torch.randn(2, 4, 3, 5)
    assert_same_step(model, ref, x)
    model, _ = revert_groupnorm(model)
    assert "forward" not in vars(model) and all(type(norm) is nn.GroupNorm for norm in model.norms)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)


def test_timm_resnet50_gn_fuses_the_activation_after_its_drop_block():
    timm = pytest.importorskip("timm")
    model = timm.create_model("resnet50_gn", pretrained=False)
    _, report = convert_groupnorm(model, fuse_calls=True)
    # per bottleneck bn1 -> act1 and bn2 -> drop_block -> act2 (bn3 is added to the shortcut first),
    # and the stem's
    assert report.summary() == {"swapped": 53, "fused": 33, "already": 0, "skipped": 0}
    assert "layer1.0.bn2" in report.fused and "layer1.0.bn3" not in report.fused
