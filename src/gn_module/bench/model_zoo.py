"""The models `python -m gn_module.bench models` trains: builders, batches and losses (`MODELS`), and
an AutoencoderKL-style VAE of our own (diffusers' block structure, no diffusers needed)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

Batch = dict[str, torch.Tensor]


def _error_text(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]


# ---------------------------------------------------------------------------------------------
# Our AutoencoderKL-style VAE (diffusers' Encoder/Decoder block structure)


class VAEResnetBlock(nn.Module):
    """diffusers' ResnetBlock2D without the time embedding: GroupNorm -> SiLU -> conv, twice, plus a skip.

    The SiLU is called in ``forward`` (not an nn.Sequential), as in diffusers, so only
    ``convert_groupnorm(fuse_calls=True)`` fuses it."""

    def __init__(self, c_in: int, c_out: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, c_in, eps=1e-6)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, c_out, eps=1e-6)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.nonlinearity = nn.SiLU()
        self.conv_shortcut = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(self.nonlinearity(self.norm1(x)))
        h = self.conv2(self.nonlinearity(self.norm2(h)))
        return self.conv_shortcut(x) + h


class VAEAttention(nn.Module):
    """Single-head self-attention over the pixels, after a GroupNorm (diffusers' mid-block attention)."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.group_norm = nn.GroupNorm(groups, channels, eps=1e-6)
        self.to_q = nn.Linear(channels, channels)
        self.to_k = nn.Linear(channels, channels)
        self.to_v = nn.Linear(channels, channels)
        self.to_out = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.group_norm(x).flatten(2).transpose(1, 2)  # (B, HW, C)
        q, k, v = (proj(tokens).unsqueeze(1) for proj in (self.to_q, self.to_k, self.to_v))
        out = self.to_out(F.scaled_dot_product_attention(q, k, v).squeeze(1))
        return x + out.transpose(1, 2).reshape(x.shape)


class VAEMid(nn.Module):
    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.block1 = VAEResnetBlock(channels, channels, groups)
        self.attn = VAEAttention(channels, groups)
        self.block2 = VAEResnetBlock(channels, channels, groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block2(self.attn(self.block1(x)))


class VAEEncoder(nn.Module):
    def __init__(self, channels: Sequence[int], layers: int, groups: int, latent: int) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(3, channels[0], 3, padding=1)
        self.blocks, self.downsample = nn.ModuleList(), nn.ModuleList()
        c_prev = channels[0]
        for i, c in enumerate(channels):
            self.blocks.append(
                nn.Sequential(*[VAEResnetBlock(c_prev if j == 0 else c, c, groups) for j in range(layers)])
            )
            c_prev = c
            if i < len(channels) - 1:
                self.downsample.append(nn.Conv2d(c, c, 3, stride=2, padding=1))
        self.mid = VAEMid(c_prev, groups)
        self.conv_norm_out = nn.GroupNorm(groups, c_prev, eps=1e-6)
        self.conv_act = nn.SiLU()
        self.conv_out = nn.Conv2d(c_prev, 2 * latent, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level, blocks in enumerate(self.blocks):
            h = blocks(h)
            if level < len(self.downsample):
                h = self.downsample[level](h)
        h = self.mid(h)
        return self.conv_out(self.conv_act(self.conv_norm_out(h)))


class VAEDecoder(nn.Module):
    def __init__(self, channels: Sequence[int], layers: int, groups: int, latent: int) -> None:
        super().__init__()
        rev = list(reversed(channels))
        self.conv_in = nn.Conv2d(latent, rev[0], 3, padding=1)
        self.mid = VAEMid(rev[0], groups)
        self.blocks, self.upsample = nn.ModuleList(), nn.ModuleList()
        c_prev = rev[0]
        for i, c in enumerate(rev):
            self.blocks.append(
                nn.Sequential(
                    *[VAEResnetBlock(c_prev if j == 0 else c, c, groups) for j in range(layers + 1)]
                )
            )
            c_prev = c
            if i < len(rev) - 1:
                self.upsample.append(nn.Conv2d(c, c, 3, padding=1))
        self.conv_norm_out = nn.GroupNorm(groups, c_prev, eps=1e-6)
        self.conv_act = nn.SiLU()
        self.conv_out = nn.Conv2d(c_prev, 3, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid(self.conv_in(z))
        for level, blocks in enumerate(self.blocks):
            h = blocks(h)
            if level < len(self.upsample):
                h = self.upsample[level](F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.conv_out(self.conv_act(self.conv_norm_out(h)))


class VAE(nn.Module):
    """AutoencoderKL-style VAE: encoder -> (mean, logvar) -> sampled latent -> decoder.

    Like diffusers' AutoencoderKL: ``layers`` ResNet blocks per encoder level, ``layers + 1`` per decoder
    level, a mid block (ResNet, attention, ResNet) on both sides, 1x1 quant/post-quant convs. The
    latent is sampled with a noise tensor passed in, so a step is deterministic."""

    def __init__(
        self,
        channels: Sequence[int] = (128, 256, 512, 512),
        layers: int = 2,
        groups: int = 32,
        latent: int = 4,
    ) -> None:
        super().__init__()
        self.encoder = VAEEncoder(channels, layers, groups, latent)
        self.quant_conv = nn.Conv2d(2 * latent, 2 * latent, 1)
        self.post_quant_conv = nn.Conv2d(latent, latent, 1)
        self.decoder = VAEDecoder(channels, layers, groups, latent)

    def forward(self, x: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        mean, logvar = self.quant_conv(self.encoder(x)).chunk(2, dim=1)
        z = mean + (0.5 * logvar.clamp(-30.0, 20.0)).exp() * eps
        return self.decoder(self.post_quant_conv(z))


# ---------------------------------------------------------------------------------------------
# Model table


def _import_reason(*modules: str) -> str | None:
    """None when every module imports, else why not (any exception: a broken install counts too)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            return f"`import {name}` failed: {_error_text(exc)}"
    return None


def example_unet_path() -> Path | None:
    """examples/train_unet.py of the source tree (or of the current directory), None when absent."""
    here = Path(__file__).resolve()
    for root in (here.parents[3] if len(here.parents) > 3 else None, Path.cwd()):
        if root is not None and (root / "examples" / "train_unet.py").is_file():
            return root / "examples" / "train_unet.py"
    return None


@functools.lru_cache(maxsize=1)
def load_example_unet() -> ModuleType:
    """examples/train_unet.py as a module (it is a script, not part of the package)."""
    path = example_unet_path()
    if path is None:
        raise FileNotFoundError("examples/train_unet.py not found (run from the source tree)")
    spec = importlib.util.spec_from_file_location("gn_bench_train_unet", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _example_unet_reason() -> str | None:
    if example_unet_path() is None:
        return "examples/train_unet.py not found (run from the source tree)"
    try:
        load_example_unet()
    except Exception as exc:
        return f"loading examples/train_unet.py failed: {type(exc).__name__}: {exc}"
    return None


@dataclass(frozen=True)
class ModelSpec:
    """One benchmark model: how to build it, its batch (CPU tensors, from a seeded generator) and loss."""

    name: str
    title: str
    build: Callable[[bool], nn.Module]  # tiny -> model (random init under the caller's seed)
    make_batch: Callable[[bool, int, torch.Generator], Batch]  # (tiny, batch size, generator)
    loss: Callable[[nn.Module, Batch], torch.Tensor]
    batch: int
    tiny_batch: int
    unavailable: Callable[[], str | None] = lambda: None  # None, or why the model cannot run here


def _images(gen: torch.Generator, batch: int, size: int) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=gen)


def _classifier_batch(size: int, tiny_size: int, classes: int, tiny_classes: int) -> Callable[..., Batch]:
    def make(tiny: bool, batch: int, gen: torch.Generator) -> Batch:
        n = tiny_classes if tiny else classes
        return {
            "x": _images(gen, batch, tiny_size if tiny else size),
            "y": torch.randint(0, n, (batch,), generator=gen),
        }

    return make


def _classifier_loss(model: nn.Module, b: Batch) -> torch.Tensor:
    return F.cross_entropy(model(b["x"]).float(), b["y"])


def _timm(name: str) -> Callable[[bool], nn.Module]:
    def build(tiny: bool) -> nn.Module:
        import timm

        return timm.create_model(name, pretrained=False, num_classes=10 if tiny else 1000)

    return build


def _torchvision_resnet50_gn(tiny: bool) -> nn.Module:
    import torchvision

    return torchvision.models.resnet50(
        weights=None, num_classes=10 if tiny else 1000, norm_layer=lambda c: nn.GroupNorm(32, c)
    )


# examples/train_unet.py's defaults (and its --tiny sizes): channels, blocks, groups, image size.
UNET_CONFIG = {"channels": (128, 256, 512), "blocks": 2, "groups": 32, "image": 64}
UNET_TINY = {"channels": (32, 64), "blocks": 1, "groups": 8, "image": 16}


def _example_unet(tiny: bool) -> nn.Module:
    cfg = UNET_TINY if tiny else UNET_CONFIG
    return load_example_unet().UNet(cfg["channels"], cfg["blocks"], cfg["groups"])


def _diffusion_batch(size: int, tiny_size: int) -> Callable[..., Batch]:
    def make(tiny: bool, batch: int, gen: torch.Generator) -> Batch:
        s = tiny_size if tiny else size
        coarse = torch.randn(batch, 3, max(s // 4, 1), max(s // 4, 1), generator=gen)
        image = F.interpolate(coarse, size=(s, s), mode="bilinear", align_corners=False).clamp(-1, 1)
        t = torch.rand(batch, generator=gen)
        return {"image": image, "noise": torch.randn(batch, 3, s, s, generator=gen), "t": t}

    return make


def _noisy(b: Batch) -> torch.Tensor:
    alpha_bar = torch.cos(b["t"] * math.pi / 2).square()[:, None, None, None]
    return alpha_bar.sqrt() * b["image"] + (1 - alpha_bar).sqrt() * b["noise"]


def _example_unet_loss(model: nn.Module, b: Batch) -> torch.Tensor:
    """examples/train_unet.py's Diffusion.training_step: noise prediction under a cosine schedule."""
    return F.mse_loss(model(_noisy(b), b["t"]).float(), b["noise"])


VAE_CONFIG = {"channels": (128, 256, 512, 512), "layers": 2, "groups": 32, "image": 256}
VAE_TINY = {"channels": (16, 32), "layers": 1, "groups": 8, "image": 16}


def _vae(tiny: bool) -> nn.Module:
    cfg = VAE_TINY if tiny else VAE_CONFIG
    return VAE(cfg["channels"], cfg["layers"], cfg["groups"])


def _vae_batch(tiny: bool, batch: int, gen: torch.Generator) -> Batch:
    cfg = VAE_TINY if tiny else VAE_CONFIG
    s, down = cfg["image"], 2 ** (len(cfg["channels"]) - 1)
    return {
        "x": _images(gen, batch, s).tanh(),
        "eps": torch.randn(batch, 4, s // down, s // down, generator=gen),
    }


def _vae_loss(model: nn.Module, b: Batch) -> torch.Tensor:
    return F.mse_loss(model(b["x"], b["eps"]).float(), b["x"])


def _diffusers_unet(tiny: bool) -> nn.Module:
    from diffusers import UNet2DModel

    if tiny:
        return UNet2DModel(
            sample_size=16,
            block_out_channels=(32, 64),
            down_block_types=("DownBlock2D", "AttnDownBlock2D"),
            up_block_types=("AttnUpBlock2D", "UpBlock2D"),
            layers_per_block=1,
            norm_num_groups=8,
        )
    return UNet2DModel(  # a DDPM-style pixel-space UNet
        sample_size=64,
        block_out_channels=(128, 256, 256, 512),
        down_block_types=("DownBlock2D", "DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D", "UpBlock2D"),
        layers_per_block=2,
        norm_num_groups=32,
    )


def _diffusers_unet_loss(model: nn.Module, b: Batch) -> torch.Tensor:
    return F.mse_loss(model(_noisy(b), b["t"] * 999).sample.float(), b["noise"])


def _diffusers_vae(tiny: bool) -> nn.Module:
    from diffusers import AutoencoderKL

    cfg = VAE_TINY if tiny else VAE_CONFIG
    levels = len(cfg["channels"])
    return AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * levels,
        up_block_types=("UpDecoderBlock2D",) * levels,
        block_out_channels=cfg["channels"],
        layers_per_block=cfg["layers"],
        latent_channels=4,
        norm_num_groups=cfg["groups"],
        sample_size=cfg["image"],
    )


def _diffusers_vae_batch(tiny: bool, batch: int, gen: torch.Generator) -> Batch:
    cfg = VAE_TINY if tiny else VAE_CONFIG
    return {"x": _images(gen, batch, cfg["image"]).tanh()}


def _diffusers_vae_loss(model: nn.Module, b: Batch) -> torch.Tensor:
    return F.mse_loss(model(b["x"]).sample.float(), b["x"])  # decodes the posterior's mode


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "timm_resnet50_gn",
            "timm resnet50_gn",
            _timm("resnet50_gn"),
            _classifier_batch(224, 32, 1000, 10),
            _classifier_loss,
            batch=8,
            tiny_batch=2,
            unavailable=functools.partial(_import_reason, "timm"),
        ),
        ModelSpec(
            "timm_efficientnet_b0_gn",
            "timm efficientnet_b0_gn",
            _timm("efficientnet_b0_gn"),
            _classifier_batch(224, 32, 1000, 10),
            _classifier_loss,
            batch=8,
            tiny_batch=2,
            unavailable=functools.partial(_import_reason, "timm"),
        ),
        ModelSpec(
            "tv_resnet50_gn",
            "torchvision resnet50 GroupNorm(32)",
            _torchvision_resnet50_gn,
            _classifier_batch(224, 32, 1000, 10),
            _classifier_loss,
            batch=8,
            tiny_batch=2,
            unavailable=functools.partial(_import_reason, "torchvision"),
        ),
        ModelSpec(
            "unet",
            "examples/train_unet.py UNet",
            _example_unet,
            _diffusion_batch(UNET_CONFIG["image"], UNET_TINY["image"]),
            _example_unet_loss,
            batch=32,
            tiny_batch=2,
            unavailable=_example_unet_reason,
        ),
        ModelSpec(
            "vae",
            "AutoencoderKL-style VAE (ours)",
            _vae,
            _vae_batch,
            _vae_loss,
            batch=4,
            tiny_batch=2,
        ),
        ModelSpec(
            "diffusers_unet2d",
            "diffusers UNet2DModel",
            _diffusers_unet,
            _diffusion_batch(64, 16),
            _diffusers_unet_loss,
            batch=16,
            tiny_batch=2,
            unavailable=functools.partial(_import_reason, "diffusers"),
        ),
        ModelSpec(
            "diffusers_vae",
            "diffusers AutoencoderKL",
            _diffusers_vae,
            _diffusers_vae_batch,
            _diffusers_vae_loss,
            batch=4,
            tiny_batch=2,
            unavailable=functools.partial(_import_reason, "diffusers"),
        ),
    )
}
MODEL_NAMES = tuple(MODELS)
