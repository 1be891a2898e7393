"""CPU smoke tests of `python -m gn_module.bench models` (gn_module.bench.models): tiny models, perf_counter
timing."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import gn_module
from gn_module.bench import cli as bench_cli
from gn_module.bench import gn_share as gs
from gn_module.bench import model_zoo
from gn_module.bench import models as bm
from gn_module.bench.gn_share import GnShare
from gn_module.bench.models import Measurement, ModelsReport, Row
from gn_module.bench.report import checks_lines
from gn_module.bench.targets import TargetCheck
from gn_module.convert import convert_groupnorm

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


@pytest.mark.parametrize(
    ("steps", "rounds", "sizes"),
    [(20, 5, [4, 4, 4, 4, 4]), (7, 3, [3, 2, 2]), (2, 5, [1, 1]), (3, 1, [3]), (1, 2, [1])],
)
def test_round_sizes_split_the_steps_evenly(steps: int, rounds: int, sizes: list[int]) -> None:
    assert bm.round_sizes(steps, rounds) == sizes


def _trainer(config: str, order: list[str], fail_on: int | None = None) -> bm.Trainer:
    calls = iter(range(1, 100))

    def step() -> torch.Tensor:
        order.append(config)
        if next(calls) == fail_on:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return torch.tensor(1.0)

    return bm.Trainer(Measurement(config), step)


def test_time_rounds_alternates_configurations_and_rotates_the_first() -> None:
    order: list[str] = []
    trainers = [_trainer(c, order) for c in bm.CONFIGS]
    bm.time_rounds(trainers, bm.Settings(steps=6, rounds=3), torch.device("cpu"))
    cl, nchw, sw = bm.CONFIGS
    assert order == [cl, cl, nchw, nchw, sw, sw, nchw, nchw, sw, sw, cl, cl, sw, sw, cl, cl, nchw, nchw]
    for t in trainers:
        m = bm.finish(t, torch.device("cpu"))
        assert len(m.times_ms) == 6 and len(m.round_ms) == 3 and m.last_loss == 1.0
        assert m.median_ms == sorted(m.round_ms)[1]  # the median of the round medians
        assert t.step is None  # finish() lets the model go


def test_time_rounds_a_failing_configuration_drops_out() -> None:
    order: list[str] = []
    cl, nchw, sw = bm.CONFIGS
    trainers = [_trainer(cl, order), _trainer(nchw, order), _trainer(sw, order, fail_on=3)]
    bm.time_rounds(trainers, bm.Settings(steps=6, rounds=3), torch.device("cpu"))
    assert order.count(sw) == 3 and order.count(cl) == order.count(nchw) == 6
    failed = bm.finish(trainers[2], torch.device("cpu"))
    assert failed.error == "OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB"
    assert failed.times_ms == [] and failed.median_ms is None and not failed.ok
    assert all(bm.finish(t, torch.device("cpu")).ok for t in trainers[:2])


# ---------------------------------------------------------------- GroupNorm's share: synthetic events


@dataclasses.dataclass(eq=False)
class Kern:
    name: str
    duration: float  # us


@dataclasses.dataclass(eq=False)
class Op:
    """The FunctionEvent attributes gn_share reads; `op` links children to their parent."""

    name: str
    cpu_time_total: float = 0.0
    kernels: list[Kern] = dataclasses.field(default_factory=list)
    cpu_children: list[Op] = dataclasses.field(default_factory=list)
    cpu_parent: Op | None = None


def op(name: str, *children: Op, us: float = 0.0, kernels: tuple[tuple[str, float], ...] = ()) -> Op:
    node = Op(name, us, [Kern(k, d) for k, d in kernels], list(children))
    for c in children:
        c.cpu_parent = node
    return node


def flatten(*roots: Op) -> list[Op]:
    out: list[Op] = []
    for r in roots:
        out += [r, *flatten(*r.cpu_children)]
    return out


def _contiguous(copy_us: float, cpu_us: float = 0.0) -> Op:
    """torch's channels_last -> NCHW copy: contiguous > clone > copy_, the kernel on copy_."""
    return op(
        "aten::contiguous",
        op(
            "aten::clone",
            op(
                "aten::copy_",
                us=cpu_us / 2,
                kernels=(("elementwise_kernel<copy>", copy_us),) if copy_us else (),
            ),
        ),
        us=cpu_us,
    )


def step_events() -> list[Op]:
    """One synthetic bf16 step on CUDA: conv -> GroupNorm (autocast) -> LayerNorm, then the backward."""
    forward = op(
        "aten::group_norm",  # autocast's: casts to fp32, then calls aten::group_norm again
        op("aten::to", op("aten::_to_copy", op("aten::copy_", kernels=(("cast_bf16_fp32", 5.0),)))),
        op(
            "aten::group_norm",
            _contiguous(30.0),
            op(
                "aten::native_group_norm",
                kernels=(("RowwiseMomentsCUDAKernel<float>", 10.0), ("GroupNorm4dForward", 20.0)),
            ),
        ),
    )
    backward = op(
        "autograd::engine::evaluate_function: NativeGroupNormBackward0",
        op(
            "NativeGroupNormBackward0",
            _contiguous(15.0),
            op(
                "aten::native_group_norm_backward",
                kernels=(("ComputeInternalGradientsCUDAKernel", 12.0), ("GammaBetaBackwardCUDAKernel", 8.0)),
            ),
        ),
        op("aten::add_", kernels=(("add_kernel", 7.0),)),  # the engine summing a residual's gradients
    )
    others = [
        op("aten::conv2d", op("aten::cudnn_convolution", kernels=(("sm90_xmma_fprop", 100.0),))),
        op(
            "aten::layer_norm",
            op("aten::native_layer_norm", kernels=(("RowwiseMomentsCUDAKernel<float>", 9.0),)),
        ),
    ]
    return flatten(others[0], forward, others[1], backward)


