"""CUDA launcher: torch custom ops around the C library, the local-device schedule, residency caps.

The launch numbers all come from `gn_module.schedule` (`plan` below); this module only asks the
CUDA occupancy API how many one-pass blocks the device holds and fills `GnArgs` from the plan.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import struct
import threading
import weakref
from collections.abc import Callable, Iterator

import torch
from torch.autograd import forward_ad as _forward_ad

from gn_module import _abi, autograd_node, build, op_kernels, schedule
from gn_module.schedule import KernelResources, Plan, Tiling

ENV_CAP = "GN_MAX_RESIDENT_BLOCKS"
#: Kernel architecture: "tasks+bwd" (the default: forward and backward on csrc/gn_tasks.cuh, per-task
#: tiles held in shared memory, persistent teams), "tasks" (the task forward, the backward on the tile
#: kernels: the default from 23c9d03 until the task backward passed the GPU suite, its plugin and sweep
#: overflow cases and the sanitizers in session 6) or "tiles" (tile partials + reduction levels for both).
#: "tasks+bwd1": "tasks+bwd" with the task backward's one-pass kernel where a task fits on chip (opt-in
#: until it passes the GPU suite; the same bits as the two launches).
ENV_ARCH = "GN_ARCH"
ARCHS = ("tiles", "tasks", "tasks+bwd", "tasks+bwd1")
TASK_BACKWARD_ARCHS = ("tasks+bwd", "tasks+bwd1")


class NoWideLaunch(RuntimeError):
    """The kernels have no wide launch (float16/bfloat16 x, float32 y or dy) for this call."""


DEFAULT_ARCH = "tasks+bwd"

# Caps and variants are process-wide (not thread-local): autograd runs backward on its own thread.
_settings_lock = threading.Lock()
_caps: list[list] = []  # [k, replace] entries, innermost last (removed by identity)
_variants: list[str | None] = []
_records: list[dict] = []
_poison: list[bool] = []
_traces: list[torch.Tensor] = []
#: The C++ op kernels (gn_module.op_kernels) once registered: told when what `_launch` reads changes.
_op_kernels: object | None = None


def _settings_changed() -> None:
    """The settings `_launch` reads, or the launches it cached, changed: the C++ op kernels (where
    registered) drop the launches they keep, and leave calls to the Python bodies while launch records,
    poisoning or phase traces are on."""
    kernels = _op_kernels
    if kernels is not None:
        kernels.op_settings_changed(bool(_records or _poison or _traces))  # type: ignore[attr-defined]


@contextlib.contextmanager
def _pushed(stack: list, item: object) -> Iterator[None]:
    """`item` on top of a settings stack inside the block (thread-safe; taken off by identity)."""
    with _settings_lock:
        stack.append(item)
        _settings_changed()
    try:
        yield
    finally:
        with _settings_lock:
            for i in range(len(stack) - 1, -1, -1):
                if stack[i] is item:
                    del stack[i]
                    break
            _settings_changed()


# ---------------------------------------------------------------- user-facing switches
@contextlib.contextmanager
def max_resident_blocks(k: int, *, replace: bool = False) -> Iterator[None]:
    """Cap every one-pass grid at `k` blocks inside the block (emulates a smaller GPU).

    Overflow tiles are then processed by the resident blocks in the same launch. Results are
    bitwise identical for every k. The env var GN_MAX_RESIDENT_BLOCKS sets a process-wide cap.
    Caps nest to the tightest; ``replace=True`` makes the cap exactly `k` inside the block, outer
    caps and the env var set aside (a test that compares caps can then go above the one in force).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"max_resident_blocks: k must be an int >= 1, got {k!r}")
    with _pushed(_caps, [k, bool(replace)]):
        yield


def _parse_cap(raw: str | bytes | None) -> int | None:
    env = _ENV.decodevalue(raw) if type(raw) is bytes else raw
    if not env:
        return None
    try:
        value = int(env)
    except ValueError:
        raise ValueError(f"{ENV_CAP} must be an integer >= 1, got {env!r}") from None
    if value < 1:
        raise ValueError(f"{ENV_CAP} must be an integer >= 1, got {env!r}")
    return value


def _parse_arch(raw: str | bytes | None) -> str:
    env = _ENV.decodevalue(raw) if type(raw) is bytes else raw
    arch = (env if env is not None else DEFAULT_ARCH).strip() or DEFAULT_ARCH
    if arch not in ARCHS:
        raise ValueError(f"{ENV_ARCH} must be one of {ARCHS}, got {arch!r}")
    return arch


# The two environment variables are read on every call (a test may set them between two calls) but
# parsed once per raw value. os.environ.get decodes on each read (about 0.7 us), so the process
# environment's raw mapping (what os.environ.get decodes) is read instead; a replaced os.environ
# (monkeypatch.setattr(os, "environ", ...)) is read through its own get.
_ENV = os.environ
_ENV_DATA: dict | None = getattr(_ENV, "_data", None)
_RAW_CAP, _RAW_ARCH = (
    (_ENV.encodekey(ENV_CAP), _ENV.encodekey(ENV_ARCH)) if _ENV_DATA is not None else ("", "")
)
_cap_values: dict = {}
_arch_values: dict = {}


def _raw_settings() -> tuple[str | bytes | None, str | bytes | None]:
    env = os.environ
    if env is _ENV and _ENV_DATA is not None:
        return _ENV_DATA.get(_RAW_CAP), _ENV_DATA.get(_RAW_ARCH)
    return env.get(ENV_CAP), env.get(ENV_ARCH)


def _parsed(cache: dict, parse: Callable, raw: str | bytes | None) -> object:
    value = cache.get(raw, cache)
    if value is cache:
        value = parse(raw)  # raises for a bad value, which is then not cached
        if len(cache) > 64:
            cache.clear()
        cache[raw] = value
    return value


def _with_caps(env_cap: int | None) -> int | None:
    if not _caps:
        return env_cap
    cap = None
    for k, replace in reversed(_caps):  # innermost first, down to the innermost replace
        cap = k if cap is None or k < cap else cap
        if replace:
            return cap
    return cap if env_cap is None or cap < env_cap else env_cap


def current_cap() -> int | None:
    """The tightest residency cap in force (context managers and GN_MAX_RESIDENT_BLOCKS)."""
    return _with_caps(_parsed(_cap_values, _parse_cap, _raw_settings()[0]))  # type: ignore[arg-type]


def _settings() -> tuple[int | None, str]:
    """(current_cap(), current_arch()) from one read of the environment; the cap first, so with both
    variables wrong the cap's error comes first, as when the two were called in turn."""
    raw_cap, raw_arch = _raw_settings()
    cap = _cap_values.get(raw_cap, _cap_values)
    if cap is _cap_values:
        cap = _parsed(_cap_values, _parse_cap, raw_cap)
    arch = _arch_values.get(raw_arch) or _parsed(_arch_values, _parse_arch, raw_arch)
    return _with_caps(cap), arch  # type: ignore[arg-type,return-value]


@contextlib.contextmanager
def build_variant(variant: str | None) -> Iterator[None]:
    """Run the ops with another build inside the block: None = native, "compute_80" = PTX-only."""
    build.arch_flags(variant, (0, 0))  # validates the name
    with _pushed(_variants, variant):
        yield


def current_variant() -> str | None:
    return _variants[-1] if _variants else None


class _LaunchSwitch:
    """An on/off launch option: an environment variable ("0" / "1") with a default, overridden by the
    innermost `scoped` block (thread-safe). Read once per new launch signature (part of its cache key)."""

    def __init__(self, env: str, default: bool) -> None:
        self.env, self.default = env, default
        self._stack: list[bool] = []
        self._raw = _ENV.encodekey(env) if _ENV_DATA is not None else ""

    @contextlib.contextmanager
    def scoped(self, enabled: bool = True) -> Iterator[None]:
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
        with _pushed(self._stack, enabled):
            yield

    def enabled(self) -> bool:
        if self._stack:
            return self._stack[-1]
        env = os.environ
        raw = _ENV_DATA.get(self._raw) if env is _ENV and _ENV_DATA is not None else env.get(self.env)
        if raw in ("0", b"0"):
            return False
        return True if raw in ("1", b"1") else self.default


