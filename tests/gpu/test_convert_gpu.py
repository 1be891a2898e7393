"""GPU tests of convert_groupnorm and GNSwapCallback: converted models match unconverted ones.

Run on a CUDA machine: ``pytest tests/gpu/test_convert_gpu.py -v``. The DDP test needs 2 GPUs
(and NCCL_NVLS_ENABLE=0 on the lent machines; it sets that for its children when unset).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import gn_module
from gn_module.convert import convert_groupnorm
from gn_module.functional import fast_path_reason

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ROOT = Path(__file__).resolve().parents[2]
# Relative error (norm of the difference over the norm of the reference) allowed per compute dtype.
TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


class Net(nn.Module):
    """Conv/GroupNorm/SiLU stack: two fusable pairs, one GroupNorm before a conv, odd group sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1),
            nn.Sequential(nn.GroupNorm(32, 64), nn.SiLU(), nn.Conv2d(64, 96, 3, padding=1)),
            nn.Sequential(nn.GroupNorm(32, 96), nn.SiLU(), nn.Conv2d(96, 128, 3, padding=1)),  # 3 ch/group
            nn.GroupNorm(16, 128),
            nn.Conv2d(128, 3, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


@pytest.fixture(autouse=True)
def _no_tf32(no_tf32):
    """The comparisons here are about GroupNorm (tests/conftest.py)."""


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def count_fast_calls(model: nn.Module) -> list[int]:
    """Counts GroupNorm calls whose input takes gn_module's CUDA kernels (not torch's fallback)."""
    calls = [0, 0]  # fast, total

    def hook(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        calls[1] += 1
        calls[0] += fast_path_reason(args[0], module.weight) is None

    for m in model.modules():
        if isinstance(m, gn_module.GroupNorm):
            m.register_forward_pre_hook(hook)
    return calls


def pair(dtype: torch.dtype = torch.float32) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    ref = Net().cuda().to(dtype=dtype, memory_format=torch.channels_last)
    with torch.no_grad():  # non-trivial affine parameters
        for m in ref.modules():
            if isinstance(m, nn.GroupNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    model, report = convert_groupnorm(copy.deepcopy(ref))
    assert report.summary()["swapped"] == 3 and report.summary()["fused"] == 2
    return ref, model


def forward_backward(model: nn.Module, x: torch.Tensor, autocast: torch.dtype | None):
    x = x.detach().clone().requires_grad_(True)
    with torch.autocast("cuda", dtype=autocast, enabled=autocast is not None):
        y = model(x)
    y.float().square().mean().backward()
    plain = getattr(model, "_orig_mod", model)  # a compiled module prefixes parameter names
    grads = {n: p.grad for n, p in plain.named_parameters()}
    return y, x.grad, grads


@pytest.mark.parametrize(
    "param_dtype, autocast",
    [
        (torch.float32, None),
        (torch.float32, torch.float16),
        (torch.float32, torch.bfloat16),
        (torch.bfloat16, None),
        (torch.float16, None),
    ],
    ids=["fp32", "autocast-fp16", "autocast-bf16", "bf16", "fp16"],
)
def test_outputs_and_grads_match_unconverted(param_dtype, autocast):
    ref, model = pair(param_dtype)
    calls = count_fast_calls(model)
    x = torch.randn(4, 3, 32, 32, device="cuda", dtype=param_dtype).contiguous(
        memory_format=torch.channels_last
    )
    y_ref, dx_ref, g_ref = forward_backward(ref, x, autocast)
    y, dx, g = forward_backward(model, x, autocast)
    assert calls == [3, 3], "every GroupNorm input should be channels-last and take the CUDA kernels"
    tol = TOL[autocast or param_dtype]
    assert y.is_contiguous(memory_format=torch.channels_last)
    errors = {"y": rel_err(y, y_ref), "dx": rel_err(dx, dx_ref)}
    errors.update({n: rel_err(g[n], g_ref[n]) for n in g_ref})
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, f"relative errors above {tol}: {bad}"


def groupnorm_output_dtypes(model: nn.Module) -> list[torch.dtype]:
    dtypes: list[torch.dtype] = []
    for m in model.modules():
        if isinstance(m, nn.GroupNorm):
            m.register_forward_hook(lambda _m, _args, out: dtypes.append(out.dtype))
    return dtypes


@pytest.mark.parametrize("autocast", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_under_autocast_groupnorm_returns_what_torch_returns(autocast):
    """Issue 14: CUDA autocast runs torch's group_norm in float32; ours returns float32 too, unless
    autocast_output="input" asks for the input's dtype."""
    ref, model = pair()
    kept, _ = convert_groupnorm(copy.deepcopy(ref), autocast_output="input")
    x = torch.randn(2, 3, 16, 16, device="cuda").contiguous(memory_format=torch.channels_last)
    seen = {name: groupnorm_output_dtypes(m) for name, m in (("torch", ref), ("ours", model), ("kept", kept))}
    for m in (ref, model, kept):
        forward_backward(m, x, autocast)
    assert seen["torch"] == seen["ours"] == [torch.float32] * 3
    assert seen["kept"] == [autocast] * 3


def _gradient_errors(g: dict, g_true: dict, names: list[str]) -> tuple[dict, float]:
    """Per-parameter ``1 - cosine`` to the fp64 gradients for ``names``, and the whole model's."""
    cos = torch.nn.functional.cosine_similarity
    per = {n: 1.0 - cos(g[n].flatten().double(), g_true[n].flatten(), dim=0).item() for n in names}
    flat = torch.cat([g[n].flatten().double() for n in g_true])
    whole = 1.0 - cos(flat, torch.cat([g_true[n].flatten() for n in g_true]), dim=0).item()
    return per, whole


def test_resnet50_gn_bf16_gradients_as_close_to_fp64_as_torchs():
    """Issue 14: with bf16 output under autocast, torchvision's resnet50 with GroupNorm(32) had a GroupNorm
    gradient at cosine 0.76 to the unswapped model's. Two bf16 runs differ by the convolutions' rounding
    anyway (session 6: cosine 0.86 on layer2.1.bn1.bias between torch's and ours with float32 output), so
    both are judged against the fp64 gradients: ours may not be meaningfully further from them than
    torch's own bf16 autocast step."""
    models = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    ref = (
        models.resnet50(norm_layer=lambda c: nn.GroupNorm(32, c)).cuda().to(memory_format=torch.channels_last)
    )
    model, report = convert_groupnorm(copy.deepcopy(ref))
    assert len(report.swapped) == 53
    x = torch.randn(4, 3, 128, 128, device="cuda").contiguous(memory_format=torch.channels_last)
    _, _, g_true = forward_backward(copy.deepcopy(ref).double(), x.double(), None)
    _, _, g_torch = forward_backward(ref, x, torch.bfloat16)
    _, _, g_ours = forward_backward(model, x, torch.bfloat16)
    norm_modules = {n for n, mod in ref.named_modules() if isinstance(mod, nn.GroupNorm)}
    norm_params = [n for n in g_true if n.rsplit(".", 1)[0] in norm_modules]
    assert len(norm_params) == 106
    torch_err, torch_whole = _gradient_errors(g_torch, g_true, norm_params)
    ours_err, ours_whole = _gradient_errors(g_ours, g_true, norm_params)
    # figures only: what the opt-in costs
    kept, _ = convert_groupnorm(copy.deepcopy(ref), autocast_output="input")
    kept_err, kept_whole = _gradient_errors(forward_backward(kept, x, torch.bfloat16)[2], g_true, norm_params)
    worst = max(ours_err, key=ours_err.get)
    figures = (
        f"1 - cosine to fp64: worst GroupNorm parameter ours {ours_err[worst]:.4f} ({worst}), torch's worst "
        f"{max(torch_err.values()):.4f}, autocast_output='input' {max(kept_err.values()):.4f}; "
        f"whole model ours {ours_whole:.2e}, torch {torch_whole:.2e}, opt-in {kept_whole:.2e}"
    )
    print(figures)
    assert ours_err[worst] <= 1.5 * max(torch_err.values()) + 0.01, figures
    assert ours_whole <= 1.5 * torch_whole + 1e-4, figures


@pytest.fixture
def deterministic():
    """Deterministic convolutions (cuDNN's bf16 weight gradients otherwise differ from run to run by more
    than anything GroupNorm does: session 6 saw cosine 0.86 on a GroupNorm bias between two runs)."""
    cudnn = torch.backends.cudnn
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    saved = (cudnn.deterministic, cudnn.benchmark, torch.are_deterministic_algorithms_enabled(), warn_only)
    cudnn.deterministic, cudnn.benchmark = True, False
    torch.use_deterministic_algorithms(True, warn_only=True)
    yield
    cudnn.deterministic, cudnn.benchmark = saved[:2]
    torch.use_deterministic_algorithms(saved[2], warn_only=saved[3])


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of two gradients; 1 when both are exactly zero (a parameter behind a zero
    weight), 0 when only one is."""
    a, b = a.flatten().double(), b.flatten().double()
    if not a.any() or not b.any():
        return float(not a.any() and not b.any())
    return torch.nn.functional.cosine_similarity(a, b, dim=0).item()


def _cosines(g: dict, g_ref: dict, names: list[str]) -> tuple[dict, float]:
    """Per-parameter cosine similarity of gradients for ``names``, and the whole model's."""
    cos = torch.nn.functional.cosine_similarity
    per = {n: _cosine(g[n], g_ref[n]) for n in names}
    whole = cos(torch.cat([g[n].flatten().double() for n in g_ref]),
                torch.cat([g_ref[n].flatten().double() for n in g_ref]), dim=0).item()  # fmt: skip
    return per, whole


def _timm_resnet50_gn_bf16_cosines(**kwargs) -> dict:
    """timm resnet50_gn (``kwargs`` to create_model), bf16 autocast, 8x3x224x224 channels_last, one
    backward: per-GroupNorm-parameter and whole-model gradient cosines against the unswapped model for
    the swapped model (defaults), for the unswapped model again (a rerun) and for the unswapped model in
    NCHW (torch against itself in its other memory format: other convolution kernels, other roundings)."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    ref = timm.create_model("resnet50_gn", num_classes=100, **kwargs).cuda()
    nchw = copy.deepcopy(ref)
    ref = ref.to(memory_format=torch.channels_last)
    model, report = convert_groupnorm(copy.deepcopy(ref))
    assert len(report.swapped) == 53 and not report.skipped
    x = torch.randn(8, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    norm_modules = {n for n, mod in ref.named_modules() if isinstance(mod, nn.GroupNorm)}
    _, _, g_ref = forward_backward(ref, x, torch.bfloat16)
    g_ref = {n: g.clone() for n, g in g_ref.items()}
    ref.zero_grad(set_to_none=True)
    norm_params = [n for n in g_ref if n.rsplit(".", 1)[0] in norm_modules]
    assert len(norm_params) == 106
    exact = copy.deepcopy(ref)
    for mod in exact.modules():
        if isinstance(mod, nn.GroupNorm):
            mod.__class__ = _RoundedFp64GroupNorm
    out = {}
    runs = (("ours", model, x), ("rerun", ref, x), ("nchw", nchw, x.contiguous()), ("fp64-gn", exact, x))
    for name, m, inp in runs:
        out[name] = _cosines(forward_backward(m, inp, torch.bfloat16)[2], g_ref, norm_params)
    return out


class _RoundedFp64GroupNorm(nn.GroupNorm):
    """torch's GroupNorm computed in float64 and rounded to float32 (autocast's output dtype for it):
    another valid float32 GroupNorm, more accurate than torch's, different in the last bits."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cuda", enabled=False):
            w, b = self.weight.double(), self.bias.double()
            y = nn.functional.group_norm(x.double(), self.num_groups, w, b, self.eps)
        return y.float()


def _cosine_figures(c: dict) -> str:
    def worst(name):
        per = c[name][0]
        w = min(per, key=per.get)
        return f"{per[w]:.6f} ({w})"

    return "; ".join(f"{k}: whole {c[k][1]:.7f}, worst GroupNorm parameter {worst(k)}" for k in c)


def test_timm_resnet50_gn_bf16_gradients_match_the_unswapped_model(deterministic, no_tf32):
    """Issue 14's criterion: timm resnet50_gn with timm's defaults in bf16 autocast, our defaults, the
    same input and memory format as the unswapped model: whole-model gradient cosine >= 0.9999 against the
    unswapped model and >= 0.999 on every GroupNorm parameter (timm zero-inits each block's last GroupNorm
    weight, so the blocks' other GroupNorm parameters get exactly zero gradients at init: two zero
    gradients count as equal). The rerun and NCHW figures are printed beside it (-s)."""
    c = _timm_resnet50_gn_bf16_cosines()
    figures = "cosine to the unswapped model: " + _cosine_figures(c)
    print(figures)
    ours, ours_whole = c["ours"]
    assert ours_whole >= 0.9999 and min(ours.values()) >= 0.999, figures


def test_timm_resnet50_gn_bf16_no_zero_init_as_close_as_a_rounded_fp64_groupnorm(deterministic, no_tf32):
    """With zero_init_last=False every GroupNorm parameter has a gradient, and bf16 rounding downstream
    of any last-bit difference spreads through the network (the H200: whole 0.9975 for ours, while a
    deterministic rerun is 1.0 and torch in NCHW 0.9999975). The yardstick is another valid float32
    GroupNorm in the same model: torch's own, computed in float64 and rounded. Our gradients must be no
    further from the unswapped model's than that (3x its 1 - cosine, whole and worst parameter)."""
    c = _timm_resnet50_gn_bf16_cosines(zero_init_last=False)
    figures = "cosine to the unswapped model: " + _cosine_figures(c)
    print(figures)
    (ours, ours_whole), (other, other_whole) = c["ours"], c["fp64-gn"]
    assert 1 - ours_whole <= 3 * (1 - other_whole) + 1e-6, figures
    assert 1 - min(ours.values()) <= 3 * (1 - min(other.values())) + 1e-6, figures


@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["fp32", "autocast-bf16"])
def test_compile_fullgraph_matches_eager(autocast):
    _, model = pair()
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(4, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    y_eager, dx_eager, g_eager = forward_backward(model, x, autocast)
    model.zero_grad(set_to_none=True)
    y, dx, g = forward_backward(compiled, x, autocast)
    tol = TOL[autocast or torch.float32]
    assert rel_err(y, y_eager) <= tol and rel_err(dx, dx_eager) <= tol
    for name in g_eager:
        assert rel_err(g[name], g_eager[name]) <= tol, name


# ------------------------------------------------------------------------------------------------
# Lightning: every precision, swap vs no swap, and torch.compile


def lightning_run(
    precision: str, swap: bool, steps: int = 4, compile: bool = False
) -> tuple[list[float], list[int]]:
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = Net()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch, batch_idx):
            (x,) = batch
            return (self(x).float() - x.float()).square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

        def train_dataloader(self):
            data = torch.randn(steps * 4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
            return DataLoader(TensorDataset(data), batch_size=4)

    class Record(pl.Callback):
        def __init__(self) -> None:
            self.losses: list[float] = []
            self.calls = [0, 0]

        def on_fit_start(self, trainer, pl_module):
            self.calls = count_fast_calls(pl_module)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.losses.append(outputs["loss"].item())

    torch.manual_seed(0)
    module = Module()
    record = Record()
    callbacks = [record, *([gn_module.GNSwapCallback()] if swap else [])]
    trainer = pl.Trainer(
        accelerator="gpu",
        devices=1,
        precision=precision,
        max_steps=steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(torch.compile(module) if compile else module)
    return record.losses, record.calls


@pytest.mark.parametrize(
    "precision, tol",
    [("32-true", 1e-4), ("16-mixed", 1e-2), ("bf16-mixed", 5e-2), ("bf16-true", 5e-2)],
)
def test_trainer_precisions_match_unswapped(precision, tol):
    swapped, calls = lightning_run(precision, swap=True)
    plain, _ = lightning_run(precision, swap=False)
    assert calls[1] > 0 and calls[0] == calls[1], (
        f"fast path used in {calls[0]} of {calls[1]} GroupNorm calls"
    )
    assert all(torch.isfinite(torch.tensor(swapped)))
    diffs = [abs(a - b) / abs(b) for a, b in zip(swapped, plain, strict=True)]
    assert max(diffs) <= tol, f"per-step relative loss differences {diffs}"


def test_trainer_with_compiled_module():
    swapped, _ = lightning_run("bf16-mixed", swap=True, compile=True)
    plain, _ = lightning_run("bf16-mixed", swap=False)
    diffs = [abs(a - b) / abs(b) for a, b in zip(swapped, plain, strict=True)]
    assert max(diffs) <= 5e-2, diffs


def test_train_unet_example_on_gpu(tmp_path):
    cmd = [
        sys.executable,
        str(ROOT / "examples/train_unet.py"),
        "--steps",
        "6",
        "--batch-size",
        "4",
        "--image-size",
        "32",
        "--channels",
        "64,128",
        "--blocks",
        "1",
        "--loss-log",
        str(tmp_path / "l.json"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "torch.cuda.max_memory_allocated" in proc.stdout and "swapped" in proc.stdout


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="DDP check needs 2 GPUs")
def test_ddp_two_gpus_matches_single(tmp_path):
    env = {**os.environ, "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0")}
    cmd = [
        sys.executable,
        str(ROOT / "scripts/ddp_check.py"),
        "--steps",
        "10",
        "--batch-size",
        "8",
        "--out",
        str(tmp_path),
        "--",
        "--image-size",
        "32",
        "--channels",
        "64,128",
        "--blocks",
        "1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    print(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "DDP CHECK PASSED" in proc.stdout