def test_gn_share_attributes_kernels_by_their_op_not_their_name() -> None:
    share = gs.gn_share(step_events() + step_events(), steps=2)
    assert share.source == gs.DEVICE_SOURCE and share.steps == 2
    assert share.forward_ms == pytest.approx(0.030)  # RowwiseMoments + apply, per step
    assert share.backward_ms == pytest.approx(0.020)
    assert share.copy_ms == pytest.approx(0.050)  # the cast and both contiguous copies
    assert share.total_ms == pytest.approx(0.100)
    assert (share.forward_calls, share.backward_calls) == (1, 1)  # nested ops count once
    # LayerNorm's RowwiseMoments, the convolution and the engine's add_ are not GroupNorm's...
    assert share.named_elsewhere_ms == pytest.approx(0.009)  # ...but the look-alike is reported
    assert share.top_kernels[0] == ("elementwise_kernel<copy>", pytest.approx(0.045))
    assert dict(share.top_kernels)["RowwiseMomentsCUDAKernel<float>"] == pytest.approx(0.010)
    d = share.as_dict()
    assert d["total_ms"] == pytest.approx(0.1) and d["top_kernels"][0]["name"] == "elementwise_kernel<copy>"
    json.dumps(d)


def test_gn_roots_are_the_outermost_groupnorm_ops() -> None:
    roots = gs.gn_roots(step_events())
    assert [r.name for r in roots] == ["aten::group_norm", "NativeGroupNormBackward0"]
    assert roots[0].cpu_parent is None and roots[1].cpu_parent is not None  # under evaluate_function


def test_gn_share_on_the_cpu_counts_op_time() -> None:
    forward = op(
        "aten::group_norm", _contiguous(0.0, cpu_us=40.0), op("aten::native_group_norm", us=100.0), us=150.0
    )
    backward = op("NativeGroupNormBackward0", op("aten::native_group_norm_backward", us=200.0), us=210.0)
    share = gs.gn_share(
        flatten(op("aten::conv2d", us=500.0), forward, backward), steps=1, source=gs.CPU_SOURCE
    )
    assert share.source == gs.CPU_SOURCE
    assert share.copy_ms == pytest.approx(0.040)  # contiguous once, not again for clone and copy_
    assert share.forward_ms == pytest.approx(0.110) and share.backward_ms == pytest.approx(0.210)
    assert share.top_kernels == () and share.named_elsewhere_ms == 0


def _device(name: str, us: float) -> SimpleNamespace:
    """A device-side event as torch's profiler lists it: its own event, device_type CUDA, no parent op."""
    return SimpleNamespace(
        name=name,
        device_type="DeviceType.CUDA",
        time_range=SimpleNamespace(start=1000.0, end=1000.0 + us),
        cpu_parent=None,
        cpu_children=(),
        kernels=(),
        cpu_time_total=0.0,
    )


def test_gn_share_sums_the_device_events_and_our_own_kernels() -> None:
    ours = [
        _device("void gn::fwd_task_onepass<__half, 8, true>(gn::GnArgs)", 6.0),
        _device("_ZN2gn14bwd_tile_statsI6__halfLi8ELb1EEEvNS_6GnArgsE", 9.0),
    ]
    others = [_device("sm90_xmma_fprop", 100.0), _device("Memcpy DtoD (Device -> Device)", 5.0)]
    cpu_side = step_events()  # its kernels hang on ops: not device events, so not counted twice
    share = gs.gn_share(cpu_side + ours + others + ours, steps=2)
    assert share.own_ms == pytest.approx(0.015) and share.own_launches == 2
    assert share.device_ms == pytest.approx((2 * 15.0 + 105.0) / 2 / 1000)
    assert share.total_ms == pytest.approx(0.050)  # torch's GroupNorm (per step of 2) as before
    assert not gs.OWN_KERNEL_NAME.search("at::native::GroupNorm4dForward") and not gs.OWN_KERNEL_NAME.search(
        "elementwise_kernel<copy>"
    )
    d = share.as_dict()
    assert d["own_ms"] == pytest.approx(0.015) and d["device_ms"] > d["own_ms"]
    cpu = gs.gn_share(cpu_side, steps=1, source=gs.CPU_SOURCE)
    assert cpu.device_ms == 0 and cpu.own_ms == 0


def test_gn_share_counts_launch_calls_and_our_custom_ops() -> None:
    # a compiled step's host side: Triton's driver launches, our ops (the backward nests the forward's
    # name nowhere, but a custom op inside another counts once), and their launches
    fwd = op("gn_module::group_norm_fwd", op("cudaLaunchCooperativeKernel", us=4.0), us=60.0)
    bwd = op(
        "gn_module::group_norm_bwd",
        op("gn_module::group_norm_fwd", us=1.0),  # (nested: not a second call)
        op("cudaLaunchKernelExC", us=5.0),
        op("cudaLaunchKernel", us=4.0),
        us=90.0,
    )
    events = flatten(op("cuLaunchKernel", us=3.0), fwd, op("cuLaunchKernel", us=3.0), bwd)
    share = gs.gn_share(events, steps=2)
    assert share.launch_calls == pytest.approx(5 / 2)
    assert share.own_op_calls == 1 and share.own_op_host_ms == pytest.approx(0.075)
    d = share.as_dict()
    assert (d["launch_calls"], d["own_op_calls"], d["own_op_host_ms"]) == (2.5, 1, pytest.approx(0.075))
    torch_only = gs.gn_share(step_events(), steps=1)
    assert torch_only.own_op_calls == 0 and torch_only.own_op_host_ms == 0


def test_host_submit_ms_times_the_issue_of_each_step() -> None:
    calls = []

    def step() -> None:
        calls.append(1)
        time.sleep(0.002)

    ms = bm.host_submit_ms(step, 3, torch.device("cpu"))
    assert len(calls) == 3 and 2.0 <= ms < 1000.0
    assert bm.host_submit_ms(step, 0, torch.device("cpu")) >= 2.0 and len(calls) == 4  # at least one


def test_gn_share_without_groupnorm_is_zero() -> None:
    share = gs.gn_share(flatten(op("aten::conv2d", kernels=(("conv", 5.0),))), steps=3)
    assert share.total_ms == 0 and share.forward_calls == 0


