"""Just-in-time build of the CUDA library with nvcc and ninja, cached across runs.

The kernels need no torch or pybind headers (Python talks to them through a C ABI and ctypes),
so a build is only nvcc: the translation units (SOURCES) compile in parallel under ninja; the task
backward's kernels are split over two of them because one unit held the build at its length.

Cache and safety:
- One cache entry per (variant, sources, flags, nvcc version) under ``$GN_CACHE_DIR``
  (default ``~/.cache/gn_module``). The finished library is renamed into place atomically, so
  a present library is always complete.
- Builds of one entry are serialized by an OS file lock (``fcntl.flock``), which the kernel
  drops when a process dies, so a build killed midway never makes the next run wait forever;
  the next run simply builds again in a fresh folder.

Variants: ``None`` is the native build for the current device (``sm_XY`` machine code);
``"compute_80"`` and the like are PTX-only builds that the driver JIT-compiles, so code runs with
``__CUDA_ARCH__`` of that virtual arch on a newer GPU (what the arch sweep uses).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gn_module import _abi

SOURCES = ("gn_forward.cu", "gn_backward.cu", "gn_backward_tasks.cu", "gn_backward_onepass.cu", "gn_api.cu")
#: A build's cache key covers every header beside the sources (derived, so a new header needs no listing).
HEADER_SUFFIXES = (".h", ".cuh")
NVCC_FLAGS = ("-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-lineinfo")

_loaded: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


class BuildError(RuntimeError):
    """The CUDA library could not be built (nvcc missing or a compile error)."""


class NvccNotFound(BuildError):
    """No nvcc on this machine: the JIT build fails and compile-based checks skip."""


def csrc_dir() -> Path:
    """Folder with the CUDA sources: $GN_CSRC_DIR, the installed package's, or the checkout's."""
    override = os.environ.get("GN_CSRC_DIR")
    if override:
        return Path(override)
    here = Path(__file__).resolve().parent
    for candidate in (here / "csrc", here.parents[1] / "csrc"):
        if (candidate / SOURCES[0]).is_file():
            return candidate
    raise BuildError(f"gn_module: CUDA sources not found next to {here} (set GN_CSRC_DIR)")


def find_nvcc() -> str:
    """Path of nvcc: $GN_NVCC, then $CUDA_HOME/bin, $CUDA_PATH/bin, PATH, /usr/local/cuda/bin."""
    explicit = os.environ.get("GN_NVCC")
    if explicit:
        if Path(explicit).is_file():
            return explicit
        raise NvccNotFound(f"GN_NVCC={explicit} does not exist")
    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "bin" / "nvcc")
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    raise NvccNotFound(
        "gn_module needs the CUDA toolkit compiler (nvcc) to build its kernels, and none was found "
        "(looked at $GN_NVCC, $CUDA_HOME/bin, $CUDA_PATH/bin, PATH, /usr/local/cuda/bin): install the "
        "CUDA toolkit (12.8 or newer, matching your driver) and put nvcc on PATH or set CUDA_HOME; e.g. "
        "'apt install cuda-nvcc-13-0', 'conda install -c nvidia cuda-nvcc' or 'pip install nvidia-cuda-nvcc'"
    )


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else "unknown"


def arch_flags(variant: str | None, device_cc: tuple[int, int] | None) -> list[str]:
    """nvcc -gencode flags: native machine code for the device, or PTX only for a virtual arch."""
    if variant is None:
        if device_cc is None:
            raise BuildError("gn_module: a native build needs a CUDA device (or name a variant)")
        sm = f"{device_cc[0]}{device_cc[1]}"
        return [f"-gencode=arch=compute_{sm},code=sm_{sm}"]
    m = re.fullmatch(r"compute_(\d+)([af]?)", variant)
    if not m:
        raise ValueError(f"gn_module: build variant must look like 'compute_80', got {variant!r}")
    return [f"-gencode=arch={variant},code={variant}"]


def extra_flags() -> list[str]:
    return shlex.split(os.environ.get("GN_NVCC_FLAGS", ""))


def cache_root() -> Path:
    return Path(os.environ.get("GN_CACHE_DIR", Path.home() / ".cache" / "gn_module"))


def headers(src: Path) -> tuple[str, ...]:
    """The headers in the sources' folder `src`, by name."""
    return tuple(sorted(p.name for p in src.iterdir() if p.suffix in HEADER_SUFFIXES))


