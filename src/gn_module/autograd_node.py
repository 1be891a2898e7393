"""The eager training path's autograd node in C++ (`autograd_node.cpp`): opt-in with GN_CPP_NODE=1.

Where a call needs autograd, `ops.group_norm_eager` (and the wide autocast route) hands it to this node
instead of the Python `autograd.Function` (`ops._EagerGroupNorm`): the same launches, the same saved
tensors and the same bits, with less host time per layer and step (CPU measurement with stub kernels,
benchmarks/RESULTS.md session 32: a training step 110-116 -> 68-71 us). Opt-in until the GPU suite has
passed on it. Launch records, poisoning, phase traces, functorch transforms and forward-mode AD keep the
Python route.

The extension builds with torch.utils.cpp_extension (a C++ compiler and ninja; about a minute) on first
use, cached per torch version and source under the build cache (GN_CACHE_DIR, see `build.cache_root`). A
failed build warns once and leaves the Python route in place.
"""

from __future__ import annotations

import hashlib
import os
import threading
import warnings
from pathlib import Path
from types import ModuleType

import torch

ENV = "GN_CPP_NODE"
SOURCE = Path(__file__).resolve().with_name("autograd_node.cpp")

_module: ModuleType | None = None
_failed = False
_lock = threading.Lock()


def requested() -> bool:
    """Whether GN_CPP_NODE asks for the node ("1"; off otherwise)."""
    return os.environ.get(ENV) == "1"


def build_dir() -> Path:
    """Where the extension is built: per torch version and source hash, under the kernels' build cache."""
    from gn_module import build

    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return build.cache_root() / "autograd_node" / f"torch-{torch.__version__}-{digest}"


def load() -> ModuleType | None:
    """The built extension, or None where it cannot be built (warned once)."""
    global _module, _failed
    if _module is not None or _failed:
        return _module
    with _lock:
        if _module is None and not _failed:
            try:
                from torch.utils.cpp_extension import load as load_extension

                where = build_dir()
                where.mkdir(parents=True, exist_ok=True)
                module = load_extension(
                    "gn_autograd_node", [str(SOURCE)], extra_cflags=["-O2"], build_directory=str(where)
                )
                from gn_module import ops

                module.set_sync_pointer(ops._node_sync_pointer)
                _module = module
            except Exception as exc:  # (a compiler, ninja or header problem: the Python route still works)
                _failed = True
                warnings.warn(
                    f"gn_module: {ENV}=1 but the C++ autograd node could not be built ({exc}); "
                    "the Python autograd.Function runs instead",
                    RuntimeWarning,
                    stacklevel=3,
                )
    return _module