#: On by default (session 16: the GPU suite, 1166 passed, and the plugin's task cases, 217, under it; 1-12 %
#: faster, RESULTS.md): the two-launch task schedules start their apply launch as a programmatic dependent
#: launch where the build runs sm_90 code, so it is scheduled while the stats launch drains and waits on the
#: device for its writes (csrc gn_task_primitives.cuh, gn_dispatch.cuh). GN_DEPENDENT_LAUNCH=0 turns it off.
ENV_DEPENDENT = "GN_DEPENDENT_LAUNCH"
_DEPENDENT = _LaunchSwitch(ENV_DEPENDENT, default=True)
#: On by default (session 17: the GPU suite, 1219 passed, and the plugin's task cases under it; the small
#: one-launch forwards 13.0-13.4 -> 10.6-11.0 us, RESULTS.md): the one-launch forward's teams of at most
#: schedule.CLUSTER_MAX_TEAM blocks run as thread-block clusters where the build runs sm_90 code, and meet
#: at the cluster's hardware barrier instead of an arrival counter and a flag in global memory
#: (csrc fwd_task_cluster). Same plan, same bits. GN_CLUSTER_TEAMS=0 turns it off.
ENV_CLUSTER = "GN_CLUSTER_TEAMS"
_CLUSTER = _LaunchSwitch(ENV_CLUSTER, default=True)
#: On by default (session 24: the GPU suite, 1307 passed, and the plugin's task cases of every profile, 1081,
#: under it; the small backwards whose strips fit 8-18 % faster, the others within 0.4 %, RESULTS.md): the
#: two-launch task backward's apply launch gets blocks of its own for the dweight/dbias strips where they fit
#: beside its grid (schedule.TaskPlan.strip_blocks), so its dx blocks wait for no strip. Same bits.
#: GN_STRIP_BLOCKS=0 turns it off.
ENV_STRIP_BLOCKS = "GN_STRIP_BLOCKS"
_STRIP_BLOCKS = _LaunchSwitch(ENV_STRIP_BLOCKS, default=True)
#: On by default (session 25: the strip tests, 45 passed, and the GPU suite under it; the plugin's cases run
#: without it, pytest_gn.runner.case_context, so that their teams keep the ratio they claim;
#: 2x320x64x64's backward 29.2 -> 27.6 us, 8x320x32x32 29.8 -> 28.1, the plans it leaves alone unchanged,
#: RESULTS.md): with strip blocks on, the two-launch backward's teams take fewer blocks where that leaves
#: room for the strip blocks at no cost to the busiest block (schedule.room_for_strips: 2x320x64x64's 264
#: blocks become 244 + 20 strip blocks). Same bits. GN_STRIP_ROOM=0 turns it off.
ENV_STRIP_ROOM = "GN_STRIP_ROOM"
_STRIP_ROOM = _LaunchSwitch(ENV_STRIP_ROOM, default=True)


def dependent_launches(enabled: bool = True) -> contextlib.AbstractContextManager[None]:
    """Inside the block, the two-launch task schedules use (or, with False, do not use) programmatic
    dependent launches on sm_90+ builds, whatever GN_DEPENDENT_LAUNCH says. Same bits either way."""
    return _DEPENDENT.scoped(enabled)


def dependent_launches_enabled() -> bool:
    """Whether dependent launches are asked for: the innermost `dependent_launches` block, else on
    unless GN_DEPENDENT_LAUNCH=0."""
    return _DEPENDENT.enabled()


def cluster_teams(enabled: bool = True) -> contextlib.AbstractContextManager[None]:
    """Inside the block, the one-launch forward runs its small teams as thread-block clusters (sm_90+
    builds; schedule.cluster_teams_fit says which plans), or with False never, whatever GN_CLUSTER_TEAMS
    says. Same bits either way."""
    return _CLUSTER.scoped(enabled)


def strip_blocks(enabled: bool = True) -> contextlib.AbstractContextManager[None]:
    """Inside the block, the two-launch task backward gives its dweight/dbias strips blocks of their own
    where they fit (schedule.TaskPlan.strip_blocks), or with False never, whatever GN_STRIP_BLOCKS says.
    Same bits either way."""
    return _STRIP_BLOCKS.scoped(enabled)


def strip_blocks_enabled() -> bool:
    """Whether strip blocks are asked for: the innermost `strip_blocks` block, else on unless
    GN_STRIP_BLOCKS=0."""
    return _STRIP_BLOCKS.enabled()


def strip_room(enabled: bool = True) -> contextlib.AbstractContextManager[None]:
    """Inside the block, the two-launch task backward's teams leave room for its strip blocks where that
    costs nothing (schedule.room_for_strips), or with False never, whatever GN_STRIP_ROOM says. Only with
    strip blocks on (`strip_blocks`). Same bits either way."""
    return _STRIP_ROOM.scoped(enabled)


def strip_room_enabled() -> bool:
    """Whether the backward's teams leave room for strip blocks: the innermost `strip_room` block, else
    on unless GN_STRIP_ROOM=0; never without strip blocks."""
    return _STRIP_ROOM.enabled() and strip_blocks_enabled()


def cluster_teams_enabled() -> bool:
    """Whether cluster teams are asked for: the innermost `cluster_teams` block, else on unless
    GN_CLUSTER_TEAMS=0."""
    return _CLUSTER.enabled()


#: The one-launch forward's team stagger, "auto" (the default since session 21: schedule.stagger_fits,
#: schedule.auto_stagger_ns), "NS" or "NS:PHASES", or "0"/"off" (schedule.team_stagger; ops.team_stagger
#: overrides it).
ENV_STAGGER = "GN_TEAM_STAGGER"
_stagger_stack: list[tuple[int, int]] = []


_RAW_STAGGER = _ENV.encodekey(ENV_STAGGER) if _ENV_DATA is not None else ""
_stagger_values: dict = {}


def _parse_stagger(raw: str | bytes | None) -> tuple[int | str, int]:
    if isinstance(raw, bytes):
        raw = raw.decode()
    if not raw:
        return "auto", 2
    if raw == "off":
        return 0, 2
    ns, _, phases = raw.partition(":")
    try:
        value = ns if ns == "auto" else int(ns), int(phases) if phases else 2
    except ValueError:
        choices = "NS, auto, NS:PHASES, auto:PHASES or off"
        raise ValueError(f"{ENV_STAGGER} must be {choices}, got {raw!r}") from None
    if (value[0] != "auto" and value[0] < 0) or value[1] < 1:  # type: ignore[operator]
        raise ValueError(f"{ENV_STAGGER} needs NS >= 0 and PHASES >= 1, got {raw!r}")
    return value  # type: ignore[return-value]


@contextlib.contextmanager
def team_stagger(ns: int | str, phases: int = 2) -> Iterator[None]:
    """Inside the block, team j of a one-launch forward that runs several teams for several rounds starts
    (j % phases) * ns nanoseconds late (schedule.team_stagger), whatever GN_TEAM_STAGGER says; ns=0
    turns it off. ns="auto": passes="auto" also takes the one launch where its teams fit
    schedule.stagger_fits, staggered by schedule.auto_stagger_ns. Same bits either way."""
    for name, value, low in (("ns", ns, 0), ("phases", phases, 1)):
        if name == "ns" and value == "auto":
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    with _pushed(_stagger_stack, (ns, phases)):
        yield


def team_stagger_setting() -> tuple[int | str, int]:
    """(ns, phases) asked for: the innermost `team_stagger` block, else GN_TEAM_STAGGER, else ("auto", 2)."""
    if _stagger_stack:
        return _stagger_stack[-1]
    env = os.environ
    raw = _ENV_DATA.get(_RAW_STAGGER) if env is _ENV and _ENV_DATA is not None else env.get(ENV_STAGGER)
    return _parsed(_stagger_values, _parse_stagger, raw)  # type: ignore[return-value]


def current_arch() -> str:
    """The kernel architecture in force (GN_ARCH; default DEFAULT_ARCH)."""
    return _parsed(_arch_values, _parse_arch, _raw_settings()[1])  # type: ignore[return-value]


@contextlib.contextmanager
def launch_record() -> Iterator[dict]:
    """Read back what the kernels really launched: grid and tiles visited in each phase.

    Yields a dict filled after each op inside the block: {"fwd": {...}, "bwd": {...}} with keys
    grid, tiles_phase1, tiles_applied, schedule. For tests of plan/launcher agreement.
    """
    rec: dict = {}
    with _pushed(_records, rec):
        yield rec


@contextlib.contextmanager
def poison_outputs() -> Iterator[None]:
    """Fill every output and the workspace with NaN before the kernels run (tests only), so an
    element the kernels fail to write shows up instead of a stale value from the allocator."""
    with _pushed(_poison, True):
        yield


@contextlib.contextmanager
def phase_trace(blocks: int, device: torch.device | int | None = None) -> Iterator[torch.Tensor]:
    """Profiling: task kernels launched inside the block record clock64() at their phase points
    (csrc/gn_task_primitives.cuh trace_point) into the yielded int64 tensor of shape (blocks, 16);
    -1 = not reached."""
    buf = torch.full((blocks, 16), -1, dtype=torch.int64, device=torch.device("cuda", _device_index(device)))
    with _pushed(_traces, buf):
        yield buf


def _poisoned(*tensors: torch.Tensor) -> None:
    if _poison:
        for t in tensors:
            t.fill_(float("nan"))


# ---------------------------------------------------------------- device facts
def _device_index(device: torch.device | int | None) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.cache
def _l2_keep_bytes(index: int) -> int:
    """GnArgs.l2_keep_bytes on this device: schedule.l2_keep_bytes of its L2 (0 where torch does not say)."""
    l2 = getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0)
    return schedule.l2_keep_bytes(int(l2 or 0))


@functools.cache
def library(device: int, variant: str | None = None) -> ctypes.CDLL:
    """The compiled library for `device` (built on first use); cached, it is on every call's path."""
    return build.load(variant, torch.cuda.get_device_capability(device))


def _check(lib: ctypes.CDLL, code: int, what: str) -> None:
    if code != 0:
        msg = lib.gn_error_string(code).decode(errors="replace")
        raise RuntimeError(f"gn_module: {what} failed: CUDA error {code} ({msg})")


@functools.cache
def _occupancy(index: int, variant: str | None, direction: str, dtype: str, vec: int, smem: int) -> int:
    lib = library(index, variant)
    blocks = ctypes.c_int(0)
    code = lib.gn_onepass_occupancy(
        index, _abi.DIRECTION_CODES[direction], _abi.DTYPE_CODES[dtype], vec, smem, ctypes.byref(blocks)
    )
    if code != 0:  # e.g. more shared memory than a block may have: one-pass impossible
        return 0
    return blocks.value


