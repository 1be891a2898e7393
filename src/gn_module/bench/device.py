"""Facts about the GPU a benchmark ran on: name, driver, SM count, clocks, memory, L2.

Two kinds of fact, kept apart because pytest-benchmark warns on every compare whose ``machine_info``
differs from the saved run's:

* identity (`machine_identity`): what names the machine kind and software stack (GPU name, compute
  capability, SMs, memory, driver, CUDA, torch). This is ``machine_info``; two fresh machines of the
  same kind give the same identity.
* run conditions (`run_conditions`): clocks and power limit read now, and measured values such as the
  copy bandwidth. They go into each benchmark's ``extra_info``.

Every field is best effort: a missing property or a missing nvidia-smi leaves the field out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

#: Environment variable naming the GPU a run is meant for (scripts/gpu_call.sh reads the same one).
EXPECT_GPU_ENV = "GN_EXPECT_GPU"

#: nvidia-smi query fields -> our keys (clocks in MHz).
SMI_FIELDS = {
    "driver_version": "driver_version",
    "clocks.sm": "sm_clock_mhz",
    "clocks.mem": "mem_clock_mhz",
    "clocks.max.sm": "max_sm_clock_mhz",
    "clocks.max.mem": "max_mem_clock_mhz",
    "power.limit": "power_limit_w",
}


def parse_smi_line(line: str) -> dict[str, str]:
    """One csv,noheader,nounits line of `nvidia-smi --query-gpu` -> our keys ('[N/A]' fields dropped)."""
    values = [v.strip() for v in line.split(",")]
    if len(values) != len(SMI_FIELDS):
        raise ValueError(f"expected {len(SMI_FIELDS)} fields from nvidia-smi, got {line!r}")
    return {key: v for key, v in zip(SMI_FIELDS.values(), values, strict=True) if v and "N/A" not in v}


def nvidia_smi_info(index: int) -> dict[str, str]:
    """Driver version and clocks of GPU `index` from nvidia-smi ({} when unavailable).

    The index is the CUDA one; it matches nvidia-smi's when CUDA_VISIBLE_DEVICES is unset.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    cmd = [exe, f"--id={index}", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout
        return parse_smi_line(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}


def device_info(device: Any = None) -> dict[str, Any]:
    """Properties of a CUDA device, plus torch/CUDA versions; {'cuda': False} without CUDA."""
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda}
    if not torch.cuda.is_available():
        info["cuda"] = False
        return info
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    info.update(
        cuda=True,
        index=index,
        name=props.name,
        compute_capability=f"{props.major}.{props.minor}",
        sm_count=props.multi_processor_count,
        total_memory_gib=round(props.total_memory / 2**30, 2),
    )
    for attr, key, scale in (
        ("L2_cache_size", "l2_mib", 2**-20),
        ("clock_rate", "sm_clock_max_mhz_props", 1e-3),  # kHz in cudaDeviceProp
        ("memory_clock_rate", "mem_clock_mhz_props", 1e-3),
        ("memory_bus_width", "memory_bus_width_bits", 1),
    ):
        value = getattr(props, attr, None)
        if value:
            info[key] = round(value * scale, 2)
    info.update(nvidia_smi_info(index))
    return info


#: device_info keys that identify the machine kind and software stack.
IDENTITY_KEYS = (
    "cuda",
    "name",
    "compute_capability",
    "sm_count",
    "total_memory_gib",
    "driver_version",
    "cuda_runtime",
    "torch",
)
#: device_info keys read at run time that may differ between two machines of one kind.
CONDITION_KEYS = ("sm_clock_mhz", "mem_clock_mhz", "max_sm_clock_mhz", "max_mem_clock_mhz", "power_limit_w")
#: pytest-benchmark's own machine_info fields that name the platform. The others (host name, kernel
#: release, py-cpuinfo's CPU brand and clocks, Python build date) change between fresh machines of
#: the same kind, so they are dropped.
PLATFORM_KEYS = ("system", "machine", "python_implementation", "python_version")


def machine_identity(info: dict[str, Any]) -> dict[str, Any]:
    """The identity part of `device_info` (see the module docstring)."""
    return {key: info[key] for key in IDENTITY_KEYS if key in info}


def run_conditions(info: dict[str, Any]) -> dict[str, Any]:
    """The run-time part of `device_info`: clocks and power limit as read now."""
    return {key: info[key] for key in CONDITION_KEYS if key in info}


def stable_machine_info(machine_info: dict[str, Any], gpu: dict[str, Any]) -> None:
    """Reduce pytest-benchmark's `machine_info` in place to the platform keys plus the GPU identity."""
    for key in list(machine_info):
        if key not in PLATFORM_KEYS:
            del machine_info[key]
    machine_info["gpu"] = machine_identity(gpu)


def unexpected_gpu(name: str | None, expected: str | None = None) -> str | None:
    """Why a run on the GPU called `name` must stop, or None to go on.

    `expected` (default: the GN_EXPECT_GPU environment variable) is text the GPU's name must hold, case
    aside, e.g. "H200"; unset or empty accepts any GPU. A lent machine may be another kind than the one a
    history or a comparison is meant for: this stops such a run before it measures anything.
    """
    want = os.environ.get(EXPECT_GPU_ENV, "") if expected is None else expected
    if not want or (name is not None and want.lower() in name.lower()):
        return None
    return f"the GPU is {name or 'none'!r}, not {want} ({EXPECT_GPU_ENV}); nothing was measured"


def device_label(info: dict[str, Any]) -> str:
    """Short one-line description for report headers."""
    if not info.get("cuda"):
        return f"no CUDA device (torch {info.get('torch')})"
    parts = [str(info.get("name", "unknown GPU")), f"{info.get('sm_count', '?')} SMs"]
    if "compute_capability" in info:
        parts.append(f"CC {info['compute_capability']}")
    if "driver_version" in info:
        parts.append(f"driver {info['driver_version']}")
    parts.append(f"torch {info.get('torch', '?')} (CUDA {info.get('cuda_runtime', '?')})")
    return ", ".join(parts)
