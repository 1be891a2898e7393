"""Facts about the GPU a benchmark ran on: name, driver, SM count, clocks, memory, L2.

Used for pytest-benchmark's machine_info and the header of `python -m gn_module.bench` reports.
Every field is best effort: a missing property or a missing nvidia-smi leaves the field out.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

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