def onepass_residency(t: Tiling, dtype: str | torch.dtype, device: torch.device | int | None = None) -> int:
    """Co-resident one-pass blocks for tiling `t` on the device, from the CUDA occupancy API."""
    index = _device_index(device)
    name = _dtype_name(dtype)
    per_sm = _occupancy(index, current_variant(), t.direction, name, t.vec, t.onepass_smem)
    return per_sm * _sm_count(index)


@functools.cache
def _task_occupancy(
    index: int, variant: str | None, direction: str, dtype: str, vec: int, smem: int, wide: str | None = None
) -> int:
    lib = library(index, variant)
    blocks = ctypes.c_int(0)
    codes = (_abi.DIRECTION_CODES[direction], _abi.DTYPE_CODES[dtype])
    if wide is None:
        code = lib.gn_task_occupancy(index, *codes, vec, smem, ctypes.byref(blocks))
    else:
        code = lib.gn_task_occupancy_wide(
            index, *codes, _abi.DTYPE_CODES[wide], vec, smem, ctypes.byref(blocks)
        )
    return blocks.value if code == 0 else 0


def _reserved_smem() -> int:
    """The driver's shared memory per block (1 KB from sm_80 on; DeviceLimits' default)."""
    return schedule.DeviceLimits.__dataclass_fields__["reserved_smem_per_block"].default


@functools.cache
def _task_smem_budget(index: int) -> int:
    """Dynamic shared memory per block for TASK_BLOCKS_PER_SM blocks per SM on this device."""
    props = torch.cuda.get_device_properties(index)
    per_sm = int(getattr(props, "shared_memory_per_multiprocessor", 0) or 0)
    per_block = int(getattr(props, "shared_memory_per_block_optin", 0) or 0)
    return schedule.smem_budget(per_sm, per_block, _reserved_smem())


def kernel_resources(
    kind: str, dtype: str | torch.dtype, vec: int, device: torch.device | int | None = None
) -> KernelResources:
    """Registers and static shared memory of one compiled kernel (cudaFuncGetAttributes)."""
    index = _device_index(device)
    lib = library(index, current_variant())
    regs, smem, local = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    code = lib.gn_kernel_attributes(
        index,
        _abi.KERNEL_KINDS[kind],
        _abi.DTYPE_CODES[_dtype_name(dtype)],
        vec,
        ctypes.byref(regs),
        ctypes.byref(smem),
        ctypes.byref(local),
    )
    _check(lib, code, f"cudaFuncGetAttributes({kind})")
    return KernelResources(registers=regs.value, static_smem=smem.value)


# __CUDA_ARCH__ per (loaded library, device): asking runs a kernel and a synchronous copy, which must not
# happen per plan, nor inside a CUDA-graph capture once any launch has been planned.
_runtime_arches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _runtime_arch(lib: object, index: int) -> int:
    try:
        known = _runtime_arches.setdefault(lib, {})
    except TypeError:  # (a stand-in library that takes no weak reference: ask every time)
        known = {}
    if index not in known:
        arch = ctypes.c_int(0)
        _check(lib, lib.gn_runtime_arch(index, ctypes.byref(arch)), "reading __CUDA_ARCH__")
        known[index] = arch.value
    return known[index]


def runtime_cuda_arch(device: torch.device | int | None = None) -> int:
    """The __CUDA_ARCH__ value the current build variant runs with on the device."""
    index = _device_index(device)
    return _runtime_arch(library(index, current_variant()), index)


def _dtype_name(dtype: str | torch.dtype) -> str:
    name = str(dtype).replace("torch.", "")
    if name not in _abi.DTYPE_CODES:
        raise TypeError(f"gn_module: unsupported dtype {dtype}; expected float32, float16 or bfloat16")
    return name


# ---------------------------------------------------------------- the schedule for this device
def _nsc(shape: tuple[int, ...] | torch.Size) -> tuple[int, int, int]:
    n, c = shape[0], shape[1]
    s = 1
    for d in shape[2:]:
        s *= d
    return n, s, c


def choose_schedule(t: Tiling, batch: int, residency: int) -> int:
    """passes="auto": the two-pass schedule, everywhere, for now.

    Measured on the H200 (benchmarks/RESULTS.md, 2026-11-30): two-pass was as fast or faster than
    one-pass on every benchmark shape, fp16 and bf16, forward and backward (one-pass was 1.1-1.4x
    slower when it overflows and 10-17% slower when every tile fits on chip, where its grid
    barriers cost more than the second read saves). The rule lives here so that a faster
    one-pass kernel changes only this function; `t`, `batch` and `residency` are what it needs.
    """
    del t, batch, residency
    return 2


def task_plan(
    shape: tuple[int, ...] | torch.Size,
    num_groups: int,
    dtype: str | torch.dtype,
    direction: str,
    schedule_: int | str = "auto",
    device: torch.device | int | None = None,
    *,
    aligned: bool = True,
    cap: int | None = None,
    wide: str | torch.dtype | None = None,
) -> schedule.TaskPlan | None:
    """The task-architecture plan for this device, or None where the task kernels do not apply.

    The backward runs on them only with GN_ARCH=tasks+bwd (two launches; `passes=1` runs those too: the
    tile kernels' one-pass backward sums in another order, and a result must not change its bits with
    the schedule asked for; `passes="auto"` takes the one-pass kernel only where its teams take the
    automatic team stagger, schedule.choose_task_schedule) or tasks+bwd1 (its one-pass kernel wherever
    a task fits on chip; the same bits: opt-in).

    `wide`: the dtype of y (forward) or dy (backward) when it is float32 for a float16/bfloat16 x (the
    wide launches under autocast); None where the task kernels have no wide launch for the shape (the
    scalar path) and, in the backward, always two launches.
    """
    name = _dtype_name(dtype)
    wide_name = None if wide is None or _dtype_name(wide) == name else _dtype_name(wide)
    onepass_bwd = False
    if direction == "bwd":
        arch = current_arch()
        if arch not in TASK_BACKWARD_ARCHS:
            return None
        onepass_bwd = arch == "tasks+bwd1" and wide_name is None
        if not onepass_bwd and (schedule_ != "auto" or wide_name is not None):
            schedule_ = 2  # ("auto" may still take the staggered one launch: choose_task_schedule)
    n, s, c = _nsc(shape)
    itemsize = schedule.ITEMSIZE[name]
    wide_itemsize = schedule.ITEMSIZE[wide_name] if wide_name is not None else 0
    t = schedule.task_tiling(
        c, num_groups, s, itemsize, direction, batch=n, aligned=aligned, wide_itemsize=wide_itemsize
    )
    if t is None or (
        wide_name is not None and (wide_name != "float32" or t.vec * itemsize != schedule.VEC_BYTES)
    ):
        return None
    index = _device_index(device)
    slots = schedule.task_slots(t, _task_smem_budget(index))
    if slots < 1:
        return None
    smem = schedule.task_smem_bytes(t, slots)
    per_sm = _task_occupancy(index, current_variant(), direction, name, t.vec, smem, wide_name)
    residency = per_sm * _sm_count(index)
    cap = current_cap() if cap is None else cap
    chosen = schedule_
    if chosen == "auto":
        blocks = residency if cap is None else min(residency, cap)
        staggered = team_stagger_setting()[0] == "auto"
        sm90 = direction == "fwd" and runtime_cuda_arch(index) >= 900  # (dependent launches, clusters)
        chosen = schedule.choose_task_schedule(
            t,
            blocks,
            slots,
            backward_onepass=onepass_bwd,
            staggered=staggered,
            dependent_apply=sm90 and dependent_launches_enabled(),
            clusters=sm90 and cluster_teams_enabled(),
            l2_keep_bytes=_l2_keep_bytes(index) if schedule.L2_HINTS else 0,
        )
    chosen = int(chosen)
    if chosen == 1 and residency < 1:
        raise RuntimeError(f"gn_module: the one-pass task kernel cannot run C={c} {name} on this device")
    return schedule.make_task_plan(t, chosen, slots, residency, cap, strip_room=strip_room_enabled())


def plan(
    shape: tuple[int, ...] | torch.Size,
    num_groups: int,
    dtype: str | torch.dtype,
    direction: str,
    schedule_: int | str = "auto",
    device: torch.device | int | None = None,
    *,
    aligned: bool = True,
    cap: int | None = None,
    wide: str | torch.dtype | None = None,
) -> Plan:
    """The launch plan for an input of NCHW-order `shape` on a local CUDA device.

    `cap` defaults to the cap in force (`max_resident_blocks`, GN_MAX_RESIDENT_BLOCKS). `wide`: see
    `task_plan`; `NoWideLaunch` where the kernels have none for this call.
    """
    if not torch.cuda.is_available():  # torch's own error here is a bare AssertionError
        raise RuntimeError(
            "gn_module.plan(): needs a CUDA device (it asks the device for its SM count and kernel "
            f"occupancy), and torch sees none (torch {torch.__version__}, CUDA {torch.version.cuda})"
        )
    if wide is not None and _dtype_name(wide) == _dtype_name(dtype):
        wide = None
    if current_arch() != "tiles":
        tp = task_plan(
            shape, num_groups, dtype, direction, schedule_, device, aligned=aligned, cap=cap, wide=wide
        )
        if tp is not None:
            return tp  # type: ignore[return-value]
    if wide is not None:
        raise NoWideLaunch(
            f"no wide {direction} launch for {tuple(shape)} {_dtype_name(dtype)} ({current_arch()})"
        )
    n, s, c = _nsc(shape)
    name = _dtype_name(dtype)
    t = schedule.tiling(c, num_groups, s, schedule.ITEMSIZE[name], direction, batch=n, aligned=aligned)
    residency = onepass_residency(t, name, device)
    chosen = choose_schedule(t, n, residency) if schedule_ == "auto" else int(schedule_)
    if chosen == 1 and residency == 0:
        raise RuntimeError(
            f"gn_module: the one-pass schedule cannot run C={c} {name} on this device: a block needs "
            f"{t.onepass_smem} bytes of shared memory; use passes=2 or 'auto'"
        )
    return schedule.make_plan(t, n, chosen, residency, current_cap() if cap is None else cap)


