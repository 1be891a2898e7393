"""ctypes mirror of `GnArgs` in csrc/gn_api.h, and the library's function signatures.

The field order and types must match the C struct exactly; `check_abi` compares sizes at load.
"""

from __future__ import annotations

import ctypes
import struct

MAX_LEVELS = 8
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}
DIRECTION_CODES = {"fwd": 0, "bwd": 1}
#: gn_module.functional.ACTS -> GnArgs.act ("identity" is no activation, as None)
ACT_CODES = {None: 0, "identity": 0, "silu": 1, "relu": 2, "gelu": 3, "gelu_tanh": 4}
# Kernel kinds of gn_kernel_attributes (csrc/gn_launch.h, enum KernelKind).
KERNEL_KINDS = {
    "fwd_tiles": 0,
    "fwd_apply": 1,
    "fwd_onepass": 2,
    "fwd_combine": 3,
    "level_reduce": 4,
    "bwd_tiles": 5,
    "bwd_apply": 6,
    "bwd_onepass": 7,
    "bwd_combine": 8,
}

_p = ctypes.c_void_p
_i64 = ctypes.c_int64
_i32 = ctypes.c_int32
_u32 = ctypes.c_uint32
#: The task geometry's divisors that GnArgs also carries as (mul, shift) pairs, by field name
#: (schedule.fast_divisor; csrc fast_div).
FAST_DIVISORS = ("team_size", "windows_per_sample", "cols_threads", "chunk_rows", "channels_per_group")


class GnArgs(ctypes.Structure):
    _fields_ = [
        ("x", _p),
        ("dy", _p),
        ("out", _p),
        ("weight", _p),
        ("bias", _p),
        ("mean", _p),
        ("rstd", _p),
        ("workspace", _p),
        ("dweight", _p),
        ("dbias", _p),
        ("record", _p),
        ("n", _i64),
        ("s", _i64),
        ("c", _i64),
        ("g", _i64),
        ("rows_per_tile", _i64),
        ("tiles_per_slice", _i64),
        ("off_partials", _i64),
        ("off_level", _i64),
        ("off_channel_sums", _i64),
        ("off_group_sums", _i64),
        ("level_tiles", _i64 * MAX_LEVELS),
        ("nlevels", _i32),
        ("fanin", _i32),
        ("dtype", _i32),
        ("w_dtype", _i32),
        ("vec", _i32),
        ("cols_threads", _i32),
        ("col_chunks", _i32),
        ("rows_threads", _i32),
        ("act", _i32),
        ("eps", ctypes.c_float),
        ("schedule", _i32),
        ("grid", _i32),
        ("smem", _i32),
        ("device", _i32),
        ("arch", _i32),
        ("slots", _i32),
        ("team_size", _i32),
        ("teams", _i32),
        ("window", _i64),
        ("tiles_per_task", _i64),
        ("chunk_rows", _i64),
        ("sync", _p),
        ("trace", _p),
        ("channels_per_group", _i32),
        ("groups_per_window", _i32),
        ("windows_per_sample", _i32),
        ("chunks_per_tile", _i32),
        ("off_group_partials", _i64),
        ("grad_dtype", _i32),
        ("wide_dtype", _i32),  # y's (forward) / dy's (backward) dtype code: dtype, or float32 (wide)
        ("dependent_launch", _i32),  # 1: the apply launch is a programmatic dependent launch (sm_90)
        ("cluster_teams", _i32),  # 1: the one-launch forward's teams run as thread-block clusters (sm_90)
        # n / d as (umulhi(n, mul) + n) >> shift for the task geometry's divisors (schedule.fast_divisor)
        *((f"{name}_{part}", _u32) for name in FAST_DIVISORS for part in ("mul", "shift")),
        ("stagger_ns", _i32),  # the one-launch forward's team stagger (schedule.team_stagger; 0: off)
        ("stagger_phases", _i32),  # team j starts (j % stagger_phases) * stagger_ns late
        ("strip_blocks", _i32),  # backward apply launch: extra blocks for the dweight/dbias strips
        ("l2_keep_bytes", _i64),  # re-read chunks the copies ask L2 to keep (schedule.l2_keep_bytes; 0: none)
    ]


# The data pointers lead the struct, so a launch packs them in one go in front of the rest of a
# cached GnArgs (ops.forward_nograd), in this order.
POINTER_FIELDS = (
    "x",
    "dy",
    "out",
    "weight",
    "bias",
    "mean",
    "rstd",
    "workspace",
    "dweight",
    "dbias",
    "record",
)
POINTERS = struct.Struct(f"@{len(POINTER_FIELDS)}P")
POINTERS_SIZE = POINTERS.size
if [(name, kind, getattr(GnArgs, name).offset) for name, kind in GnArgs._fields_[: len(POINTER_FIELDS)]] != [
    (name, _p, i * ctypes.sizeof(_p)) for i, name in enumerate(POINTER_FIELDS)
]:
    raise RuntimeError("gn_module: GnArgs must start with the pointers of _abi.POINTER_FIELDS")


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Attach argument and result types to the library's entry points."""
    ip = ctypes.POINTER(ctypes.c_int)
    # (const GnArgs*, cudaStream_t): a ctypes.byref(GnArgs) or GnArgs bytes, and the raw stream.
    lib.gn_forward.argtypes = [_p, _p]
    lib.gn_backward.argtypes = [_p, _p]
    lib.gn_onepass_occupancy.argtypes = [ctypes.c_int] * 5 + [ip]
    lib.gn_task_occupancy.argtypes = [ctypes.c_int] * 5 + [ip]
    lib.gn_task_occupancy_wide.argtypes = [ctypes.c_int] * 6 + [ip]
    lib.gn_kernel_attributes.argtypes = [ctypes.c_int] * 4 + [ip, ip, ip]
    lib.gn_runtime_arch.argtypes = [ctypes.c_int, ip]
    lib.gn_error_string.argtypes = [ctypes.c_int]
    lib.gn_error_string.restype = ctypes.c_char_p
    lib.gn_abi_size.argtypes = []
    for fn in (
        lib.gn_forward,
        lib.gn_backward,
        lib.gn_onepass_occupancy,
        lib.gn_task_occupancy,
        lib.gn_task_occupancy_wide,
        lib.gn_kernel_attributes,
        lib.gn_runtime_arch,
        lib.gn_abi_size,
    ):
        fn.restype = ctypes.c_int
    return lib


def check_abi(lib: ctypes.CDLL) -> None:
    size = lib.gn_abi_size()
    if size != ctypes.sizeof(GnArgs):
        raise RuntimeError(
            f"gn_module: the compiled library's GnArgs is {size} bytes but Python's mirror is "
            f"{ctypes.sizeof(GnArgs)}; csrc/gn_api.h and gn_module/_abi.py disagree"
        )
