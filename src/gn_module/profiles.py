"""GPU profiles: the per-SM limits and SM counts the arch sweep emulates.

Per-SM limits come from NVIDIA's documented compute-capability tables: the CUDA C++
Programming Guide ("Technical Specifications per Compute Capability") as encoded in CCCL's
``libcudacxx/include/cuda/__device/arch_traits.h`` (``cuda::arch_traits<arch_id::sm_XX>``):

* every arch from sm_80 on: 64K 32-bit registers per SM and per block, 1 KB of shared memory
  reserved by the driver per block, opt-in shared memory per block = per-SM amount - 1 KB;
* sm_80 / sm_87: 164 KB shared memory per SM; sm_86 / sm_89 / sm_120 / sm_121: 100 KB;
  sm_90 / sm_100 / sm_103 / sm_110: 228 KB;
* threads per SM 2048 on sm_80, sm_90, sm_100, sm_103; 1536 on sm_86, sm_87, sm_89, sm_110,
  sm_120, sm_121;
* blocks per SM 32 on sm_80, sm_90, sm_100, sm_103; 16 on sm_86, sm_87; 24 on sm_89, sm_110,
  sm_120, sm_121 (arch_traits derives sm_110 from sm_100 with 24 blocks / 1536 threads and
  sm_121 from sm_120).
* registers are allocated per warp in units of 256 (the occupancy calculator's granularity).

SM counts are product facts (datasheets), not compute-capability facts: two products of one
arch differ, so each profile names its product.

Users add profiles with the ini key ``gn_profiles_file`` (a TOML or JSON file) or the conftest
hook ``pytest_gn_add_profiles``; see :func:`profile_from_mapping` for the accepted fields.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from gn_module.schedule import DeviceLimits

KB = 1024

#: Per-SM limits by compute capability (see the module docstring for the source).
CC_LIMITS: dict[tuple[int, int], dict[str, int]] = {
    (8, 0): {"max_threads_per_sm": 2048, "max_blocks_per_sm": 32, "smem_per_sm": 164 * KB},
    (8, 6): {"max_threads_per_sm": 1536, "max_blocks_per_sm": 16, "smem_per_sm": 100 * KB},
    (8, 7): {"max_threads_per_sm": 1536, "max_blocks_per_sm": 16, "smem_per_sm": 164 * KB},
    (8, 9): {"max_threads_per_sm": 1536, "max_blocks_per_sm": 24, "smem_per_sm": 100 * KB},
    (9, 0): {"max_threads_per_sm": 2048, "max_blocks_per_sm": 32, "smem_per_sm": 228 * KB},
    (10, 0): {"max_threads_per_sm": 2048, "max_blocks_per_sm": 32, "smem_per_sm": 228 * KB},
    (10, 3): {"max_threads_per_sm": 2048, "max_blocks_per_sm": 32, "smem_per_sm": 228 * KB},
    (11, 0): {"max_threads_per_sm": 1536, "max_blocks_per_sm": 24, "smem_per_sm": 228 * KB},
    (12, 0): {"max_threads_per_sm": 1536, "max_blocks_per_sm": 24, "smem_per_sm": 100 * KB},
    (12, 1): {"max_threads_per_sm": 1536, "max_blocks_per_sm": 24, "smem_per_sm": 100 * KB},
}

RESERVED_SMEM_PER_BLOCK = 1 * KB


def limits_for(name: str, cc: tuple[int, int], sm_count: int, **overrides: int) -> DeviceLimits:
    """A DeviceLimits from the documented table for `cc`, with optional per-field overrides."""
    cc = (int(cc[0]), int(cc[1]))
    if sm_count < 1:
        raise ValueError(f"profile {name!r}: sm_count must be >= 1, got {sm_count}")
    base = CC_LIMITS.get(cc)
    needed = {"max_threads_per_sm", "max_blocks_per_sm", "smem_per_sm"}
    if base is None and not needed <= set(overrides):
        known = ", ".join(f"{a}.{b}" for a, b in CC_LIMITS)
        raise ValueError(
            f"profile {name!r}: compute capability {cc[0]}.{cc[1]} is not in the built-in table "
            f"({known}); give {sorted(needed)} explicitly"
        )
    values: dict[str, Any] = dict(base or {})
    values.update(overrides)
    values.setdefault("max_smem_per_block", values["smem_per_sm"] - RESERVED_SMEM_PER_BLOCK)
    values.setdefault("reserved_smem_per_block", RESERVED_SMEM_PER_BLOCK)
    return DeviceLimits(name=name, cc=cc, sm_count=int(sm_count), **values)


#: Built-in profiles: (name, cc, SMs, product the SM count is from).
_BUILTIN = (
    ("A100", (8, 0), 108, "A100 SXM/PCIe"),
    ("RTX3090", (8, 6), 82, "GeForce RTX 3090"),
    ("A10", (8, 6), 72, "A10"),
    ("Orin", (8, 7), 16, "Jetson AGX Orin 64GB"),
    ("L4", (8, 9), 58, "L4"),
    ("RTX4090", (8, 9), 128, "GeForce RTX 4090"),
    ("H100", (9, 0), 132, "H100 SXM5"),
    ("H200", (9, 0), 132, "H200 SXM"),
    ("B200", (10, 0), 148, "B200"),
    ("Thor", (11, 0), 20, "Jetson AGX Thor"),
    ("RTX5090", (12, 0), 170, "GeForce RTX 5090"),
    ("GB10", (12, 1), 48, "DGX Spark GB10"),
)

BUILTIN_PROFILES: tuple[DeviceLimits, ...] = tuple(limits_for(n, cc, sms) for n, cc, sms, _ in _BUILTIN)


def _key(name: str) -> str:
    """Lookup key: case-insensitive, ignoring spaces, dashes and underscores."""
    return re.sub(r"[\s_\-]", "", name).lower()


def parse_cc(value: Any) -> tuple[int, int]:
    """Accept "8.6", "sm_86", "86", 8.6, [8, 6] or (8, 6)."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return int(value[0]), int(value[1])
    text = str(value).strip().lower().removeprefix("sm_").removeprefix("compute_")
    m = re.fullmatch(r"(\d+)\.(\d)", text) or re.fullmatch(r"(\d+)(\d)", text)
    if not m:
        raise ValueError(f"cannot read a compute capability from {value!r} (use e.g. '8.6' or 'sm_86')")
    return int(m.group(1)), int(m.group(2))