# ---------------------------------------------------------------- launching
def _dense(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.contiguous()


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _typed_param_grads(p: Plan | schedule.TaskPlan) -> bool:
    """Whether the launch stores dweight and dbias in the parameters' dtype (the task backward), rather
    than in float32 for a cast after it (the tile kernels)."""
    return isinstance(p, schedule.TaskPlan) and p.direction == "bwd"


def _workspace_offsets(a: _abi.GnArgs, floats: dict[str, int]) -> None:
    """Float offsets of the workspace regions, in the plan's order (schedule.workspace_layout)."""
    offsets, total = {}, 0
    for region, size in floats.items():
        offsets[region] = total
        total += size
    a.off_partials = offsets["partials"]
    a.off_level = offsets.get("level", 0)
    a.off_channel_sums = offsets.get("channel_sums", 0)
    a.off_group_sums = offsets.get("group_sums", 0)
    a.off_group_partials = offsets.get("group_partials", 0)


def _args(
    p: Plan | schedule.TaskPlan,
    dtype: torch.dtype,
    eps: float,
    act: str | None,
    param_dtype: torch.dtype | None,
    device_index: int,
    wide: torch.dtype | None = None,
) -> _abi.GnArgs:
    """GnArgs from the plan, without data pointers. `param_dtype`: weight's (or bias's) dtype; `wide`:
    y's (dy's) dtype where it is not x's (`task_plan`)."""
    t = p.tiling
    a = _abi.GnArgs()
    a.n, a.s, a.c, a.g = p.batch, t.rows, t.channels, t.groups
    a.dtype = _abi.DTYPE_CODES[_dtype_name(dtype)]
    a.wide_dtype = a.dtype if wide is None else _abi.DTYPE_CODES[_dtype_name(wide)]
    a.w_dtype = _abi.DTYPE_CODES[_dtype_name(param_dtype)] if param_dtype is not None else 0
    a.act = _abi.ACT_CODES[act]
    a.eps = eps
    a.schedule, a.grid, a.smem = p.schedule, p.grid, p.smem
    a.device = device_index
    a.fanin = schedule.FANIN  # checked by the C entry points whatever the architecture
    a.vec, a.cols_threads, a.rows_threads = t.vec, t.cols_threads, t.rows_threads
    if isinstance(p, schedule.TaskPlan):
        a.arch, a.slots = 2, p.slots
        a.team_size, a.teams = (p.teams.team_size, p.teams.teams) if p.teams is not None else (1, 1)
        a.window, a.tiles_per_task, a.chunk_rows = t.window, t.tiles_per_task, t.chunk_rows
        a.channels_per_group, a.groups_per_window = t.channels // t.groups, t.groups_per_window
        a.windows_per_sample, a.chunks_per_tile = t.channels // t.window, t.chunks_per_tile
        a.rows_per_tile, a.tiles_per_slice, a.col_chunks = t.rows_per_tile, t.tiles_per_task, 1
        a.grad_dtype = a.w_dtype if _typed_param_grads(p) else 0
        for name in _abi.FAST_DIVISORS:
            mul, shift = schedule.fast_divisor(getattr(a, name))
            setattr(a, f"{name}_mul", mul)
            setattr(a, f"{name}_shift", shift)
        _workspace_offsets(a, p.workspace_floats)
        return a
    a.arch = 1
    a.rows_per_tile, a.tiles_per_slice, a.col_chunks = t.rows_per_tile, t.tiles_per_slice, t.col_chunks
    _workspace_offsets(a, p.workspace_floats)
    levels = t.level_tiles
    if len(levels) > _abi.MAX_LEVELS:
        raise RuntimeError(f"gn_module: {t.tiles_per_slice} tiles per slice need too many reduction levels")
    for i, size in enumerate(levels):
        a.level_tiles[i] = size
    a.nlevels = len(levels)
    return a


# Synchronisation words of the task kernels, per (device, stream): zeroed once, never reset (a launch's
# last arriver rounds its counter up to the next generation; flags carry the generation:
# gn_task_primitives.cuh).
# One buffer per stream, because two launches in flight on different streams must not share it.
_sync_buffers: dict[tuple[int, int], torch.Tensor] = {}
# Buffers a larger one replaced: a captured CUDA graph keeps launching with their address, so they are
# never freed (they are small: words for the tasks of one launch).
_outgrown_sync_buffers: list[torch.Tensor] = []


def _sync_buffer(device: torch.device, stream: int, words: int) -> torch.Tensor:
    key = (device.index, stream)
    buf = _sync_buffers.get(key)
    if buf is None or buf.numel() < words:
        # grow geometrically; the old buffer's pending launches are stream-ordered before its reuse
        size = max(words, 2 * (buf.numel() if buf is not None else 0), 1024)
        if buf is not None:
            _outgrown_sync_buffers.append(buf)
        buf = _zeros_outside_graph_pools(size, device)
        _sync_buffers[key] = buf
    return buf


def _zeros_outside_graph_pools(size: int, device: torch.device) -> torch.Tensor:
    """int32 zeros that outlive any CUDA-graph memory pool. torch.compile's CUDA graphs
    (mode="reduce-overhead") run their warm-up with this thread's allocations routed to the graph's
    pool, and then refuse a pool block that is not one of the graph's outputs ("tensor(s) in the
    cudagraph pool not tracked as outputs"). That routing is per thread, so a helper thread allocates
    the buffer. While this stream is being captured, no allocation may happen elsewhere: the buffer is
    allocated in the capture (its pool keeps it, and the captured memset zeroes it at every replay,
    before the graph's launches use it)."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():  # (not CUDA: the CPU stubs)
        return torch.zeros(size, dtype=torch.int32, device=device)
    made: list[torch.Tensor] = []
    failed: list[BaseException] = []

    def allocate() -> None:
        try:
            with torch.cuda.device(device):
                buf = torch.zeros(size, dtype=torch.int32, device=device)
                torch.cuda.current_stream(device).synchronize()  # (zeroed before any stream uses it)
            made.append(buf)
        except BaseException as exc:  # (re-raised in the caller's thread)
            failed.append(exc)

    helper = threading.Thread(target=allocate, name="gn_module-sync-buffer")
    helper.start()
    helper.join()
    if failed:
        raise failed[0]
    return made[0]


class _Launch:
    """What one call signature launches, computed once: the plan, the pointer-free GnArgs bytes, the
    library entry, and the sizes of the call's allocations.

    The single scratch allocation holds the workspace first (the allocator's alignment), then two
    256-byte aligned regions at byte `offsets`: mean and rstd forward (`forward_nograd`), dweight
    and dbias backward (`_backward_lean`, where they are not returned as the kernels write them).
    The training forward keeps mean and rstd apart, in `stats_floats` (rstd at `rstd_offset` bytes),
    and the workspace in `workspace_floats` (`_forward_lean`)."""

    __slots__ = (
        "args",
        "entry",
        "lib",
        "node",
        "offsets",
        "plan",
        "rstd_offset",
        "scratch_floats",
        "stats_floats",
        "sync_words",
        "tail",
        "tail_after_sync",
        "tail_before_sync",
        "workspace_floats",
    )

    def __init__(self, p: Plan | schedule.TaskPlan, args: bytes, lib: ctypes.CDLL, direction: str) -> None:
        self.plan, self.args, self.lib = p, args, lib
        self.entry = lib.gn_forward if direction == "fwd" else lib.gn_backward
        self.tail = args[_abi.POINTERS_SIZE :]  # what follows the data pointers
        self.sync_words = p.sync_words if isinstance(p, schedule.TaskPlan) else 0
        # the tail around the sync pointer, which a task plan's launch packs in between
        self.tail_before_sync = args[_abi.POINTERS_SIZE : _SYNC_AT]
        self.tail_after_sync = args[_SYNC_AT + _SYNC.size :]
        self.workspace_floats = max(1, sum(p.workspace_floats.values()))  # as `_workspace`
        ws = _round_up(self.workspace_floats, 64)
        pair = p.batch * p.tiling.groups if direction == "fwd" else p.tiling.channels
        self.offsets = (4 * ws, 4 * (ws + _round_up(pair, 64)))
        self.scratch_floats = ws + _round_up(pair, 64) + pair
        self.rstd_offset, self.stats_floats = _stats_layout(pair)
        self.node: tuple[object, int] | bool | None = None  # forward: the C++ node's launches (_node_apply)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _stats_layout(ng: int) -> tuple[int, int]:
    """The training forward's mean-and-rstd tensor for N*G groups: rstd's byte offset (256-byte
    aligned, as in the scratch) and the float count."""
    return 4 * _round_up(ng, 64), _round_up(ng, 64) + ng


_SYNC = struct.Struct("@P")
_SYNC_AT = _abi.GnArgs.sync.offset


# One _Launch per call signature: everything `plan` and `_args` read is in the key (shape, dtype,
# groups, eps, act, passes, parameter dtype, device, 16-byte alignment, the cap, build variant and
# GN_ARCH in force), so a cap set by max_resident_blocks or an env var changed between two calls
# takes effect on the next call.
class _LaunchCache(dict):
    """The launches by call signature; emptying it empties the C++ op kernels' copy too."""

    def clear(self) -> None:
        super().clear()
        _settings_changed()


_launches: dict[tuple, _Launch | object] = _LaunchCache()
_MAX_LAUNCHES = 4096
#: The environment variables `_launch` reads (through `_settings` and the launch switches): the C++ op
#: kernels compare them on each call and drop their launches when one changed.
LAUNCH_ENVIRONMENT = (
    ENV_CAP,
    ENV_ARCH,
    ENV_DEPENDENT,
    ENV_CLUSTER,
    ENV_STAGGER,
    ENV_STRIP_BLOCKS,
    ENV_STRIP_ROOM,
)


def _launch(
    direction: str,
    x: torch.Tensor,
    index: int,
    aligned: bool,
    num_groups: int,
    eps: float,
    act: int,
    passes: int,
    param: torch.Tensor | None,
    wide: torch.dtype | None = None,
) -> _Launch:
    """The cached launch of this call signature; `NoWideLaunch` (also cached) where `wide` has none."""
    cap, arch = _settings()
    key = (
        direction,
        x.shape,
        x.dtype,
        index,
        aligned,
        num_groups,
        eps,
        act,
        passes,
        None if param is None else param.dtype,
        cap,
        _variants[-1] if _variants else None,
        arch,
        wide,
        dependent_launches_enabled(),
        cluster_teams_enabled(),
        team_stagger_setting(),
        strip_blocks_enabled(),
        strip_room_enabled(),
    )
    launch = _launches.get(key)
    if launch is None:
        launch = _new_launch(key)
    if launch is _NO_WIDE:
        raise NoWideLaunch(f"no wide {direction} launch for {tuple(x.shape)} {x.dtype}")
    return launch  # type: ignore[return-value]


_NO_WIDE = object()  # a cached answer of _new_launch: NoWideLaunch


def _new_launch(key: tuple) -> _Launch | object:
    (
        direction,
        shape,
        dtype,
        index,
        aligned,
        num_groups,
        eps,
        act,
        passes,
        param_dtype,
        cap,
        variant,
        _,
        wide,
        dependent,
        clusters,
        stagger,
        strips,
        _,  # (strip_room_enabled: plan() reads it)
    ) = key
    try:
        p = plan(
            tuple(shape),
            num_groups,
            dtype,
            direction,
            "auto" if passes == 0 else passes,
            index,
            aligned=aligned,
            cap=cap,
            wide=wide,
        )
    except NoWideLaunch:
        _launches[key] = _NO_WIDE
        return _NO_WIDE
    if p.tiles >= 2**31:
        raise RuntimeError(f"gn_module: {p.tiles} tiles exceed the launch limit of 2**31 - 1 blocks")
    a = _args(p, dtype, eps, _ACTS[act], param_dtype, index, wide)
    if isinstance(p, schedule.TaskPlan):
        a.stagger_ns, a.stagger_phases = schedule.team_stagger(p, *stagger)
        a.strip_blocks = p.strip_blocks if strips else 0
        a.l2_keep_bytes = _l2_keep_bytes(index)
    lib = library(index, variant)
    dependent = dependent and isinstance(p, schedule.TaskPlan) and p.schedule == 2
    clusters = clusters and isinstance(p, schedule.TaskPlan) and schedule.cluster_teams_fit(p)
    if dependent or clusters:
        # griddepcontrol and clusters are sm_90 code: a compute_80 PTX build run on an H200 must not
        # skip the wait, and has no cluster kernel
        arch_value = _runtime_arch(lib, index)
        a.dependent_launch = int(dependent and arch_value >= 900)
        a.cluster_teams = int(clusters and arch_value >= 900)
    launch = _Launch(p, bytes(a), lib, direction)
    if len(_launches) >= _MAX_LAUNCHES:
        _launches.clear()
    _launches[key] = launch
    return launch


def _prepare(
    direction: str,
    x: torch.Tensor,
    num_groups: int,
    eps: float,
    act: int,
    passes: int,
    param: torch.Tensor | None,
    *others: torch.Tensor,
    wide: torch.dtype | None = None,
) -> tuple[Plan, _abi.GnArgs]:
    aligned = all(t.data_ptr() % schedule.VEC_BYTES == 0 for t in (x, *others))
    launch = _launch(direction, x, x.get_device(), aligned, num_groups, eps, act, passes, param, wide)
    return launch.plan, _abi.GnArgs.from_buffer_copy(launch.args)


# The raw cudaStream_t of the device's current stream: what torch.cuda.current_stream(i).cuda_stream
# returns, without building a Stream object (a few microseconds per call).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream
)


def _run(direction: str, p: Plan, a: _abi.GnArgs, x: torch.Tensor) -> None:
    index = x.get_device()
    lib = library(index, current_variant())
    records = list(_records)
    rec_tensor = torch.zeros(4, dtype=torch.int32, device=x.device) if records else None
    a.record = _ptr(rec_tensor)
    stream = _raw_stream(index)
    if isinstance(p, schedule.TaskPlan):
        a.sync = _sync_buffer(x.device, stream, p.sync_words).data_ptr()
        if _traces and _traces[-1].shape[0] >= p.grid + a.strip_blocks:  # (a row per block of each launch)
            a.trace = _traces[-1].data_ptr()
    fn = lib.gn_forward if direction == "fwd" else lib.gn_backward
    _check(lib, fn(ctypes.byref(a), stream), f"GroupNorm {direction} launch")
    if rec_tensor is not None:
        grid, phase1, applied, reread = rec_tensor.tolist()
        entry = {
            "grid": grid,
            "tiles_phase1": phase1,
            "tiles_applied": applied,
            "chunks_reread": reread,
            "schedule": p.schedule,
            "arch": getattr(p, "arch", 1),
            "plan": p,
        }
        for r in records:
            r[direction] = entry


def _workspace(p: Plan, device: torch.device) -> torch.Tensor:
    return torch.empty(max(1, sum(p.workspace_floats.values())), dtype=torch.float32, device=device)


def forward(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    num_groups: int,
    eps: float,
    act: int,
    passes: int,
    stats: tuple[torch.Tensor, torch.Tensor] | None = None,
    wide: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the forward kernels: y (x's memory format; dtype `wide` if given, else x's), mean and rstd
    (N, G) float32 (`stats` if given, else new tensors)."""
    param = weight if weight is not None else bias
    p, a = _prepare("fwd", x, num_groups, eps, act, passes, param, wide=wide)
    y = torch.empty_like(x, dtype=wide)
    if stats is None:
        mean = torch.empty((x.shape[0], num_groups), dtype=torch.float32, device=x.device)
        rstd = torch.empty_like(mean)
    else:
        mean, rstd = stats
    ws = _workspace(p, x.device)
    _poisoned(y, mean, rstd, ws)
    a.x, a.out, a.weight, a.bias = x.data_ptr(), y.data_ptr(), _ptr(weight), _ptr(bias)
    a.mean, a.rstd, a.workspace = mean.data_ptr(), rstd.data_ptr(), ws.data_ptr()
    _run("fwd", p, a, x)
    return y, mean, rstd


def forward_nograd(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    num_groups: int,
    eps: float,
    act: int,
    passes: int,
    wide: torch.dtype | None = None,
) -> torch.Tensor:
    """`forward`'s y with less host work, for calls whose mean and rstd nobody keeps (no autograd).

    The same launch (plan, GnArgs fields, kernels, stream) with two allocations instead of four:
    workspace, mean and rstd share one float32 buffer. GnArgs is the cached template bytes with the
    data pointers packed in front. Launch records, poisoning and phase traces take `forward`.
    """
    if _records or _poison or _traces:
        return forward(x, weight, bias, num_groups, eps, act, passes, None, wide)[0]
    ptr = x.data_ptr()
    index = x.get_device()
    param = weight if weight is not None else bias
    launch = _launch(
        "fwd", x, index, ptr % schedule.VEC_BYTES == 0, num_groups, eps, act, passes, param, wide
    )
    y = torch.empty_like(x, dtype=wide)
    scratch = torch.empty(launch.scratch_floats, dtype=torch.float32, device=x.device)
    ws = scratch.data_ptr()
    mean, rstd = launch.offsets
    pointers = _abi.POINTERS.pack(
        ptr,
        0,
        y.data_ptr(),
        0 if weight is None else weight.data_ptr(),
        0 if bias is None else bias.data_ptr(),
        ws + mean,
        ws + rstd,
        ws,
        0,
        0,
        0,
    )
    _send(launch, pointers, x.device, index, "GroupNorm fwd launch")
    return y


def _send(launch: _Launch, pointers: bytes, device: torch.device, index: int, what: str) -> None:
    """Launch `launch` with these data pointers (`_abi.POINTERS` bytes) on the current stream: the
    cached GnArgs bytes behind them, a task plan's synchronisation words added; `_check`'s error."""
    stream = _raw_stream(index)
    if launch.sync_words:
        sync = _SYNC.pack(_sync_buffer(device, stream, launch.sync_words).data_ptr())
        args = pointers + launch.tail_before_sync + sync + launch.tail_after_sync
    else:
        args = pointers + launch.tail
    code = launch.entry(args, stream)
    if code:
        _check(launch.lib, code, what)


def _forward_lean(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    num_groups: int,
    eps: float,
    act: int,
    passes: int,
    wide: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """`forward` for the training path with less host work: y, mean and rstd in one float32 tensor
    (mean first) which the backward keeps, and rstd's byte offset in it (see `_stats_views`).

    The same launch as `forward` (plan, GnArgs fields, kernels, stream) with three allocations
    instead of four and GnArgs packed as in `forward_nograd`; the workspace is freed on return.
    """
    ptr = x.data_ptr()
    index = x.get_device()
    param = weight if weight is not None else bias
    launch = _launch(
        "fwd", x, index, ptr % schedule.VEC_BYTES == 0, num_groups, eps, act, passes, param, wide
    )
    y = torch.empty_like(x, dtype=wide)
    stats = torch.empty(launch.stats_floats, dtype=torch.float32, device=x.device)
    ws = torch.empty(launch.workspace_floats, dtype=torch.float32, device=x.device)
    mean = stats.data_ptr()
    pointers = _abi.POINTERS.pack(
        ptr,
        0,
        y.data_ptr(),
        0 if weight is None else weight.data_ptr(),
        0 if bias is None else bias.data_ptr(),
        mean,
        mean + launch.rstd_offset,
        ws.data_ptr(),
        0,
        0,
        0,
    )
    _send(launch, pointers, x.device, index, "GroupNorm fwd launch")
    return y, stats, launch.rstd_offset


def _stats_views(stats: torch.Tensor, num_groups: int, rstd_at: int) -> tuple[torch.Tensor, torch.Tensor]:
    """mean and rstd, (N, G) views of the training forward's one float32 tensor (rstd at byte `rstd_at`)."""
    ng, at = stats.numel() - rstd_at // 4, rstd_at // 4
    return stats[:ng].view(-1, num_groups), stats[at : at + ng].view(-1, num_groups)


def _dy_as_x(dy: torch.Tensor, x: torch.Tensor, wide: torch.dtype | None) -> torch.Tensor:
    """dy in x's layout: gradients arrive in any layout and the kernels read x's; a wide launch's float32
    dy is also copied where it is not 16-byte aligned (the wide launches take 16-byte vectors only)."""
    if dy.stride() != x.stride() or (wide is not None and dy.data_ptr() % schedule.VEC_BYTES):
        return torch.empty_like(x, dtype=dy.dtype).copy_(dy)
    return dy


def backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    num_groups: int,
    eps: float,
    act: int,
    passes: int,
    wide: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the backward kernels: dx (x's memory format and dtype), dweight and dbias (weight's dtype).
    `wide`: dy's dtype where it is float32 for a float16/bfloat16 x (else dy is x's dtype)."""
    dy = _dy_as_x(dy, x, wide)
    param = weight if weight is not None else bias
    pdt = param.dtype if param is not None else torch.float32
    p, a = _prepare("bwd", x, num_groups, eps, act, passes, param, dy, wide=wide)
    c = x.shape[1]
    dx = torch.empty_like(x)
    gdt = pdt if _typed_param_grads(p) else torch.float32  # the dtype the kernels store them in
    dw = torch.empty(c, dtype=gdt, device=x.device)
    db = torch.empty(c, dtype=gdt, device=x.device)
    ws = _workspace(p, x.device)
    _poisoned(dx, dw, db, ws)
    a.x, a.dy, a.out, a.weight, a.bias = x.data_ptr(), dy.data_ptr(), dx.data_ptr(), _ptr(weight), _ptr(bias)
    a.mean, a.rstd, a.workspace = mean.data_ptr(), rstd.data_ptr(), ws.data_ptr()
    a.dweight, a.dbias = dw.data_ptr(), db.data_ptr()
    _run("bwd", p, a, x)
    return dx, dw.to(pdt), db.to(pdt)


def _backward_lean(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    mean: int,
    rstd: int,
    num_groups: int,
    eps: float,
    act: int,
    passes: int,
    want_dweight: bool,
    want_dbias: bool,
    wide: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """`backward` with less host work, for the autograd.Function: the same launch (plan, GnArgs
    fields, kernels, stream) from `mean` and `rstd` data pointers, returning dweight (dbias) only
    where wanted, else None.

    The workspace shares one float32 allocation with the dweight and dbias the kernels write, except
    those returned as written (float32 parameters, and any parameters under the task backward, which
    stores them in the parameters' dtype), which get their own tensors; for float16/bfloat16 parameters
    under the tile kernels the wanted ones are converted from that scratch as `backward` does.
    """
    dy = _dy_as_x(dy, x, wide)
    ptr, dy_ptr = x.data_ptr(), dy.data_ptr()
    index = x.get_device()
    param = weight if weight is not None else bias
    aligned = ptr % schedule.VEC_BYTES == 0 and dy_ptr % schedule.VEC_BYTES == 0
    launch = _launch("bwd", x, index, aligned, num_groups, eps, act, passes, param, wide)
    dx = torch.empty_like(x)
    scratch = torch.empty(launch.scratch_floats, dtype=torch.float32, device=x.device)
    ws = scratch.data_ptr()
    dw_at, db_at = launch.offsets
    dw = db = None
    typed = _typed_param_grads(launch.plan)  # stored in the parameters' dtype by the kernels
    as_written = param is None or param.dtype is torch.float32 or typed
    gdt = param.dtype if typed and param is not None else torch.float32
    if as_written and want_dweight:
        dw = torch.empty(x.shape[1], dtype=gdt, device=x.device)
    if as_written and want_dbias:
        db = torch.empty(x.shape[1], dtype=gdt, device=x.device)
    pointers = _abi.POINTERS.pack(
        ptr,
        dy_ptr,
        dx.data_ptr(),
        0 if weight is None else weight.data_ptr(),
        0 if bias is None else bias.data_ptr(),
        mean,
        rstd,
        ws,
        ws + dw_at if dw is None else dw.data_ptr(),
        ws + db_at if db is None else db.data_ptr(),
        0,
    )
    _send(launch, pointers, x.device, index, "GroupNorm bwd launch")
    if not as_written:
        c = x.shape[1]
        if want_dweight:
            dw = scratch[dw_at // 4 : dw_at // 4 + c].to(param.dtype)  # type: ignore[union-attr]
        if want_dbias:
            db = scratch[db_at // 4 : db_at // 4 + c].to(param.dtype)  # type: ignore[union-attr]
    return dx, dw, db


_ACTS = {code: name for name, code in _abi.ACT_CODES.items() if name != "identity"}
_ACT_IDS = _abi.ACT_CODES
_PASSES = {"auto": 0, 1: 1, 2: 2}


# ---------------------------------------------------------------- torch.library registration
# The two ops are defined on a plain torch.library.Library, with their CUDA kernels, fake kernels and an
# Autograd kernel of our own, not with torch.library.custom_op: a custom op's call runs some seven Python
# layers around its kernel (autograd_impl, forward_no_grad, redispatch, backend_impl, a dynamo-disable
# wrapper, an out and an alias check), every call, compiled graphs included; here only our Autograd
# kernel and the dynamo-disable wrapper torch puts on any Python kernel remain. Measured on CPU with the
# stub library (benchmarks/RESULTS.md, session 20): 104-110 us per forward call through custom_op, 71-72
# with these registrations, for a 33 us body; on the H200 16 of 20 pairings faster (session 21).
_LIB = torch.library.Library("gn_module", "DEF")  # (a module global: the registrations live with it)
_LIB.define(
    "group_norm_fwd(Tensor x, Tensor? weight, Tensor? bias, SymInt num_groups, float eps, SymInt act, "
    "SymInt passes, bool wide=False) -> (Tensor, Tensor, Tensor)"
)
_LIB.define(
    "group_norm_bwd(Tensor dy, Tensor x, Tensor? weight, Tensor? bias, Tensor mean, Tensor rstd, "
    "SymInt num_groups, float eps, SymInt act, SymInt passes, bool wide=False) -> (Tensor, Tensor, Tensor)"
)


def group_norm_fwd(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    num_groups: int,
    eps: float,
    act: int,
    passes: int,
    wide: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y, mean, rstd. ``wide``: autocast's GroupNorm of a float16/bfloat16 x: float32 y
    (`_forward_float32`)."""
    if wide:
        return _forward_float32(x, _dense(weight), _dense(bias), num_groups, eps, act, passes)
    return _op_forward(x, _dense(weight), _dense(bias), num_groups, eps, act, passes)


@torch.library.register_fake("gn_module::group_norm_fwd")
def _(x, weight, bias, num_groups, eps, act, passes, wide=False):
    if x.device.type == "cuda":  # (torch.compile traces a call: the C++ kernels for what its graph calls)
        op_kernels.enable()
    stats = x.new_empty((x.shape[0], num_groups), dtype=torch.float32)
    return torch.empty_like(x, dtype=torch.float32 if wide else None), stats, torch.empty_like(stats)


def _forward_float32(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    num_groups: int,
    eps: float,
    act: int,
    passes: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What torch's GroupNorm gives under autocast (float32 arithmetic on x.float(), float32 y), for the
    custom op under torch.compile: the wide launch, which reads x as it is, or where the kernels have
    none the launch on a float32 copy of x (the same arithmetic)."""
    try:
        return _op_forward(x, weight, bias, num_groups, eps, act, passes, torch.float32)
    except NoWideLaunch:
        return _op_forward(x.float(), weight, bias, num_groups, eps, act, passes)


def _backward_float32(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    num_groups: int,
    eps: float,
    act: int,
    passes: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_forward_float32`'s backward: float32 dy, dx in x's dtype; the wide launch, or where the
    kernels have none the launch on float32 copies with dx rounded to x's dtype."""
    dy = dy if dy.dtype == torch.float32 else dy.float()
    try:
        return _op_backward(dy, x, weight, bias, mean, rstd, num_groups, eps, act, passes, torch.float32)
    except NoWideLaunch:
        dx, dw, db = _op_backward(dy, x.float(), weight, bias, mean, rstd, num_groups, eps, act, passes)
        return dx.to(x.dtype), dw, db


def _device_of(x: torch.Tensor) -> contextlib.AbstractContextManager[object]:
    """x's CUDA device made current (the general routes allocate and launch on the current device);
    nothing for a CPU tensor (the host-path tests' stub launches)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def _op_forward(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    num_groups: int,
    eps: float,
    act: int,
    passes: int,
    wide: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The custom op's forward (what a torch.compile graph calls): `forward`'s launch on
    `_forward_lean`'s host path (the cached launch bytes, no plan or GnArgs built per call, no device
    guard: the tensors name their device), with mean and rstd as tensors of their own. Launch
    records, poisoning and phase traces take `forward`."""
    if _records or _poison or _traces:
        with _device_of(x):
            return forward(x, weight, bias, num_groups, eps, act, passes, None, wide)
    ptr = x.data_ptr()
    index = x.get_device()
    param = weight if weight is not None else bias
    launch = _launch(
        "fwd", x, index, ptr % schedule.VEC_BYTES == 0, num_groups, eps, act, passes, param, wide
    )
    y = torch.empty_like(x, dtype=wide)
    mean = torch.empty((x.shape[0], num_groups), dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    ws = torch.empty(launch.workspace_floats, dtype=torch.float32, device=x.device)
    pointers = _abi.POINTERS.pack(
        ptr,
        0,
        y.data_ptr(),
        0 if weight is None else weight.data_ptr(),
        0 if bias is None else bias.data_ptr(),
        mean.data_ptr(),
        rstd.data_ptr(),
        ws.data_ptr(),
        0,
        0,
        0,
    )
    _send(launch, pointers, x.device, index, "GroupNorm fwd launch")
    return y, mean, rstd


def _op_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    num_groups: int,
    eps: float,
    act: int,
    passes: int,
    wide: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The custom op's backward: `backward`'s launch on `_backward_lean`'s host path, dweight and dbias
    always returned (the op's schema has three tensors). Records, poisoning and traces take `backward`."""
    if _records or _poison or _traces:
        with _device_of(x):
            return backward(dy, x, weight, bias, mean, rstd, num_groups, eps, act, passes, wide)
    mean, rstd = mean.contiguous(), rstd.contiguous()  # (no-ops for the forward's own)
    dx, dw, db = _backward_lean(
        dy, x, weight, bias, mean.data_ptr(), rstd.data_ptr(), num_groups, eps, act, passes, True, True, wide
    )
    return dx, dw, db  # type: ignore[return-value]


def group_norm_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    num_groups: int,
    eps: float,
    act: int,
    passes: int,
    wide: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dx (x's dtype), dweight, dbias. ``wide``: the backward of `group_norm_fwd`'s wide form (float32 dy)."""
    w, b = _dense(weight), _dense(bias)
    if wide:
        return _backward_float32(dy, x, w, b, mean, rstd, num_groups, eps, act, passes)
    return _op_backward(dy, x, w, b, mean, rstd, num_groups, eps, act, passes)


@torch.library.register_fake("gn_module::group_norm_bwd")
def _(dy, x, weight, bias, mean, rstd, num_groups, eps, act, passes, wide=False):
    c = x.shape[1]
    param = weight if weight is not None else bias
    pdt = param.dtype if param is not None else torch.float32
    return torch.empty_like(x), x.new_empty((c,), dtype=pdt), x.new_empty((c,), dtype=pdt)


_LIB.impl("group_norm_fwd", group_norm_fwd, "CUDA")
_LIB.impl("group_norm_bwd", group_norm_bwd, "CUDA")
_FWD_OP = torch.ops.gn_module.group_norm_fwd.default
_BWD_OP = torch.ops.gn_module.group_norm_bwd.default


class _OpGroupNorm(torch.autograd.Function):
    """The forward op's autograd: y, mean and rstd from the op below autograd; dx, dweight and dbias
    from the backward op (mean and rstd are not differentiable)."""

    @staticmethod
    def forward(ctx, x, weight, bias, num_groups, eps, act, passes, wide):  # type: ignore[override]
        with torch._C._AutoDispatchBelowAutograd():
            y, mean, rstd = _FWD_OP(x, weight, bias, num_groups, eps, act, passes, wide)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.config = (num_groups, eps, act, passes, wide)
        ctx.mark_non_differentiable(mean, rstd)
        return y, mean, rstd

    @staticmethod
    def backward(ctx, dy, _dmean, _drstd):  # type: ignore[override]
        x, weight, bias, mean, rstd = ctx.saved_tensors
        dx, dw, db = _BWD_OP(dy, x, weight, bias, mean, rstd, *ctx.config)
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        return (
            dx if need_x else None,
            dw if (weight is not None and need_w) else None,
            db if (bias is not None and need_b) else None,
            None,
            None,
            None,
            None,
            None,
        )


def _fwd_autograd(x, weight, bias, num_groups, eps, act, passes, wide=False):
    """The forward op's Autograd kernel: `_OpGroupNorm` where a gradient is wanted, else straight below
    autograd (compiled graphs call the op with gradients off)."""
    if torch.is_grad_enabled() and (
        x.requires_grad
        or (weight is not None and weight.requires_grad)
        or (bias is not None and bias.requires_grad)
    ):
        return _OpGroupNorm.apply(x, weight, bias, num_groups, eps, act, passes, wide)
    with torch._C._AutoDispatchBelowAutograd():
        return _FWD_OP(x, weight, bias, num_groups, eps, act, passes, wide)


def _bwd_autograd(dy, x, weight, bias, mean, rstd, num_groups, eps, act, passes, wide=False):
    """The backward op's Autograd kernel: no double backward (as torch's custom ops without a formula)."""
    if torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (dy, x, weight, bias, mean, rstd)
    ):
        raise RuntimeError("gn_module::group_norm_bwd has no derivative (double backward is not supported)")
    with torch._C._AutoDispatchBelowAutograd():
        return _BWD_OP(dy, x, weight, bias, mean, rstd, num_groups, eps, act, passes, wide)


_LIB.impl("group_norm_fwd", _fwd_autograd, "Autograd")
_LIB.impl("group_norm_bwd", _bwd_autograd, "Autograd")


class _EagerGroupNorm(torch.autograd.Function):
    """The same kernels without the dispatcher round trip of a custom op (eager mode only).

    forward saves x, weight and bias as given, and mean and rstd in one float32 tensor (rstd's byte
    offset in ctx.gn): `_forward_lean`'s, or `forward` writing into views of one laid out the same
    while launch records, poisoning or phase traces are on, so that what is saved does not depend
    on them (non-reentrant checkpointing compares what its recomputation saves). backward takes
    `_backward_lean`, or `backward` while those are on (read when it runs, as the cap, build variant
    and GN_ARCH are by `_launch`).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, num_groups, eps, act, passes, wide=None):
        w, b = _dense(weight), _dense(bias)
        if wide is not None:  # a wide forward needs a wide backward (NoWideLaunch before any launch)
            aligned = x.data_ptr() % schedule.VEC_BYTES == 0  # (a misaligned dy is copied: backward)
            param = w if w is not None else b
            _launch("bwd", x, x.get_device(), aligned, num_groups, eps, act, passes, param, wide)
        if _records or _poison or _traces:
            rstd_at, floats = _stats_layout(x.shape[0] * num_groups)
            stats = torch.empty(floats, dtype=torch.float32, device=x.device)
            views = _stats_views(stats, num_groups, rstd_at)
            y, _, _ = forward(x, w, b, num_groups, eps, act, passes, views, wide)
        else:
            y, stats, rstd_at = _forward_lean(x, w, b, num_groups, eps, act, passes, wide)
        ctx.save_for_backward(x, weight, bias, stats)
        ctx.gn = (num_groups, eps, act, passes, rstd_at, wide)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, stats = ctx.saved_tensors
        num_groups, eps, act, passes, rstd_at, wide = ctx.gn
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        want_w, want_b = need_w and weight is not None, need_b and bias is not None
        w, b = _dense(weight), _dense(bias)
        if wide is not None and dy.dtype != wide:  # (autograd hands y's dtype; anything else is cast)
            dy = dy.to(wide)
        if _records or _poison or _traces:
            mean, rstd = _stats_views(stats, num_groups, rstd_at)
            dx, dw, db = backward(dy, x, w, b, mean, rstd, num_groups, eps, act, passes, wide)
        else:
            mean = stats.data_ptr()
            dx, dw, db = _backward_lean(
                dy, x, w, b, mean, mean + rstd_at, num_groups, eps, act, passes, want_w, want_b, wide
            )
        return (
            dx if need_x else None,
            dw if want_w else None,
            db if want_b else None,
            None,
            None,
            None,
            None,
            None,
        )


def _needs_autograd(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> bool:
    """Whether a call must go through `_EagerGroupNorm` (autograd.Function) rather than
    `forward_nograd`: a gradient may be needed, a forward-mode AD level is open (the Function then
    raises that it has no jvp, as before), or a functorch transform is active or x is one of its
    wrappers (the Function unwraps or refuses those)."""
    if torch.is_grad_enabled() and (
        x.requires_grad
        or (weight is not None and weight.requires_grad)
        or (bias is not None and bias.requires_grad)
    ):
        return True
    return (
        _forward_ad._current_level >= 0
        or torch._C._are_functorch_transforms_active()
        or _is_functorch_wrapped(x)
    )


_is_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor
_functorch_active = torch._C._are_functorch_transforms_active
# `_EagerGroupNorm.apply` below its Python wrapper (torch.autograd.Function.apply), about 2 us less:
# with no functorch transform active and no functorch tensor among the arguments, and no
# setup_context defined, that wrapper only calls this one (it binds no defaults and unwraps nothing).
_function_apply = super(torch.autograd.Function, _EagerGroupNorm).apply


def _sync_buffer_of(index: int, stream: int, words: int) -> torch.Tensor:
    """`_sync_buffer` by device index, for the C++ extension (called under the GIL)."""
    device = torch.device("cuda", index) if index >= 0 else torch.device("cpu")  # (CPU: the stub tests)
    return _sync_buffer(device, stream, words)


def _node_sync_pointer(index: int, stream: int, words: int) -> int:
    """The sync buffer of `stream` for the C++ node's backward where it runs on another stream than its
    forward (autograd_node.cpp calls this under the GIL)."""
    return _sync_buffer_of(index, stream, words).data_ptr()


def _entry_address(fn: object) -> int:
    """A library function's address; TypeError for entry points that are not C functions (a Python stub)."""
    address = ctypes.cast(fn, ctypes.c_void_p).value  # type: ignore[arg-type]
    if not address:
        raise TypeError(f"no C address for {fn!r}")
    return address


def _node_part(node: object, one: _Launch, direction: str) -> object:
    """One launch as the C++ extension's `Launch` (entry point, GnArgs bytes around the sync pointer)."""
    before, after = (one.tail_before_sync, one.tail_after_sync) if one.sync_words else (one.tail, b"")
    dw_at, db_at = one.offsets if direction == "bwd" else (0, 0)
    return node.Launch(  # type: ignore[attr-defined]
        _entry_address(one.entry), before, after, one.sync_words, one.scratch_floats, dw_at, db_at
    )


def _op_launch(
    direction: str,
    x: torch.Tensor,
    param: torch.Tensor | None,
    aligned: bool,
    num_groups: int,
    eps: float,
    act: int,
    passes: int,
    wide: bool,
) -> tuple[object, int, int, bool] | None:
    """A call signature's launch for the C++ op kernels (op_kernels.cpp calls this under the GIL, once
    per signature): the extension's `Launch`, the library's error-string entry, the forward's workspace
    floats and whether dweight and dbias come in the parameters' dtype. None where the Python body
    takes these calls: no wide launch (it then runs on a float32 copy), or entry points that are not C
    functions (a Python stub)."""
    node = autograd_node.load()
    try:
        launch = _launch(
            direction,
            x,
            x.get_device(),
            aligned,
            num_groups,
            eps,
            act,
            passes,
            param,
            torch.float32 if wide else None,
        )
        part = _node_part(node, launch, direction)
        return (
            part,
            _entry_address(launch.lib.gn_error_string),
            launch.workspace_floats,
            _typed_param_grads(launch.plan),
        )
    except (NoWideLaunch, TypeError, ctypes.ArgumentError):
        return None


def _node_launches(
    node: object,
    launch: _Launch,
    x: torch.Tensor,
    index: int,
    aligned: bool,
    num_groups: int,
    eps: float,
    act: int,
    passes: int,
    param: torch.Tensor | None,
    wide: torch.dtype | None,
) -> tuple[object, int]:
    """The C++ node's `Launches` for a forward launch (its backward launches found as `_EagerGroupNorm`'s
    would find them now) and the sync words the largest of them needs."""
    bwd = _launch("bwd", x, index, aligned, num_groups, eps, act, passes, param, wide)
    # a wide dy is copied where it is not aligned (_dy_as_x); else a misaligned dy takes the scalar launch
    unaligned = (
        _launch("bwd", x, index, False, num_groups, eps, act, passes, param) if aligned and not wide else None
    )

    launches = node.Launches(  # type: ignore[attr-defined]
        _node_part(node, launch, "fwd"),
        _node_part(node, bwd, "bwd"),
        None if unaligned is None else _node_part(node, unaligned, "bwd"),
        _entry_address(launch.lib.gn_error_string),
        launch.stats_floats,
        launch.workspace_floats,
        launch.rstd_offset,
        _typed_param_grads(bwd.plan),
        wide,
    )
    words = max(launch.sync_words, bwd.sync_words, unaligned.sync_words if unaligned is not None else 0)
    return launches, words


def _node_apply(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    num_groups: int,
    eps: float,
    act: int,
    passes: int,
    wide: torch.dtype | None = None,
) -> torch.Tensor | None:
    """`_EagerGroupNorm.apply` through the C++ node (the default; GN_CPP_NODE=0 skips it): the same
    launches, saved tensors and bits. None where the node does not take the call (not built, launch
    records, poisoning or traces on, a forward-mode AD level open, entry points that are not C functions):
    the caller takes the Function."""
    if _records or _poison or _traces or _forward_ad._current_level >= 0:
        return None  # (before load: the plugin's checks, which record every launch, never build the node)
    node = autograd_node.load()
    if node is None:
        return None
    index = x.get_device()
    aligned = x.data_ptr() % schedule.VEC_BYTES == 0
    param = weight if weight is not None else bias
    launch = _launch("fwd", x, index, aligned, num_groups, eps, act, passes, param, wide)
    found = launch.node
    if found is None:
        try:
            found = _node_launches(node, launch, x, index, aligned, num_groups, eps, act, passes, param, wide)
        except (TypeError, ctypes.ArgumentError):  # (entry points that are not C functions: a Python stub)
            found = False
        launch.node = found
    if found is False:
        return None
    launches, words = found  # type: ignore[misc]
    stream = _raw_stream(index)
    sync = _sync_buffer(x.device, stream, words).data_ptr() if words else 0
    return node.group_norm(x, weight, bias, launches, stream, sync)  # type: ignore[attr-defined]


def group_norm_eager(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    act: int,
    passes: int,
) -> torch.Tensor:
    """Eager mode, arguments already checked (`act` and `passes` as their int codes): the
    autograd.Function when autograd needs it, else the kernels directly (the Function's own cost,
    about 6 us, buys nothing without a graph: the result is the same tensor with no grad_fn)."""
    if _needs_autograd(x, weight, bias):
        if (
            _functorch_active()
            or _is_functorch_wrapped(x)
            or (weight is not None and _is_functorch_wrapped(weight))
            or (bias is not None and _is_functorch_wrapped(bias))
        ):
            return _EagerGroupNorm.apply(x, weight, bias, num_groups, eps, act, passes)
        if autograd_node.requested():
            y = _node_apply(x, weight, bias, num_groups, eps, act, passes)
            if y is not None:
                return y
        return _function_apply(x, weight, bias, num_groups, eps, act, passes)
    return forward_nograd(x, _dense(weight), _dense(bias), num_groups, eps, act, passes)


def group_norm_wide(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    act: int,
    passes: int,
) -> torch.Tensor | None:
    """Autocast's GroupNorm of a float16/bfloat16 `x` without its casts: what torch computes from
    x.float() (float32 arithmetic, float32 y), read from x as it is, and in the backward dx in x's
    dtype from the float32 dy (what the cast's backward would round it to). None where the kernels
    have no wide launch for the call (then the caller casts). weight and bias: float32 or None.

    Eager calls only (no functorch transform, plain tensors), as `group_norm_eager`'s fast route.
    """
    if _functorch_active() or _is_functorch_wrapped(x) or _forward_ad._current_level >= 0:
        return None
    try:  # (NoWideLaunch comes before any allocation or launch)
        if not _needs_autograd(x, weight, bias):
            return forward_nograd(
                x, _dense(weight), _dense(bias), num_groups, eps, act, passes, torch.float32
            )
        if autograd_node.requested():
            y = _node_apply(x, weight, bias, num_groups, eps, act, passes, torch.float32)
            if y is not None:
                return y
        return _function_apply(x, weight, bias, num_groups, eps, act, passes, torch.float32)
    except NoWideLaunch:
        return None


def group_norm_cuda(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    act: str | None,
    passes: object,
    wide: bool = False,
) -> torch.Tensor:
    """Our kernels on a CUDA (N, *spatial, C) tensor: the custom op when torch.compile traces
    (no graph break), else `group_norm_eager` (lower host overhead). ``wide`` (custom op only):
    autocast's float32 y from a float16/bfloat16 x, without a float32 copy of x in the graph."""
    if torch.compiler.is_compiling():
        codes = _ACT_IDS[act], _PASSES[passes]
        y, _, _ = _FWD_OP(x, weight, bias, num_groups, eps, *codes, wide)
        return y
    if wide:
        raise ValueError("group_norm_cuda(): wide is for torch.compile tracing (eager: group_norm_wide)")
    return group_norm_eager(x, num_groups, weight, bias, eps, _ACT_IDS[act], _PASSES[passes])
