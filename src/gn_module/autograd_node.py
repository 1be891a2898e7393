"""The eager training path's autograd node in C++ (`autograd_node.cpp`), on by default.

Where a call needs autograd, `ops.group_norm_eager` (and the wide autocast route) hands it to this node
instead of the Python `autograd.Function` (`ops._EagerGroupNorm`): the same launches, the same saved
tensors and the same bits, with less host time per layer and step (benchmarks/RESULTS.md session 33, H200:
one small layer's training step 164 -> 125 us in fp32, 203 -> 146 us under bf16 autocast; the GPU suite
passed through it). GN_CPP_NODE=0 turns it off. Launch records, poisoning, phase traces, functorch
transforms and forward-mode AD keep the Python route.

The extension builds with torch.utils.cpp_extension (a C++ compiler and ninja; 23 s on the H200 machine,
about 40 s on 2 cores) on the first training call, cached per torch version and source under the build
cache (GN_CACHE_DIR, see `build.cache_root`). A failed build warns once and leaves the Python route in
place.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType

import torch

ENV = "GN_CPP_NODE"
SOURCE = Path(__file__).resolve().with_name("autograd_node.cpp")
#: The extension's sources: the node, the custom ops' C++ kernels (gn_module.op_kernels) and what they share.
SOURCES = (SOURCE, SOURCE.with_name("op_kernels.cpp"))
HEADERS = (SOURCE.with_name("launches.h"),)

_module: ModuleType | None = None
_failed = False
_lock = threading.Lock()


def requested() -> bool:
    """Whether training calls take the node: yes unless GN_CPP_NODE is "0"."""
    return os.environ.get(ENV, "1") != "0"


def build_dir() -> Path:
    """Where the extension is built: per torch version and source hash, under the kernels' build cache."""
    from gn_module import build

    digest = hashlib.sha256(b"".join(path.read_bytes() for path in (*SOURCES, *HEADERS))).hexdigest()[:16]
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
                fresh = not any(where.glob("*.so"))
                if fresh:  # (the first training call waits for it: say why)
                    print(
                        f"gn_module: building the C++ autograd node in {where} ...",
                        file=sys.stderr,
                        flush=True,
                    )
                began = time.perf_counter()
                module = load_extension(
                    "gn_autograd_node",
                    [str(path) for path in SOURCES],
                    extra_cflags=["-O2"],
                    build_directory=str(where),
                )
                if fresh:
                    print(
                        f"gn_module: built the C++ autograd node in {time.perf_counter() - began:.1f} s",
                        file=sys.stderr,
                        flush=True,
                    )
                from gn_module import ops

                module.set_sync_pointer(ops._node_sync_pointer)
                _module = module
            except Exception as exc:  # (a compiler, ninja or header problem: the Python route still works)
                _failed = True
                warnings.warn(
                    f"gn_module: the C++ autograd node could not be built ({exc}); the Python "
                    f"autograd.Function runs instead (same results, more host time; {ENV}=0 skips the build)",
                    RuntimeWarning,
                    stacklevel=3,
                )
    return _module
