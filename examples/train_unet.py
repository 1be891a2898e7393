"""Train a small diffusion-style UNet with Lightning on synthetic data, with or without GNSwapCallback.

    python examples/train_unet.py --tiny                    # CPU smoke run, well under a minute
    python examples/train_unet.py --swap --precision bf16-mixed          # H200: fast GroupNorm
    python examples/train_unet.py --no-swap --precision bf16-mixed       # H200: torch's GroupNorm
    python examples/train_unet.py --devices 2 --batch-size 16 --loss-log ddp.json

Every ResNet block is GroupNorm -> SiLU -> Conv inside an nn.Sequential, so the callback swaps each
GroupNorm and fuses its SiLU. Prints steps/s (after warm-up), peak memory and the final loss; the
per-step losses (averaged over ranks) go to --loss-log. Samples depend only on their index, so a
run on 2 devices with half the per-device batch sees the same global batches as a 1-device run.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import time

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from gn_module import GNSwapCallback

# --------------------------------------------------------------------------------------------
# Model


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, device=t.device) / half)
    angles = 1000.0 * t[:, None].float() * freqs[None]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def norm_act_conv(c_in: int, c_out: int, groups: int) -> nn.Sequential:
    return nn.Sequential(nn.GroupNorm(groups, c_in), nn.SiLU(), nn.Conv2d(c_in, c_out, 3, padding=1))


class ResBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, emb_dim: int, groups: int) -> None:
        super().__init__()
        self.in_layers = norm_act_conv(c_in, c_out, groups)
        self.emb = nn.Sequential(nn.SiLU(), nn.Linear(emb_dim, c_out))
        self.out_layers = norm_act_conv(c_out, c_out, groups)
        self.skip = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.in_layers(x) + self.emb(emb)[:, :, None, None]
        return self.skip(x) + self.out_layers(h)


class UNet(nn.Module):
    """Down path of ResBlocks, a middle, and an up path with skip connections (one per level)."""

    def __init__(self, channels: tuple[int, ...], blocks: int, groups: int) -> None:
        super().__init__()
        self.emb_dim = emb = 4 * channels[0]
        self.time = nn.Sequential(nn.Linear(channels[0], emb), nn.SiLU(), nn.Linear(emb, emb))
        self.stem = nn.Conv2d(3, channels[0], 3, padding=1)
        self.down, self.downsample = nn.ModuleList(), nn.ModuleList()
        c_prev = channels[0]
        for i, c in enumerate(channels):
            self.down.append(
                nn.ModuleList([ResBlock(c_prev if j == 0 else c, c, emb, groups) for j in range(blocks)])
            )
            c_prev = c
            if i < len(channels) - 1:
                self.downsample.append(nn.Conv2d(c, c, 3, stride=2, padding=1))
        self.mid = nn.ModuleList([ResBlock(c_prev, c_prev, emb, groups) for _ in range(2)])
        self.up, self.upsample = nn.ModuleList(), nn.ModuleList()
        for i in reversed(range(len(channels))):
            c = channels[i]
            self.up.append(
                nn.ModuleList([ResBlock(2 * c if j == 0 else c, c, emb, groups) for j in range(blocks)])
            )
            if i > 0:
                self.upsample.append(nn.Conv2d(c, channels[i - 1], 3, padding=1))
        self.out = norm_act_conv(channels[0], 3, groups)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        emb = self.time(timestep_embedding(t, self.stem.out_channels))
        h, skips = self.stem(x), []
        for level, blocks in enumerate(self.down):
            for block in blocks:
                h = block(h, emb)
            skips.append(h)
            if level < len(self.downsample):
                h = self.downsample[level](h)
        for block in self.mid:
            h = block(h, emb)
        for level, blocks in enumerate(self.up):
            h = torch.cat([h, skips.pop()], dim=1)
            for block in blocks:
                h = block(h, emb)
            if level < len(self.upsample):
                h = self.upsample[level](F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.out(h)


# --------------------------------------------------------------------------------------------
# Data and training


class SyntheticImages(Dataset):
    """Smooth random images, noise and a timestep, all a function of the sample index only."""

    def __init__(self, length: int, size: int, seed: int) -> None:
        self.length, self.size, self.seed = length, size, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        coarse = torch.randn(1, 3, max(self.size // 4, 1), max(self.size // 4, 1), generator=g)
        image = F.interpolate(coarse, size=(self.size, self.size), mode="bilinear", align_corners=False)[0]
        noise = torch.randn(3, self.size, self.size, generator=g)
        return image.clamp(-1, 1), noise, torch.rand((), generator=g)


class Diffusion(pl.LightningModule):
    """Noise-prediction objective with a cosine schedule."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.unet = UNet(args.channels, args.blocks, args.groups)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.unet(x, t)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        image, noise, t = batch
        alpha_bar = torch.cos(t * math.pi / 2).square()[:, None, None, None]
        noisy = alpha_bar.sqrt() * image + (1 - alpha_bar).sqrt() * noise
        if self.args.channels_last:
            noisy = noisy.contiguous(memory_format=torch.channels_last)
        return F.mse_loss(self(noisy, t).float(), noise)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.args.lr)

    def train_dataloader(self) -> DataLoader:
        world, args = self.trainer.world_size, self.args
        data = SyntheticImages(args.steps * args.batch_size * world, args.image_size, args.seed)
        # Lightning's automatic DistributedSampler shuffles; an unshuffled one makes global step k see
        # samples [k*B, (k+1)*B) for any number of devices, so loss curves are comparable.
        sampler = (
            DistributedSampler(data, num_replicas=world, rank=self.global_rank, shuffle=False)
            if world > 1
            else None
        )
        return DataLoader(
            data,
            batch_size=args.batch_size,
            sampler=sampler,
            num_workers=args.workers,
            persistent_workers=args.workers > 0,
            pin_memory=torch.cuda.is_available(),
        )


