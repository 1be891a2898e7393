"""CPU smoke tests of `python -m gn_module.bench models` (gn_module.bench.models): tiny models, perf_counter
timing."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import gn_module
from gn_module.bench import cli as bench_cli
from gn_module.bench import model_zoo
from gn_module.bench import models as bm
from gn_module.bench.models import Measurement, ModelsReport, Row

SRC = str(Path(gn_module.__file__).resolve().parents[1])
CPU = ["--tiny", "--device", "cpu"]


def fake(config: str, ms: float | None, error: str | None = None, **kw: object) -> Measurement:
    return Measurement(config, median_ms=ms, times_ms=[] if ms is None else [ms], error=error, **kw)


def fake_row(cl: float | None, nchw: float | None, swapped: float | None, compiled: bool = False) -> Row:
    row = Row("vae", "bf16", compiled, 4)
    for config, ms in (("channels_last", cl), ("contiguous", nchw), ("swapped", swapped)):
        row.measurements[config] = fake(
            config,
            ms,
            None if ms is not None else "OutOfMemoryError: CUDA out of memory",
            peak_mib=None if ms is None else 1000.0 + (config == "swapped") * 10,
            first_step_s=None if ms is None else 12.0,
            conversion={"swapped": 24, "fused": 22, "already": 0, "skipped": 0}
            if config == "swapped"
            else None,
        )
    return row


# ---------------------------------------------------------------- baseline choice, rows, tables


@pytest.mark.parametrize(
    ("cl", "nchw", "expected"),
    [
        (10.0, 12.0, "channels_last"),
        (12.0, 10.0, "contiguous"),
        (10.0, 10.0, "channels_last"),  # a tie goes to channels_last
        (None, 10.0, "contiguous"),  # an errored layout never wins
        (10.0, None, "channels_last"),
        (None, None, None),
    ],
)
def test_choose_baseline_is_the_faster_measured_layout(cl, nchw, expected) -> None:
    row = fake_row(cl, nchw, 5.0)
    assert bm.choose_baseline(row.measurements) == expected
    assert row.baseline_layout == expected
    if expected is None:
        assert row.baseline is None and row.speedup is None
    else:
        assert row.speedup == pytest.approx(min(v for v in (cl, nchw) if v is not None) / 5.0)


def test_swapped_never_counts_as_a_baseline() -> None:
    row = fake_row(20.0, 30.0, 1.0)
    assert bm.choose_baseline(row.measurements) == "channels_last"
    assert fake_row(20.0, 30.0, None).speedup is None


def test_row_json_fields() -> None:
    d = fake_row(12.0, 9.0, 6.0, compiled=True).as_dict()
    assert d["baseline_layout"] == "contiguous" and d["mode"] == "compile"
    assert (d["baseline_ms"], d["swapped_ms"], d["speedup"]) == (9.0, 6.0, 1.5)
    assert (d["baseline_peak_mib"], d["swapped_peak_mib"]) == (1000.0, 1010.0)
    assert (d["baseline_compile_s"], d["swapped_compile_s"]) == (12.0, 12.0)
    assert (d["swapped"], d["fused"]) == (24, 22) and d["errors"] == {}
    assert set(d["measurements"]) == {"channels_last", "contiguous", "swapped"}
    json.dumps(d)  # serializable


def test_markdown_table() -> None:
    report = ModelsReport(
        date="2026-12-01 10:00 UTC",
        command="python -m gn_module.bench models --compile",
        device={"cuda": True, "name": "NVIDIA H200", "sm_count": 132, "torch": "2.13"},
        settings={"steps": 20, "warmup": 5},
        rows=[fake_row(12.0, 9.0, 6.0), fake_row(8.0, None, 10.0, compiled=True), fake_row(5.0, 6.0, None)],
        skipped={"tv_resnet50_gn": "`import torchvision` failed: ModuleNotFoundError"},
    )
    md = bm.render_markdown_report(report)
    assert md.startswith("### 2026-12-01 10:00 UTC: models, NVIDIA H200\n")
    assert "- Command: `python -m gn_module.bench models --compile`" in md
    header = (
        "| model | precision | mode | baseline layout | baseline ms | other layout ms | swapped ms | speedup "
        "| peak MiB baseline | peak MiB swapped | swapped/fused | compile s baseline | compile s swapped |"
    )
    assert header in md
    assert "| vae | bf16 | eager | NCHW | 9.00 | 12.00 | 6.00 | 1.50x | 1000 | 1010 | 24/22 | - | - |" in md
    assert (
        "| vae | bf16 | compile | CL | 8.00 | - | 10.00 | 0.80x | 1000 | 1010 | 24/22 | 12.0 | 12.0 |" in md
    )
    assert "| vae | bf16 | eager | CL | 5.00 | 6.00 | error | - | 1000 | - | 24/22 | - | - |" in md
    assert "- tv_resnet50_gn: skipped, `import torchvision` failed: ModuleNotFoundError" in md
    assert "- vae bf16 compile contiguous: OutOfMemoryError: CUDA out of memory" in md
    assert "- vae bf16 eager swapped: OutOfMemoryError: CUDA out of memory" in md
    # Without compile rows there are no compile columns; the console table has the same rows.
    eager = dataclasses.replace(report, rows=report.rows[:1], skipped={})
    assert "compile s" not in bm.render_markdown_report(eager)
    assert "NCHW" in bm.render_console(eager) and "1.50x" in bm.render_console(eager)


def test_plan_orders_eager_then_compile_rows() -> None:
    args = bm.build_parser().parse_args(
        ["--models", "vae,unet", "--precisions", "fp32,bf16", "--compile", "--compile-models", "unet"]
    )
    assert bm.plan(args) == [
        ("vae", "fp32", False),
        ("vae", "bf16", False),
        ("unet", "fp32", False),
        ("unet", "bf16", False),
        ("unet", "fp32", True),
        ("unet", "bf16", True),
    ]
    args = bm.build_parser().parse_args(["--compile", "--no-eager", "--compile-precisions", "bf16"])
    assert bm.plan(args) == [(m, "bf16", True) for m in bm.MODEL_NAMES]


def test_time_steps_cpu_counts_every_step() -> None:
    calls = []
    times = bm.time_steps(lambda: calls.append(1), 3, torch.device("cpu"))
    assert len(times) == 3 == len(calls) and all(t >= 0 for t in times)


# ---------------------------------------------------------------- the CLI on the CPU


def run_json(tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    out = tmp_path / "models.json"
    md = tmp_path / "models.md"
    rc = bench_cli.main(["models", *CPU, *args, "--json", str(out), "--markdown", str(md)])
    return rc, json.loads(out.read_text()), md.read_text()


def test_cli_tiny_cpu_rows(tmp_path: Path) -> None:
    rc, data, md = run_json(tmp_path, "--models", "vae,unet", "--precisions", "fp32,bf16")
    assert rc == 0
    assert data["settings"]["steps"] == 2 and data["settings"]["warmup"] == 1 and data["settings"]["tiny"]
    assert data["device"]["cuda"] is False and data["command"].startswith("python -m gn_module.bench models")
    rows = {(r["model"], r["precision"]): r for r in data["rows"]}
    assert set(rows) == {("vae", "fp32"), ("vae", "bf16"), ("unet", "fp32"), ("unet", "bf16")}
    for r in rows.values():
        assert r["mode"] == "eager" and r["errors"] == {}
        assert r["baseline_layout"] in ("channels_last", "contiguous")
        layouts = {k: r["measurements"][k]["median_ms"] for k in ("channels_last", "contiguous")}
        assert r["baseline_ms"] == min(layouts.values()) == layouts[r["baseline_layout"]]
        assert r["swapped_ms"] > 0 and r["speedup"] == pytest.approx(r["baseline_ms"] / r["swapped_ms"])
        assert r["baseline_peak_mib"] is None and r["swapped_peak_mib"] is None  # CPU: no peak memory
        assert r["baseline_compile_s"] is None
        for m in r["measurements"].values():
            assert len(m["times_ms"]) == 2 and m["first_step_s"] > 0 and math.isfinite(m["last_loss"])
        # Same seed, same batch: the first step's loss is the same in every configuration.
        losses = [m["first_loss"] for m in r["measurements"].values()]
        assert max(losses) == pytest.approx(min(losses), rel=1e-2 if r["precision"] == "bf16" else 1e-5)
    # Our VAE calls SiLU in forward (diffusers style): swapped, fused only with --fuse-calls.
    assert (rows["vae", "fp32"]["swapped"], rows["vae", "fp32"]["fused"]) == (24, 0)
    # examples/train_unet.py's UNet puts GroupNorm -> SiLU in nn.Sequential: every one fused.
    assert rows["unet", "fp32"]["swapped"] == rows["unet", "fp32"]["fused"] > 0
    assert "| model | precision | mode | baseline layout |" in md and md.count("| unet |") == 2


def test_cli_fuse_calls_and_compile(tmp_path: Path) -> None:
    rc, data, md = run_json(
        tmp_path, "--models", "vae", "--precisions", "fp32", "--fuse-calls", "--compile", "--no-eager",
        "--compile-backend", "eager",
    )  # fmt: skip
    assert rc == 0 and data["settings"]["fuse_calls"] is True
    (row,) = data["rows"]
    assert row["mode"] == "compile" and row["errors"] == {}
    assert row["swapped"] == 24 and row["fused"] == 22  # all but the two attention GroupNorms
    assert row["measurements"]["swapped"]["rewritten"] > 0
    assert row["baseline_compile_s"] > 0 and row["swapped_compile_s"] > 0
    assert "compile s baseline" in md


def test_unavailable_model_is_skipped_with_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reason = model_zoo._import_reason("gn_module_no_such_package")
    assert reason is not None and "ModuleNotFoundError" in reason and "gn_module_no_such_package" in reason
    assert model_zoo._import_reason("math") is None
    monkeypatch.setitem(bm.MODELS, "vae", dataclasses.replace(bm.MODELS["vae"], unavailable=lambda: reason))
    rc, data, md = run_json(tmp_path, "--models", "vae", "--precisions", "fp32,bf16")
    assert rc == bm.EXIT_NOTHING_MEASURED == 1
    assert data["rows"] == [] and data["skipped"] == {"vae": reason}
    assert f"- vae: skipped, {reason}" in md


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.SiLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).mean((2, 3))


def _oom_when_swapped(model: nn.Module, batch: dict) -> torch.Tensor:
    if any(isinstance(m, gn_module.GroupNorm) for m in model.modules()):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return model(batch["x"]).square().mean()


def test_per_configuration_errors_do_not_stop_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = bm.ModelSpec(
        "vae",  # replaces the real entry for this test
        "tiny net that runs out of memory when swapped",
        lambda tiny: TinyNet(),
        lambda tiny, n, gen: {"x": torch.randn(n, 3, 8, 8, generator=gen)},
        _oom_when_swapped,
        batch=2,
        tiny_batch=2,
    )
    monkeypatch.setitem(bm.MODELS, "vae", spec)
    rc, data, md = run_json(tmp_path, "--models", "vae", "--precisions", "fp32,bf16", "--steps", "3")
    assert rc == 0  # the baselines were measured
    for r in data["rows"]:
        assert r["errors"] == {"swapped": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}
        assert r["baseline_ms"] > 0 and r["swapped_ms"] is None and r["speedup"] is None
        assert r["swapped"] == 1 and r["fused"] == 1  # converted before it failed
        assert len(r["measurements"]["channels_last"]["times_ms"]) == 3
    assert "| error | - |" in md and "- vae fp32 eager swapped: OutOfMemoryError" in md


@pytest.mark.parametrize(
    "args",
    [
        ["--models", "resnet9000"],
        ["--precisions", "fp8"],
        ["--steps", "0"],
        ["--warmup", "0"],
        ["--batch", "0"],
        ["--no-eager"],
        ["--device", "banana"],
    ],
)
def test_bad_arguments_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_cli.main(["models", *args])
    assert exc.value.code == 2
    assert "python -m gn_module.bench models: error:" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit status")
def test_no_cuda_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_cli.main(["models", "--models", "vae"]) == bench_cli.EXIT_NO_CUDA == 3
    assert "no CUDA device" in capsys.readouterr().err


def test_module_entry_point_help() -> None:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "gn_module.bench", "models", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--fuse-calls" in proc.stdout and "timm_resnet50_gn" in proc.stdout and "--tiny" in proc.stdout


def test_diffusers_models_tiny(tmp_path: Path) -> None:
    pytest.importorskip("diffusers", exc_type=ImportError)
    rc, data, _ = run_json(tmp_path, "--models", "diffusers_vae", "--precisions", "fp32")
    assert rc == 0
    (row,) = data["rows"]
    assert row["errors"] == {} and row["swapped"] > 0 and row["speedup"] > 0