@pytest.mark.parametrize(("steps", "source"), [(0, gs.DEVICE_SOURCE), (1, "gpu")])
def test_gn_share_rejects_bad_arguments(steps: int, source: str) -> None:
    with pytest.raises(ValueError, match=r"^(steps|source) must be"):
        gs.gn_share([], steps=steps, source=source)


def test_profile_gn_on_the_cpu_finds_torch_groupnorm() -> None:
    model = TinyNet().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)

    def step() -> None:
        model(x).sum().backward()

    share = gs.profile_gn(step, 2, torch.device("cpu"))
    assert share.source == gs.CPU_SOURCE and share.steps == 2
    assert (share.forward_calls, share.backward_calls) == (1, 1) and share.total_ms > 0


# ---------------------------------------------------------------- model criteria


def gn(total_ms: float) -> GnShare:
    return GnShare(gs.DEVICE_SOURCE, 3, total_ms / 2, total_ms / 4, total_ms / 4, 24, 24, 0.0)


def statuses(rows: list[Row], judged: bool = True) -> dict[tuple[str, str, str, str], str]:
    return {(c.case, c.dtype, c.direction, c.target): c.status for c in bm.check_criteria(rows, judged)}


def test_gpu_busy_speedup_and_host_bound_steps() -> None:
    # baseline 12 ms of wall time: 10 ms of GPU busy is device-bound, 6 ms host-bound (HOST_BOUND_RATIO 1.5)
    rows = []
    for busy in (10.0, 6.0):
        row = fake_row(12.0, 14.0, 11.0)
        row.gn = dataclasses.replace(gn(4.0), device_ms=busy)
        row.gn_swapped = dataclasses.replace(gn(0.0), device_ms=busy / 1.25)
        rows.append(row)
    device_bound, host_bound = rows
    assert device_bound.busy_speedup == pytest.approx(1.25) and host_bound.busy_speedup == pytest.approx(1.25)
    assert device_bound.host_bound is False and host_bound.host_bound is True
    assert fake_row(12.0, 14.0, 11.0).busy_speedup is None and fake_row(12.0, 14.0, 11.0).host_bound is None
    header, body = bm.table(rows)
    column = header.index("GPU-busy speedup")
    assert [cells[column] for cells in body] == ["1.25x", "1.25x host-bound"]
    data = host_bound.as_dict()
    assert data["busy_speedup"] == pytest.approx(1.25) and data["host_bound"] is True


def test_compile_rows_busy_time_comes_from_their_baseline_layouts_profile() -> None:
    """Compile rows have no torch GroupNorm share; each configuration's step is profiled, and the
    baseline's busy time is the faster layout's (here NCHW, 9 ms against CL 12 ms)."""
    row = fake_row(12.0, 9.0, 18.0, compiled=True)
    row.busy = {
        "channels_last": dataclasses.replace(gn(0.0), device_ms=11.0),
        "contiguous": dataclasses.replace(gn(0.0), device_ms=8.0),
        bm.SWAPPED: dataclasses.replace(gn(0.0), device_ms=10.0),
    }
    row.gn_swapped = row.busy[bm.SWAPPED]
    assert row.baseline_busy is row.busy["contiguous"] and row.busy_speedup == pytest.approx(0.8)
    assert row.host_bound is False  # 9 ms of wall time for 8 of busy
    header, body = bm.table([row])
    assert body[0][header.index("GPU busy ms baseline/swapped")] == "8.00/10.00"
    assert body[0][header.index("GN ms")] == "-" and body[0][header.index("saved/GN")] == "-"
    assert row.as_dict()["baseline_device_ms"] == 8.0 and row.gn_share is None


def test_criteria_saved_time_against_groupnorm_time() -> None:
    passing, missing, unprofiled = fake_row(12.0, 14.0, 9.0), fake_row(12.0, 14.0, 9.0), fake_row(12, 14, 9)
    passing.gn, missing.gn = gn(4.0), gn(5.0)  # saved 3 ms: 0.75 and 0.6 of t_GN
    assert passing.saved_ms == 3.0 and passing.gn_removed == pytest.approx(0.75)
    assert passing.gn_share == pytest.approx(4.0 / 12.0)
    assert [
        statuses([r])["vae", "bf16", "eager", "saved / t_GN"] for r in (passing, missing, unprofiled)
    ] == [
        "PASS",
        "MISS",
        "n/a",
    ]
    slower = fake_row(10.0, 12.0, 11.0)
    slower.gn = gn(2.0)
    assert (
        slower.gn_removed == pytest.approx(-0.5)
        and statuses([slower])["vae", "bf16", "eager", "speedup"] == "MISS"
    )


def test_criteria_speedup_vae_and_memory() -> None:
    fast, ok = fake_row(17.0, 20.0, 10.0), fake_row(15.0, 20.0, 10.0)  # 1.7x and 1.5x
    fp32 = dataclasses.replace(fake_row(15.0, 20.0, 10.0), precision="fp32")
    unet = dataclasses.replace(fake_row(15.0, 20.0, 10.0), model="unet")
    assert statuses([fast])["vae", "bf16", "eager", "speedup (AutoencoderKL-style VAE, bf16)"] == "PASS"
    assert statuses([ok])["vae", "bf16", "eager", "speedup (AutoencoderKL-style VAE, bf16)"] == "MISS"
    assert statuses([ok])["vae", "bf16", "eager", "speedup"] == "PASS"
    for other in (fp32, unet):  # the 1.6x target is the vae's, in bf16
        assert not any("AutoencoderKL" in key[3] for key in statuses([other]))
    # fake_row's swapped peak is 10 MiB above the baseline's: a miss; lower or equal passes.
    peak = ("vae", "bf16", "eager", "peak memory swapped / baseline")
    assert statuses([ok])[peak] == "MISS"
    ok.measurements["swapped"].peak_mib = 1000.0
    assert statuses([ok])[peak] == "PASS"
    ok.measurements["swapped"].peak_mib = None  # CPU runs: no peak memory
    assert statuses([ok])[peak] == "n/a"
    assert statuses([fake_row(12.0, 9.0, None)])["vae", "bf16", "eager", "speedup"] == "n/a"


