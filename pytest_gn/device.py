"""The local CUDA device as the plugin sees it: limits, build variant, real one-pass residency."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from gn_module import schedule
from gn_module.schedule import DeviceLimits

#: Representative channel counts per kernel configuration: aligned (vector loads) and unaligned.
CONFIG_CHANNELS = {"vec": 128, "scalar": 30}
DTYPE_NAMES = ("float16", "bfloat16", "float32")


def kernel_configs() -> list[tuple[str, str, schedule.Tiling]]:
    """(config name, torch dtype name, tiling) of every one-pass kernel configuration."""
    from pytest_gn.cases import onepass_config

    out = []
    for direction in schedule.DIRECTIONS:
        for dtype in DTYPE_NAMES:
            for channels, groups in ((CONFIG_CHANNELS["vec"], 16), (CONFIG_CHANNELS["scalar"], 10)):
                t = schedule.tiling(channels, groups, 1 << 30, schedule.ITEMSIZE[dtype], direction)
                out.append((onepass_config(direction, dtype, t.vec), dtype, t))
    return out


def task_kernel_configs() -> list[tuple[str, str, schedule.TaskTiling]]:
    """(config name, torch dtype name, task tiling) of every configuration of the task architecture's
    kernel that gives each kind of task case its residency (`pytest_gn.cases.TASK_KERNELS`:
    fwd_task_onepass, bwd_task_stats, bwd_task_onepass; vectors and the scalar path, each dtype), then
    the wide launches' (float16/bfloat16 x with float32 y and dy: vectors only, the forward and the
    two-launch backward); the tiling's direction says which direction, its wide_itemsize whether wide."""
    from pytest_gn.cases import DTYPES, TASK_KERNELS, WIDE_DTYPES, task_config

    out = []
    for kind in TASK_KERNELS:
        direction = "fwd" if kind == "fwd" else "bwd"
        for dtype in DTYPE_NAMES:
            for channels, groups in ((CONFIG_CHANNELS["vec"], 16), (CONFIG_CHANNELS["scalar"], 10)):
                t = schedule.task_tiling(channels, groups, 1 << 30, schedule.ITEMSIZE[dtype], direction)
                assert t is not None
                out.append((task_config(dtype, t.vec, kind), dtype, t))
    for kind in ("fwd", "bwd"):
        for dtype in (DTYPES[d] for d in WIDE_DTYPES):
            t = schedule.task_tiling(CONFIG_CHANNELS["vec"], 16, 1 << 30, 2, kind, wide_itemsize=4)
            assert t is not None
            out.append((task_config(dtype, t.vec, kind, wide=True), dtype, t))
    return out


MAIN_CONFIGS = ("fwd_onepass[fp16,vec8]", "bwd_onepass[fp16,vec8]")
#: The task architecture's configurations the sweep matrix shows (fp16, C=128): forward, backward.
MAIN_TASK_CONFIGS = ("fwd_task_onepass[fp16,vec8]", "bwd_task_stats[fp16,vec8]")


@dataclass
class GnDevice:
    """What `gn_device` yields: the device, its per-SM limits and each one-pass config's residency."""

    index: int | str  # CUDA ordinal ("cpu" only in the plugin's CPU tests)
    name: str
    cc: tuple[int, int]
    sm_count: int
    limits: DeviceLimits
    total_memory: int
    build: str  # "native (sm_90)" or the variant name
    residency: dict[str, int] = field(default_factory=dict)  # config -> co-resident blocks (occupancy API)
    error: str | None = None  # why residency could not be read (build failure)

    @property
    def arch(self) -> str:
        return f"sm_{self.cc[0]}{self.cc[1]}"


def worker_gpu_index(device_count: int, worker: str | None = None) -> int | None:
    """GPU of an xdist worker: gw0 -> 0, gw1 -> 1, ... modulo the device count (None: not a worker)."""
    worker = worker if worker is not None else os.environ.get("PYTEST_XDIST_WORKER")
    if not worker or device_count < 1:
        return None
    digits = "".join(ch for ch in worker if ch.isdigit())
    return int(digits) % device_count if digits else None


def cuda_unavailable_reason() -> str | None:
    """None when a usable CUDA device exists, else why not (torch missing, CPU build, no GPU)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False (no GPU or driver)"
    return None


def select_worker_gpu() -> int | None:
    """Under pytest-xdist put each worker on its own GPU (round robin); returns the index set."""
    import torch

    index = worker_gpu_index(torch.cuda.device_count())
    if index is not None:
        torch.cuda.set_device(index)
    return index


def local_device(with_residency: bool = True) -> GnDevice:
    """Describe the current CUDA device; residency comes from the CUDA occupancy API via gn_module."""
    import torch

    from gn_module.profiles import limits_from_properties

    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    limits = limits_from_properties(props)
    dev = GnDevice(
        index=index, name=props.name, cc=limits.cc, sm_count=limits.sm_count, limits=limits,
        total_memory=int(props.total_memory), build=f"native ({limits.arch})",
    )  # fmt: skip
    if with_residency:
        fill_residency(dev)
    return dev


def fill_residency(dev: GnDevice) -> None:
    """Read each one-pass configuration's residency from the occupancy API (builds gn_module)."""
    try:
        from gn_module import ops

        variant = ops.current_variant()
        if variant:
            dev.build = f"PTX {variant}"
        for name, dtype, t in kernel_configs():
            dev.residency[name] = ops.onepass_residency(t, dtype, dev.index)
    except Exception as exc:  # a build failure must not hide the device line
        dev.error = f"{type(exc).__name__}: {exc}"


def free_memory(device: GnDevice) -> int:
    """Free bytes on the device. A device whose index is "cpu" (the plugin's own CPU tests put
    one in place of a GPU) reports its total_memory as free."""
    if device.index == "cpu":
        return device.total_memory
    import torch

    return int(torch.cuda.mem_get_info(device.index)[0])


def release_memory(device: GnDevice) -> None:
    """Hand this process's cached, unused device memory back to the driver (other processes and
    xdist workers on the same GPU see it as free)."""
    if device.index == "cpu":
        return
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()


def describe_limits(limits: DeviceLimits) -> str:
    return (
        f"{limits.max_threads_per_sm} threads/SM, {limits.max_blocks_per_sm} blocks/SM, "
        f"{limits.smem_per_sm // 1024} KB smem/SM, {limits.regs_per_sm // 1024}K regs/SM"
    )


def device_info(dev: GnDevice) -> dict[str, Any]:
    return {"name": dev.name, "cc": list(dev.cc), "sm_count": dev.sm_count, "build": dev.build}
