"""scripts/step_kernels.py without a GPU: how kernels are keyed by their launching op, that launches the
profiler linked to no op still count, the rendered difference, and a clear exit without CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "step_kernels.py"
sk = load_script("step_kernels")


@dataclass
class Span:
    start: float
    end: float


@dataclass
class Kernel:
    name: str
    duration: float  # microseconds, as the profiler's


@dataclass
class Event:
    name: str
    cpu_parent: Event | None = None
    kernels: list[Kernel] = field(default_factory=list)
    device_type: str | None = None
    time_range: Span | None = None


def _device(name: str, us: float) -> Event:
    return Event(name, device_type="DeviceType.CUDA", time_range=Span(0.0, us))


def test_kernels_are_keyed_by_autograd_node_or_outermost_op() -> None:
    node = Event(sk.NODE_PREFIX + "ConvolutionBackward0")
    conv_bwd = Event("aten::convolution_backward", node, [Kernel("void dgrad<1>(int)", 300.0)])
    conv = Event("aten::conv2d")
    cudnn = Event("aten::cudnn_convolution", conv, [Kernel("void fprop(int)", 100.0)])
    events = [
        node,
        conv_bwd,
        conv,
        cudnn,
        _device("void dgrad<1>(int)", 300.0),
        _device("void fprop(int)", 100.0),
    ]
    table = sk.kernel_table(events, steps=2)
    assert table == {
        ("bwd ConvolutionBackward0", "dgrad<1>(int)"): 0.15,
        ("fwd aten::conv2d", "fprop(int)"): 0.05,
    }


def test_launches_linked_to_no_op_still_count() -> None:
    # The profiler linked none of gn_module's forward launches to a CPU op in session 36's VAE profile.
    conv = Event("aten::conv2d", kernels=[Kernel("void fprop(int)", 100.0)])
    events = [conv, _device("void fprop(int)", 100.0), _device("void gn::fwd_task(GnArgs)", 40.0)]
    table = sk.kernel_table(events, steps=1)
    assert table[(sk.UNLINKED, "gn::fwd_task(GnArgs)")] == 0.04
    assert sum(table.values()) == 0.14


def test_render_sorts_by_the_difference_of_the_first_two_configurations() -> None:
    a = {("fwd x", "k1"): 1.0, ("fwd x", "k2"): 3.0}
    b = {("fwd x", "k1"): 2.0}
    lines = sk.render({"swapped": a, "gn_free": b}, top=5).splitlines()
    assert lines[0] == "total ms/step: swapped 4.00, gn_free 2.00"
    rows = [line for line in lines if line.startswith("fwd x")]
    assert "k2" in rows[0] and rows[0].rstrip().endswith("3.000")
    assert "k1" in rows[1] and rows[1].rstrip().endswith("-1.000")


def test_without_cuda_it_exits_3_with_a_reason() -> None:
    if torch.cuda.is_available():
        return  # the GPU machine profiles for real
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 3
    assert "needs a CUDA device" in done.stderr