def test_a_peak_just_above_a_nchw_baseline_reads_as_a_miss_with_the_layouts_share() -> None:
    """Session 23: under reduce-overhead the VAE's swapped peak was 1303.29 MiB against 1301.28 for the NCHW
    baseline and 1303.28 for channels_last. The line must not read "= 1 (target <= 1)", and it names the
    channels_last baseline's ratio (the layout the swap needs)."""
    row = fake_row(42.71, 42.15, 35.51, compiled=True)  # the NCHW baseline is the faster
    peaks = {"channels_last": 1303.28, "contiguous": 1301.28, "swapped": 1303.29}
    for config, mib in peaks.items():
        row.measurements[config].peak_mib = mib
    (peak,) = [c for c in bm.check_criteria([row]) if c.target == "peak memory swapped / baseline"]
    assert peak.status == "MISS" and peak.note == "swapped / channels_last baseline 1.0000"
    (line,) = [ln for ln in checks_lines([peak])]
    assert line == (
        "MISS  vae bf16 compile: peak memory swapped / baseline = 1.002 "
        "(target <= 1; swapped / channels_last baseline 1.0000)"
    )
    row.measurements["contiguous"].median_ms = 50.0  # a channels_last baseline's ratio needs no note
    row.measurements["swapped"].peak_mib = 1303.28
    (cl_peak,) = [c for c in bm.check_criteria([row]) if c.target == "peak memory swapped / baseline"]
    assert cl_peak.note == "" and checks_lines([cl_peak])[0] == (
        "PASS  vae bf16 compile: peak memory swapped / baseline = 1 (target <= 1)"
    )


def test_check_values_show_the_digits_that_decide_them() -> None:
    def line(value: float, threshold: float = 1.0, higher: bool = False) -> str:
        return checks_lines([TargetCheck("m", "bf16", "eager", "t", value, threshold, higher)])[0]

    assert line(1.0004).endswith("t = 1.0004 (target <= 1)") and line(1.0004).startswith("MISS")
    assert line(0.99996).endswith("t = 0.99996 (target <= 1)") and line(0.99996).startswith("PASS")
    assert line(1.0).endswith("t = 1 (target <= 1)")
    assert line(1.23456).endswith("t = 1.23 (target <= 1)")  # (3 digits where they tell it apart)
    assert line(1.6 - 1e-12, 1.6, True).startswith("MISS")


def test_speedup_checks_name_the_per_round_range() -> None:
    """Session 34: on a noisy host one row read 0.75x and its rerun 1.29x. Eager configurations take
    turns round by round, so each round's baseline / swapped is a paired sample; the speedup's note gives
    their range, and the JSON keeps them."""
    row = fake_row(30.0, 36.0, 25.0)
    row.measurements["channels_last"].round_ms = [30.0, 29.0, 45.0]
    row.measurements["swapped"].round_ms = [25.0, 29.0, 25.0]
    assert row.round_speedups == pytest.approx([1.2, 1.0, 1.8])
    (check,) = [c for c in bm.check_criteria([row]) if c.target == "speedup"]
    assert check.note == "per round 1.00-1.80, median 1.20" and check.value == pytest.approx(1.2)
    assert checks_lines([check])[0].endswith("(target >= 1; per round 1.00-1.80, median 1.20)")
    assert row.as_dict()["round_speedups"] == pytest.approx([1.2, 1.0, 1.8])
    row.measurements["swapped"].round_ms = [25.0, 29.0]  # rounds that do not pair (an error): none
    assert row.round_speedups == []
    assert next(c for c in bm.check_criteria([row]) if c.target == "speedup").note == ""
    compiled = fake_row(30.0, 36.0, 25.0, compiled=True)  # compile rows take turns too (session 37)
    compiled.measurements["channels_last"].round_ms = [2.0, 3.0]
    compiled.measurements["swapped"].round_ms = [1.0, 2.0]
    assert compiled.round_speedups == pytest.approx([2.0, 1.5])


def test_gn_free_bound_lowers_a_speedup_target_to_its_limit_fraction() -> None:
    """--gn-free: baseline ms / GN-free channels_last ms bounds any swap on channels_last; a speedup target
    above 0.9 x that bound becomes 0.9 x the bound (issue 13's rule for measured limits)."""
    low = fake_row(12.0, 10.0, 10.4)  # NCHW baseline 10 ms; the GN-free channels_last step 11 ms
    low.measurements[bm.GN_FREE] = fake(bm.GN_FREE, 11.0)
    assert low.gn_free_bound == pytest.approx(10.0 / 11.0)
    checks = {c.target: c for c in bm.check_criteria([low])}
    limited = next(t for t in checks if t.startswith("speedup, 0.9 x the GN-free bound 0.91x (target 1)"))
    assert checks[limited].threshold == pytest.approx(0.9 * 10.0 / 11.0, abs=1e-3)
    assert checks[limited].status == "PASS"  # 10 / 10.4 = 0.96 >= 0.82
    vae = next(t for t in checks if t.startswith("speedup (AutoencoderKL-style VAE, bf16), 0.9 x"))
    assert checks[vae].threshold == checks[limited].threshold
    high = fake_row(12.0, 10.0, 9.0)  # the bound 2x: the targets stand
    high.measurements[bm.GN_FREE] = fake(bm.GN_FREE, 5.0)
    targets = {c.target: c.threshold for c in bm.check_criteria([high])}
    assert targets["speedup"] == bm.EAGER_SPEEDUP_MIN
    assert targets["speedup (AutoencoderKL-style VAE, bf16)"] == bm.VAE_BF16_SPEEDUP_MIN
    assert fake_row(12.0, 10.0, 9.0).gn_free_bound is None  # not measured: no bound
    header, body = bm.table([low, high])
    assert header[8:10] == ["GN-free CL ms", "GN-free bound"] and body[0][8:10] == ["11.00", "0.91x"]