_FIELDS = {f.name for f in fields(DeviceLimits)}


def profile_from_mapping(data: Mapping[str, Any], name: str | None = None) -> DeviceLimits:
    """Build a profile from a mapping: ``name``, ``cc``, ``sm_count`` and optional per-SM overrides.

    Overrides are any DeviceLimits field (``max_threads_per_sm``, ``max_blocks_per_sm``,
    ``smem_per_sm``, ``max_smem_per_block``, ``regs_per_sm``, ...). They are required when the
    compute capability is not in the built-in table.
    """
    if isinstance(data, DeviceLimits):
        return data
    if not isinstance(data, Mapping):
        raise TypeError(f"a profile must be a table/mapping, got {type(data).__name__}")
    values = dict(data)
    name = str(values.pop("name", name) or "")
    if not name:
        raise ValueError(f"profile {dict(data)!r} has no name")
    for required in ("cc", "sm_count"):
        if required not in values:
            raise ValueError(f"profile {name!r} lacks {required!r}")
    cc = parse_cc(values.pop("cc"))
    sm_count = values.pop("sm_count")
    values.pop("product", None)  # documentation only
    unknown = set(values) - _FIELDS
    if unknown:
        raise ValueError(f"profile {name!r}: unknown field(s) {sorted(unknown)}; known: {sorted(_FIELDS)}")
    try:
        ints = {k: int(v) for k, v in values.items()}
        return limits_for(name, cc, int(sm_count), **ints)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"profile {name!r}: {exc}") from None