class Meter(pl.Callback):
    """Per-step losses averaged over ranks, steps/s after warm-up, peak memory."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.losses, self.start, self.elapsed = warmup, [], None, float("nan")

    def _sync(self, trainer: pl.Trainer) -> float:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize(trainer.strategy.root_device)
        return time.perf_counter()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.warmup:
            self.start = self._sync(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(trainer.strategy.reduce(outputs["loss"].detach(), reduce_op="mean"))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.start is not None:
            self.elapsed = self._sync(trainer) - self.start


def peak_memory_mib(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "torch.cuda.max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process max RSS"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--swap", action=argparse.BooleanOptionalAction, default=True, help="use GNSwapCallback")
    p.add_argument(
        "--precision", default=None, help="Lightning precision (default bf16-mixed on CUDA, else 32-true)"
    )
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--accelerator", default="auto")
    p.add_argument("--tiny", action="store_true", help="small sizes for a CPU smoke run")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default 60, tiny 6)")
    p.add_argument("--batch-size", type=int, default=None, help="per device (default 32, tiny 2)")
    p.add_argument("--image-size", type=int, default=None, help="default 64, tiny 16")
    p.add_argument("--channels", default=None, help="comma-separated (default 128,256,512, tiny 32,64)")
    p.add_argument("--blocks", type=int, default=None, help="ResBlocks per level (default 2, tiny 1)")
    p.add_argument("--groups", type=int, default=None, help="GroupNorm groups (default 32, tiny 8)")
    p.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="channels_last model and inputs (default: on CUDA), for --swap and --no-swap alike",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile the LightningModule")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=None, help="steps excluded from timing (default steps//5)")
    p.add_argument("--workers", type=int, default=None, help="DataLoader workers (default 4 on CUDA, else 0)")
    p.add_argument("--loss-log", default=None, help="write per-step losses and the results to this JSON file")
    args = p.parse_args(argv)

    tiny = args.tiny
    cuda = args.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    defaults = {
        "steps": 6 if tiny else 60,
        "batch_size": 2 if tiny else 32,
        "image_size": 16 if tiny else 64,
        "channels": "32,64" if tiny else "128,256,512",
        "blocks": 1 if tiny else 2,
        "groups": 8 if tiny else 32,
        "precision": "bf16-mixed" if cuda else "32-true",
        "channels_last": cuda,
        "workers": 4 if cuda else 0,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        args.channels = tuple(int(c) for c in str(args.channels).split(","))
    except ValueError:
        p.error(f"--channels expects comma-separated integers, got {args.channels!r}")
    if min(args.channels) < 1:
        p.error(f"--channels must all be >= 1, got {args.channels}")
    if args.groups < 1:
        p.error(f"--groups must be >= 1, got {args.groups}")
    if bad := [c for c in args.channels if c % args.groups]:
        p.error(f"--groups {args.groups} must divide every width in --channels; it does not divide {bad}")
    if args.warmup is None:
        args.warmup = args.steps // 5
    if not 0 <= args.warmup < args.steps:
        p.error(f"--warmup must be in [0, steps={args.steps})")
    if args.image_size % 2 ** (len(args.channels) - 1):
        p.error(f"--image-size must be divisible by {2 ** (len(args.channels) - 1)}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    pl.seed_everything(args.seed, verbose=False)
    if torch.cuda.is_available():
        torch.backends.cudnn.benchmark = True
    model = Diffusion(args)
    callbacks: list[pl.Callback] = [meter := Meter(args.warmup)]
    if args.swap:
        callbacks.append(swap := GNSwapCallback(channels_last=args.channels_last))
    elif args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        precision=args.precision,
        max_steps=args.steps,
        strategy="ddp" if args.devices > 1 else "auto",
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    trainer.fit(torch.compile(model) if args.compile else model)

    losses = [float(loss) for loss in meter.losses]
    memory, memory_kind = peak_memory_mib(trainer.strategy.root_device)
    result = {
        "swap": args.swap,
        "precision": args.precision,
        "devices": args.devices,
        "compile": args.compile,
        "channels": list(args.channels),
        "image_size": args.image_size,
        "batch_size": args.batch_size,
        "channels_last": args.channels_last,
        "steps": args.steps,
        "warmup": args.warmup,
        "steps_per_s": (args.steps - args.warmup) / meter.elapsed,
        "peak_memory_mib": memory,
        "peak_memory_kind": memory_kind,
        "final_loss": losses[-1] if losses else float("nan"),
        "swap_summary": swap.report.summary() if args.swap and swap.report else None,
        "losses": losses,
    }
    if trainer.is_global_zero:
        print(
            f"config: swap={args.swap} precision={args.precision} devices={args.devices} "
            f"compile={args.compile} "
            f"channels={args.channels} image={args.image_size} batch/device={args.batch_size} "
            f"channels_last={args.channels_last} device={trainer.strategy.root_device}"
        )
        if result["swap_summary"]:
            print(f"swapped: {result['swap_summary']}")
        print(f"steps/s: {result['steps_per_s']:.3f} (steps {args.warmup + 1}-{args.steps})")
        print(f"peak memory: {memory:.1f} MiB ({memory_kind})")
        print(f"final loss: {result['final_loss']:.5f}")
        if args.loss_log:
            with open(args.loss_log, "w") as f:
                json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