def test_without_groupnorm_keeps_the_activation() -> None:
    class NormAct(nn.GroupNorm):  # timm's GroupNormAct: GroupNorm with its activation module
        def __init__(self) -> None:
            super().__init__(2, 4)
            self.act = nn.SiLU()

    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.GroupNorm(2, 4), nn.Sequential(NormAct(), nn.ReLU()))
    bm.without_groupnorm(model)
    assert [type(m).__name__ for m in model.modules()] == [
        "Sequential", "Conv2d", "Identity", "Sequential", "SiLU", "ReLU"
    ]  # fmt: skip


def test_gn_free_model_drops_the_activations_the_swap_fused_and_keeps_the_rest() -> None:
    """Session 67 noticed the identity step kept a fused activation as a pass of its own, so a swap that
    fuses it could beat that "bound". The GN-free model is now the swapped one with its GroupNorms costing
    nothing: a SiLU fused into one goes with it; a Tanh (no epilogue) and the activation of a GroupNorm the
    swap skipped stay, as they run in the swapped step too."""

    class NormAct(nn.GroupNorm):  # not timm's class: the swap leaves this subclass alone
        def __init__(self) -> None:
            super().__init__(2, 4)
            self.act = nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.act(super().forward(x))

    def build() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Conv2d(3, 4, 1), nn.GroupNorm(2, 4), nn.SiLU(), nn.GroupNorm(2, 4), nn.Tanh(), NormAct()
        )

    for torch_dtypes in (False, True):
        free = bm.gn_free_model(build(), bm.Settings(), torch_dtypes=torch_dtypes)
        stand_in = "TorchDtypeCast" if torch_dtypes else "Identity"
        names = [type(m).__name__ for m in free.children()]
        assert names[:3] == ["Conv2d", stand_in, "SiLUSlot"] and names[3:5] == [stand_in, "Tanh"]
        assert [type(m).__name__ for m in free[5].modules()][-1] == "ReLU"  # the skipped subclass's act stays
        x = torch.randn(2, 3, 5, 5)
        assert torch.equal(free(x), torch.relu(torch.tanh(free[0](x))))
    swapped, _ = convert_groupnorm(build())
    assert [type(m).__name__ for m in swapped.children()][1:3] == ["GroupNorm", "SiLUSlot"]
    assert swapped[1].act == "silu" and swapped[3].act is None  # what the GN-free model stands in for