def load_profiles_file(path: str | Path) -> list[DeviceLimits]:
    """Profiles from a TOML or JSON file.

    TOML: ``[profiles.MyGPU]`` tables (``cc = "8.6"``, ``sm_count = 30``, ...) or an array
    ``[[profile]]`` with ``name``. JSON: ``{"profiles": {...}}`` / ``{"profiles": [...]}`` or a
    bare list of objects with ``name``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"gn profiles file not found: {path}")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        try:
            data: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: invalid JSON: {exc}") from None
    else:
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            try:
                import tomli as tomllib  # type: ignore[no-redef]
            except ModuleNotFoundError:
                msg = f"{path}: reading TOML needs Python >= 3.11 or 'pip install tomli'"
                raise RuntimeError(msg) from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: invalid TOML: {exc}") from None
    try:
        return profiles_from_data(data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def profiles_from_data(data: Any) -> list[DeviceLimits]:
    """Profiles from parsed file content or a hook's return value (see load_profiles_file)."""
    if isinstance(data, DeviceLimits):
        return [data]
    if isinstance(data, Mapping):
        body = data.get("profiles", data.get("profile"))
        if body is None:
            if "cc" in data:
                return [profile_from_mapping(data)]
            raise ValueError("expected a 'profiles' table or list")
        data = body
        if isinstance(data, Mapping):
            return [profile_from_mapping(v, name=k) for k, v in data.items()]
    if isinstance(data, Iterable) and not isinstance(data, (str, bytes)):
        return [profile_from_mapping(item) for item in data]
    raise TypeError(f"cannot read profiles from {type(data).__name__}")


def merge_profiles(base: Iterable[DeviceLimits], extra: Iterable[DeviceLimits]) -> list[DeviceLimits]:
    """`base` followed by `extra`; an extra profile with a known name replaces the built-in one."""
    out = {_key(p.name): p for p in base}
    for p in extra:
        out[_key(p.name)] = p
    return list(out.values())


def get_profile(name: str, profiles: Iterable[DeviceLimits] = BUILTIN_PROFILES) -> DeviceLimits:
    """Look a profile up by name (case, spaces, dashes and underscores ignored) or by arch (sm_90)."""
    table = list(profiles)
    key = _key(name)
    for p in table:
        if _key(p.name) == key:
            return p
    arch = name.strip().lower()
    by_arch = [p for p in table if p.arch == arch]
    if len(by_arch) == 1:
        return by_arch[0]
    names = ", ".join(p.name for p in table)
    hint = f" ({len(by_arch)} profiles have arch {arch}: be specific)" if by_arch else ""
    raise KeyError(f"unknown GPU profile {name!r}{hint}; known profiles: {names}")


def select_profiles(
    names: str | Iterable[str] | None, profiles: Iterable[DeviceLimits]
) -> list[DeviceLimits]:
    """Profiles named in a comma-separated string or list; None/""/"all" selects every profile."""
    table = list(profiles)
    if names is None:
        return table
    if isinstance(names, str):
        names = [n for n in (s.strip() for s in names.split(",")) if n]
    names = list(names)
    if not names or [n.lower() for n in names] == ["all"]:
        return table
    return [get_profile(n, table) for n in names]


def limits_from_properties(props: Any, name: str | None = None) -> DeviceLimits:
    """DeviceLimits from an object shaped like torch's CUDA device properties.

    Fields torch does not expose (blocks per SM) come from the documented table; a compute
    capability newer than the table takes the nearest older arch's block limit.
    """
    cc = (int(props.major), int(props.minor))
    table = CC_LIMITS.get(cc)
    if table is None:
        older = [k for k in CC_LIMITS if k <= cc]
        if not older:
            raise ValueError(f"compute capability {cc[0]}.{cc[1]} is older than sm_80, which gn_module needs")
        table = CC_LIMITS[max(older)]
    smem_sm = int(getattr(props, "shared_memory_per_multiprocessor", 0) or table["smem_per_sm"])
    return limits_for(
        name or str(props.name),
        cc,
        int(props.multi_processor_count),
        max_threads_per_sm=int(
            getattr(props, "max_threads_per_multi_processor", 0) or table["max_threads_per_sm"]
        ),
        max_blocks_per_sm=table["max_blocks_per_sm"],
        smem_per_sm=smem_sm,
        max_smem_per_block=int(
            getattr(props, "shared_memory_per_block_optin", 0) or smem_sm - RESERVED_SMEM_PER_BLOCK
        ),
        regs_per_sm=int(getattr(props, "regs_per_multiprocessor", 0) or 65536),
    )


def local_device_limits(device: Any = None) -> DeviceLimits:
    """DeviceLimits of a local CUDA device (default: the current one), from torch's properties."""
    import torch  # lazy: importing this module must stay torch-free

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device available: torch.cuda.is_available() is False")
    props = torch.cuda.get_device_properties(torch.cuda.current_device() if device is None else device)
    return limits_from_properties(props)