def _entry_key(src: Path, flags: list[str], nvcc_ver: str) -> str:
    h = hashlib.sha256()
    for name in SOURCES + headers(src):
        h.update(name.encode())
        h.update((src / name).read_bytes())
    h.update(" ".join(flags).encode())
    h.update(nvcc_ver.encode())
    return h.hexdigest()[:16]


def _ninja_file(nvcc: str, src: Path, flags: list[str], out_name: str) -> str:
    quoted = " ".join(shlex.quote(f) for f in flags)
    lines = [
        "ninja_required_version = 1.3",
        f"nvcc = {shlex.quote(nvcc)}",
        f"flags = {quoted}",
        "rule cu",
        "  command = $nvcc $flags -I" + shlex.quote(str(src)) + " -c $in -o $out",
        "  description = nvcc $in",
        "rule link",
        "  command = $nvcc -shared $in -o $out",
        "  description = link $out",
    ]
    objects = []
    for s in SOURCES:
        obj = s.replace(".cu", ".o")
        objects.append(obj)
        lines.append(f"build {obj}: cu {shlex.quote(str(src / s))}")
    lines.append(f"build {out_name}: link {' '.join(objects)}")
    return "\n".join(lines) + "\n"


def _ninja() -> str:
    exe = shutil.which("ninja")
    if exe:
        return exe
    try:
        import ninja  # the PyPI package ships the binary

        return str(Path(ninja.BIN_DIR) / "ninja")
    except ImportError as exc:
        raise BuildError("gn_module: ninja is required to build the kernels (pip install ninja)") from exc


def build(
    variant: str | None = None, device_cc: tuple[int, int] | None = None, *, quiet: bool = False
) -> Path:
    """Build (or find in the cache) the library for `variant`; returns the .so path."""
    nvcc = find_nvcc()
    src = csrc_dir()
    flags = [*NVCC_FLAGS, *arch_flags(variant, device_cc), *extra_flags()]
    tag = variant or f"sm_{device_cc[0]}{device_cc[1]}"  # type: ignore[index]
    key = _entry_key(src, flags, nvcc_version(nvcc))
    entry = cache_root() / f"{tag}-{key}"
    lib_path = entry / "libgn_module.so"
    if lib_path.is_file():
        return lib_path
    entry.mkdir(parents=True, exist_ok=True)
    with open(entry / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the OS if this process dies
        if lib_path.is_file():  # another process finished it while we waited
            return lib_path
        work = Path(tempfile.mkdtemp(prefix="build-", dir=entry))
        if not quiet:
            print(f"gn_module: building CUDA kernels ({tag}) in {entry} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        (work / "build.ninja").write_text(_ninja_file(nvcc, src, flags, "libgn_module.so"))
        proc = subprocess.run([_ninja(), "-C", str(work)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BuildError(f"gn_module: building the CUDA kernels failed:\n{proc.stdout}\n{proc.stderr}")
        os.replace(work / "libgn_module.so", lib_path)  # atomic: the library is whole or absent
        shutil.rmtree(work, ignore_errors=True)
        if not quiet:
            print(
                f"gn_module: built {tag} in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True
            )
    return lib_path


def load(variant: str | None = None, device_cc: tuple[int, int] | None = None) -> ctypes.CDLL:
    """The loaded library for `variant` (built on first use)."""
    if variant is None and device_cc is None:
        raise BuildError("gn_module: a native build needs the device's compute capability")
    tag = variant if variant is not None else f"sm_{device_cc[0]}{device_cc[1]}"  # type: ignore[index]
    with _lock:
        lib = _loaded.get(tag)
        if lib is None:
            lib = _abi.declare(ctypes.CDLL(str(build(variant, device_cc))))
            _abi.check_abi(lib)
            _loaded[tag] = lib
    return lib