def test_gn_free_model_drops_a_silu_call_the_swap_fused() -> None:
    """--fuse-calls: a diffusers-style block calls F.silu on its GroupNorm's output in forward; the swap
    fuses the call into our GroupNorm, so the GN-free step has neither (session 68's VAE row)."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.norm = nn.Conv2d(3, 4, 1), nn.GroupNorm(2, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.silu(self.norm(self.conv(x))) + 1.0

    x = torch.randn(2, 3, 5, 5)
    free = bm.gn_free_model(Block(), bm.Settings(fuse_calls=True))
    assert torch.equal(free(x), free.conv(x) + 1.0)  # no GroupNorm, no SiLU
    kept = bm.gn_free_model(Block(), bm.Settings())  # calls not fused: the SiLU stays
    assert torch.equal(kept(x), torch.nn.functional.silu(kept.conv(x)) + 1.0)


def test_torch_dtype_cast_returns_the_dtype_torch_group_norm_returns() -> None:
    """The GN-free stand-in with torch's dtypes, on the CPU: its autocast has no float32 rule for
    group_norm, so x itself, as torch's GroupNorm (CUDA's float32: tests/gpu/test_bench_models_gpu.py)."""
    cast, gn = bm.TorchDtypeCast(), nn.GroupNorm(2, 4)
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(2, 4, 3, 3, dtype=dtype)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert cast(x) is x and gn(x).dtype == dtype
        assert cast(x) is x


def test_without_groupnorm_with_torch_dtypes_casts_then_keeps_the_activation() -> None:
    class NormAct(nn.GroupNorm):
        def __init__(self) -> None:
            super().__init__(2, 4)
            self.act = nn.SiLU()

    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.GroupNorm(2, 4), nn.Sequential(NormAct(), nn.ReLU()))
    bm.without_groupnorm(model, torch_dtypes=True)
    assert [type(m).__name__ for m in model.modules()] == [
        "Sequential", "Conv2d", "TorchDtypeCast", "Sequential", "Sequential", "TorchDtypeCast", "SiLU", "ReLU"
    ]  # fmt: skip
    x = torch.randn(1, 3, 4, 4)
    assert torch.equal(model(x), torch.relu(torch.nn.functional.silu(model[0](x))))


@pytest.mark.parametrize(
    ("kw", "precision", "expected"),
    [
        ({}, "bf16", ()),
        ({"gn_free": True}, "bf16", (bm.GN_FREE, bm.GN_FREE_DTYPES)),
        ({"gn_free": True}, "fp32", (bm.GN_FREE,)),  # the cast is identity there
        ({"gn_free": True, "fuse_calls": True}, "bf16", (bm.GN_FREE, bm.GN_FREE_DTYPES)),  # fused ones go too
        ({"gn_free": True, "autocast_output": "input"}, "bf16", (bm.GN_FREE,)),  # not torch's dtypes
    ],
)
def test_gn_free_configs_time_the_dtype_bound_only_where_the_swap_keeps_torch_dtypes(
    kw: dict, precision: str, expected: tuple[str, ...]
) -> None:
    assert bm.gn_free_configs(bm.Settings(**kw), precision) == expected


def test_the_dtype_bound_is_the_limit_where_it_was_timed() -> None:
    """With both GN-free steps timed, the bound is the lower one (the cast's), and a target it lowers says
    so; the table shows both steps."""
    row = fake_row(12.0, 10.0, 7.0)
    row.measurements[bm.SWAPPED].conversion = {"swapped": 52, "fused": 0}  # the VAE's defaults
    row.measurements[bm.GN_FREE] = fake(bm.GN_FREE, 5.0)  # identity: 2x
    row.measurements[bm.GN_FREE_DTYPES] = fake(bm.GN_FREE_DTYPES, 6.5)  # the cast: 1.54x
    assert row.gn_free_bound == pytest.approx(10.0 / 6.5) and row.gn_free_limit == bm.GN_FREE_DTYPES
    vae = next(c for c in bm.check_criteria([row]) if c.target.startswith("speedup (AutoencoderKL"))
    expected = "speedup (AutoencoderKL-style VAE, bf16), 0.9 x the GN-free (torch's dtypes) bound 1.54x"
    assert vae.target == expected + " (target 1.6)"
    assert vae.threshold == pytest.approx(0.9 * 10.0 / 6.5, abs=1e-3) and vae.status == "PASS"  # 1.43 >= 1.38
    header, body = bm.table([row, fake_row(12.0, 10.0, 9.0)])
    assert header[8:11] == ["GN-free CL ms", "GN-free dtypes CL ms", "GN-free bound"]
    assert body[0][8:11] == ["5.00", "6.50", "1.54x"] and body[1][8:11] == ["-", "-", "-"]
    only_identity = fake_row(12.0, 10.0, 7.0)
    only_identity.measurements[bm.GN_FREE] = fake(bm.GN_FREE, 5.0)
    assert only_identity.gn_free_limit == bm.GN_FREE and only_identity.gn_free_bound == pytest.approx(2.0)
    assert fake_row(12.0, 10.0, 7.0).gn_free_limit is None
    fused = fake_row(12.0, 10.0, 7.0)  # activations fused: both steps drop them too, so both still bound
    fused.measurements[bm.SWAPPED].conversion = {"swapped": 4, "fused": 2}
    fused.measurements[bm.GN_FREE] = fake(bm.GN_FREE, 5.0)
    fused.measurements[bm.GN_FREE_DTYPES] = fake(bm.GN_FREE_DTYPES, 6.5)
    assert fused.gn_free_limit == bm.GN_FREE_DTYPES and fused.gn_free_bound == pytest.approx(10.0 / 6.5)


def test_criteria_compile_rows_check_speed_and_memory_and_cpu_runs_are_not_judged() -> None:
    """Issue 13: at least 1.0x under torch.compile, and no more peak memory (no GN share there)."""
    compiled = fake_row(12.0, 9.0, 6.0, compiled=True)
    assert list(statuses([compiled])) == [
        ("vae", "bf16", "compile", "speedup"),
        ("vae", "bf16", "compile", "peak memory swapped / baseline"),
    ]
    checks = {c.target: c for c in bm.check_criteria([compiled, fake_row(12.0, 9.0, 10.0, compiled=True)])}
    assert checks["speedup"].threshold == bm.COMPILE_SPEEDUP_MIN
    slow = [c for c in bm.check_criteria([fake_row(12.0, 9.0, 10.0, compiled=True)]) if c.target == "speedup"]
    assert [c.status for c in slow] == ["MISS"]  # 9 / 10 = 0.9x
    assert set(statuses([fake_row(12.0, 9.0, 6.0)], judged=False).values()) == {"reported"}


def test_report_shows_groupnorm_columns_and_criteria() -> None:
    row = fake_row(12.0, 14.0, 9.0)
    row.gn = gn(4.0)
    row.gn_swapped = gs.GnShare(
        gs.DEVICE_SOURCE, 3, 0, 0, 0, 0, 0, 0, device_ms=6.5, own_ms=1.25, own_launches=106
    )
    failed = fake_row(10.0, 14.0, 9.0)
    failed.gn_error = "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"
    report = ModelsReport(
        date="2026-12-01 10:00 UTC",
        command="python -m gn_module.bench models",
        device={"cuda": True, "name": "NVIDIA H200", "sm_count": 132, "torch": "2.13"},
        settings={"steps": 20, "warmup": 5, "rounds": 5},
        rows=[row, failed],
    )
    md = bm.render_markdown_report(report)
    assert (
        "| speedup | GN ms | GN share | saved ms | saved/GN | ours GN ms | GPU busy ms baseline/swapped "
        "| GPU-busy speedup | peak MiB baseline |" in md
    )
    busy = f"{row.gn.device_ms:.2f}/6.50 | 0.00x"  # (gn(): no device events)
    assert (
        "| vae | bf16 | eager | CL | 12.00 | 14.00 | 9.00 | 1.33x | 4.00 | 33% | 3.00 | 0.75 | 1.25 | "
        f"{busy} | 1000 |" in md
    )
    assert "| 1.11x | error | - | - | - | - | - | - | 1000 |" in md
    assert "ours GN ms: gn_module's kernels in the swapped step" in md
    assert report.as_dict()["rows"][0]["ours_gn_ms"] == 1.25
    assert "- vae bf16 eager GroupNorm profile: RuntimeError: CUPTI_ERROR_NOT_INITIALIZED" in md
    assert "GN ms: device time of the CUDA kernels launched inside torch's GroupNorm ops" in md
    assert "from 3 profiled steps" in md and "20 timed steps in 5 rounds" in md
    assert "Model criteria (issue 13): 3 pass, 4 miss, 1 n/a:" in md
    assert "- PASS  vae bf16 eager: saved / t_GN = 0.75 (target >= 0.7)" in md
    assert "- MISS  vae bf16 eager: speedup (AutoencoderKL-style VAE, bf16) = 1.33 (target >= 1.6)" in md
    assert "- n/a   vae bf16 eager: saved / t_GN = missing (target >= 0.7)" in md
    console = bm.render_console(report)
    assert (
        "GN share" in console and "  MISS  vae bf16 eager: peak memory swapped / baseline = 1.01" in console
    )
    data = report.as_dict()
    assert data["criteria_summary"] == {"PASS": 3, "MISS": 4, "n/a": 1, "reported": 0}
    r = data["rows"][0]
    assert (r["gn_ms"], r["saved_ms"], r["saved_over_gn"], r["gn_source"]) == (4.0, 3.0, 0.75, "cuda kernels")
    assert r["gn_profile"]["forward_calls"] == 24 and data["rows"][1]["gn_error"].startswith("RuntimeError")
    json.dumps(data)


# ---------------------------------------------------------------- the CLI on the CPU


def run_json(tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    out = tmp_path / "models.json"
    md = tmp_path / "models.md"
    rc = bench_cli.main(["models", *CPU, *args, "--json", str(out), "--markdown", str(md)])
    return rc, json.loads(out.read_text()), md.read_text()


def test_cli_tiny_cpu_rows(tmp_path: Path) -> None:
    # the unet row loads examples/train_unet.py, which needs lightning (CI installs it; without it the row is
    # skipped with that reason, so only the vae rows are expected)
    models = ("vae", "unet") if importlib.util.find_spec("lightning") else ("vae",)
    rc, data, md = run_json(tmp_path, "--models", ",".join(models), "--precisions", "fp32,bf16")
    assert rc == 0
    assert data["settings"]["steps"] == 2 and data["settings"]["warmup"] == 1 and data["settings"]["tiny"]
    assert data["settings"]["rounds"] == 2 and data["settings"]["profile_gn"] == 1
    assert data["device"]["cuda"] is False and data["command"].startswith("python -m gn_module.bench models")
    rows = {(r["model"], r["precision"]): r for r in data["rows"]}
    assert set(rows) == {(m, p) for m in models for p in ("fp32", "bf16")}
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
            assert m["round_ms"] == m["times_ms"]  # two rounds of one step
        # The baseline profiled on the CPU: op time, every GroupNorm layer found forward and backward.
        gn = r["gn_profile"]
        assert r["gn_source"] == gn["source"] == "cpu ops" and gn["steps"] == 1 and r["gn_ms"] > 0
        assert gn["forward_calls"] == gn["backward_calls"] == r["swapped"]
        assert r["saved_ms"] == pytest.approx(r["baseline_ms"] - r["swapped_ms"])
        assert r["saved_over_gn"] == pytest.approx(r["saved_ms"] / r["gn_ms"])
        assert r["gn_share"] == pytest.approx(r["gn_ms"] / r["baseline_ms"])
        assert set(r["host_ms"]) == {r["baseline_layout"], "swapped"} and min(r["host_ms"].values()) > 0
        # Same seed, same batch: the first step's loss is the same in every configuration.
        losses = [m["first_loss"] for m in r["measurements"].values()]
        assert max(losses) == pytest.approx(min(losses), rel=1e-2 if r["precision"] == "bf16" else 1e-5)
    # Our VAE calls SiLU in forward (diffusers style): swapped, fused only with --fuse-calls.
    assert (rows["vae", "fp32"]["swapped"], rows["vae", "fp32"]["fused"]) == (24, 0)
    assert "| model | precision | mode | baseline layout |" in md
    if "unet" in models:
        # examples/train_unet.py's UNet puts GroupNorm -> SiLU in nn.Sequential: every one fused.
        assert rows["unet", "fp32"]["swapped"] == rows["unet", "fp32"]["fused"] > 0
        assert md.count("| unet |") == 2
    assert (
        "| GN ms | GN share | saved ms | saved/GN |" in md
        and "GN ms: CPU time of torch's GroupNorm ops" in md
    )
    # On the CPU the criteria are reported, not judged.
    assert {c["status"] for c in data["criteria"]} == {"reported"}
    criteria = len(rows) * 3 + 1  # + vae bf16 1.6x
    assert data["criteria_summary"]["reported"] == len(data["criteria"]) == criteria
    assert f"Model criteria (issue 13): {criteria} reported, not judged (CPU run):" in md


def test_cli_gn_free_rows(tmp_path: Path) -> None:
    rc, data, md = run_json(
        tmp_path, "--models", "vae", "--precisions", "fp32", "--gn-free", "--profile-gn", "0"
    )
    assert rc == 0 and data["settings"]["gn_free"] is True
    (row,) = data["rows"]
    free = row["measurements"][bm.GN_FREE]
    assert free["median_ms"] > 0 and len(free["times_ms"]) == 2 and free["conversion"] is None
    assert row["gn_free_ms"] == free["median_ms"]
    assert row["gn_free_bound"] == pytest.approx(row["baseline_ms"] / free["median_ms"])
    assert "| GN-free CL ms | GN-free bound |" in md and "GN-free bound = baseline ms / GN-free CL ms" in md


def test_cli_gn_free_dtypes_rows(tmp_path: Path) -> None:
    rc, data, md = run_json(
        tmp_path, "--models", "vae", "--precisions", "bf16,fp32", "--gn-free", "--profile-gn", "0"
    )
    rows = {r["precision"]: r for r in data["rows"]}
    assert rc == 0 and set(rows["bf16"]["measurements"]) > {bm.GN_FREE, bm.GN_FREE_DTYPES}
    assert bm.GN_FREE_DTYPES not in rows["fp32"]["measurements"] and rows["fp32"]["gn_free_dtypes_ms"] is None
    bf16 = rows["bf16"]
    assert bf16["gn_free_dtypes_ms"] == bf16["measurements"][bm.GN_FREE_DTYPES]["median_ms"] > 0
    slower = max(bf16["gn_free_ms"], bf16["gn_free_dtypes_ms"])
    assert bf16["gn_free_bound"] == pytest.approx(bf16["baseline_ms"] / slower)
    assert bf16["gn_free_limit"] in (bm.GN_FREE, bm.GN_FREE_DTYPES)
    assert (
        "| GN-free CL ms | GN-free dtypes CL ms | GN-free bound |" in md and "torch's GroupNorm returns" in md
    )


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
    # compile rows: no torch GroupNorm share, but each configuration's step profiled for its busy time
    assert row["gn_profile"] is None and row["gn_ms"] is None and row["saved_over_gn"] is None
    assert row["swapped_profile"] is not None and row["baseline_device_ms"] is not None
    assert "| GPU busy ms baseline/swapped |" in md
    assert [c["target"] for c in data["criteria"]] == ["speedup", "peak memory swapped / baseline"]
    # and the host's time to issue each configuration's compiled step
    assert set(row["host_ms"]) == {"channels_last", "contiguous", "swapped"}
    assert all(v > 0 for v in row["host_ms"].values())
    assert "| host issue ms baseline/swapped | launch calls baseline/swapped |" in md


def test_compile_rows_compile_each_then_take_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compile rows alternate their configurations round by round, as eager rows do (the one going first
    rotates), after each has compiled: a host-bound compiled step follows the host's drifting speed."""
    order: list[str] = []
    timed_round = bm._timed_round
    monkeypatch.setattr(bm, "_timed_round", lambda t, *a: order.append(t.m.config) or timed_round(t, *a))
    rc, data, _ = run_json(
        tmp_path, "--models", "vae", "--precisions", "fp32", "--compile", "--no-eager", "--compile-backend",
        "eager", "--steps", "3", "--rounds", "3", "--profile-gn", "0",
    )  # fmt: skip
    assert rc == 0
    cl, nchw, ours = "channels_last", "contiguous", "swapped"
    assert order == [cl, nchw, ours, nchw, ours, cl, ours, cl, nchw]
    (row,) = data["rows"]
    assert row["recompiled"] is False and row["errors"] == {}
    assert all(len(m["times_ms"]) == 3 for m in row["measurements"].values())
    assert len(row["round_speedups"]) == 3  # (paired: baseline / swapped of each round)


@pytest.mark.parametrize("compiled", [False, True])
def test_one_baseline_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compiled: bool) -> None:
    """--baseline-layouts contiguous: no channels_last model is built (nor compiled); the baseline is NCHW's
    step, and the report says it was the only layout timed."""
    built: list[str] = []
    prepare = bm.prepare
    monkeypatch.setattr(
        bm, "prepare", lambda spec, config, *a: built.append(config) or prepare(spec, config, *a)
    )
    extra = ["--compile", "--no-eager", "--compile-backend", "eager"] if compiled else []
    rc, data, md = run_json(
        tmp_path, "--models", "vae", "--precisions", "fp32", "--baseline-layouts", "contiguous",
        "--profile-gn", "0", *extra,
    )  # fmt: skip
    assert rc == 0 and built == ["contiguous", "swapped"]
    (row,) = data["rows"]
    assert row["baseline_layout"] == "contiguous" and set(row["measurements"]) == {"contiguous", "swapped"}
    assert row["baseline_ms"] == row["measurements"]["contiguous"]["median_ms"]
    assert data["settings"]["baseline_layouts"] == ["contiguous"]
    assert "Baseline = NCHW with torch's GroupNorm (the only layout timed" in md


def test_baseline_layouts_are_checked() -> None:
    with pytest.raises(SystemExit):
        bm.build_parser().parse_args(["--baseline-layouts", "nhwc"])
    args = bm.build_parser().parse_args(["--baseline-layouts", "contiguous,contiguous"])
    assert bm.settings_from_args(args).baseline_layouts == ("contiguous",)
    assert bm.settings_from_args(bm.build_parser().parse_args([])).baseline_layouts == bm.BASELINE_LAYOUTS


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


def tiny_spec(loss: Callable[[nn.Module, dict], torch.Tensor]) -> bm.ModelSpec:
    return bm.ModelSpec(
        "vae",  # replaces the real entry for this test
        "tiny net that runs out of memory when swapped",
        lambda tiny: TinyNet(),
        lambda tiny, n, gen: {"x": torch.randn(n, 3, 8, 8, generator=gen)},
        loss,
        batch=2,
        tiny_batch=2,
    )


def test_per_configuration_errors_do_not_stop_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(bm.MODELS, "vae", tiny_spec(_oom_when_swapped))
    rc, data, md = run_json(tmp_path, "--models", "vae", "--precisions", "fp32,bf16", "--steps", "3")
    assert rc == 0  # the baselines were measured
    for r in data["rows"]:
        assert r["errors"] == {"swapped": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}
        assert r["baseline_ms"] > 0 and r["swapped_ms"] is None and r["speedup"] is None
        assert r["swapped"] == 1 and r["fused"] == 1  # converted before it failed
        assert len(r["measurements"]["channels_last"]["times_ms"]) == 3
        assert r["gn_profile"]["forward_calls"] == 1 and r["saved_ms"] is None and r["saved_over_gn"] is None
    assert "| error | - |" in md and "- vae fp32 eager swapped: OutOfMemoryError" in md


def test_profile_gn_0_turns_profiling_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(bm.MODELS, "vae", tiny_spec(lambda model, b: model(b["x"]).square().mean()))
    rc, data, md = run_json(tmp_path, "--models", "vae", "--precisions", "fp32", "--profile-gn", "0")
    assert rc == 0 and data["settings"]["profile_gn"] == 0
    (row,) = data["rows"]
    assert row["gn_profile"] is None and row["gn_ms"] is None and row["saved_ms"] is not None
    assert "GN ms" not in md


@pytest.mark.parametrize(
    "args",
    [
        ["--models", "resnet9000"],
        ["--precisions", "fp8"],
        ["--steps", "0"],
        ["--warmup", "0"],
        ["--batch", "0"],
        ["--rounds", "0"],
        ["--profile-gn", "-1"],
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


@pytest.mark.parametrize(
    ("setting", "built", "route"),
    [(None, True, "C++ node"), ("1", False, "Python"), ("0", True, "Python")],
)
def test_the_report_names_the_training_route(monkeypatch, setting, built, route):
    from gn_module import autograd_node

    if setting is None:
        monkeypatch.delenv(autograd_node.ENV, raising=False)
    else:
        monkeypatch.setenv(autograd_node.ENV, setting)
    monkeypatch.setattr(autograd_node, "load", lambda: object() if built else None)
    assert bm.training_route().startswith(route)
