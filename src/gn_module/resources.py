"""Compile the CUDA sources for one arch with nvcc and read each kernel's resources from ptxas.

``compile_arch("sm_80")`` runs ``nvcc -cubin -arch=sm_80 -O3 -std=c++17 -Xptxas -v`` on every
``csrc/*.cu`` (in parallel) and parses the ptxas report into one :class:`KernelReport` per
kernel: registers, static shared memory, local memory, stack and spills; with ``sass=True`` also each
kernel's local loads and stores in its SASS (cuobjdump). Results are cached on disk by (arch, hash of the
sources, nvcc version, flags). No torch, no GPU needed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

# nvcc and the sources are found the way the JIT build finds them (one place); callers catch
# resources.NvccNotFound to skip compile checks.
from gn_module.build import NvccNotFound as NvccNotFound
from gn_module.build import csrc_dir, find_nvcc
from gn_module.schedule import KernelResources

NVCC_FLAGS = ("-O3", "-std=c++17", "-Xptxas", "-v")
KERNELS = (
    "fwd_onepass",
    "fwd_tiles",
    "fwd_apply",
    "fwd_combine",
    "level_reduce",
    "bwd_onepass",
    "bwd_tiles",
    "bwd_combine",
    "bwd_apply",
    "fwd_task_onepass",
    "fwd_task_stats",
    "fwd_task_apply",
)
# Itanium-mangled template arguments we name; anything else keeps the raw name.
_TYPE_CODES = {"f": "fp32", "d": "fp64", "6__half": "fp16", "13__nv_bfloat16": "bf16"}
# Kernels whose bool template argument picks a variant the launcher chooses per plan: true is named by
# the variant, false (the default instantiation) is left out, so the default keeps the config name the
# plugin and the launcher's occupancy use (bwd_task_stats' kColdRows: csrc/gn_backward_tasks.cu).
VARIANT_FLAGS = {"bwd_task_stats": "cold"}


class CompileError(RuntimeError):
    """nvcc failed for one source and arch; the message carries its output."""


def nvcc_version(nvcc: str | None = None) -> str:
    """The 'release X.Y, VX.Y.Z' part of `nvcc --version`."""
    out = subprocess.run([nvcc or find_nvcc(), "--version"], capture_output=True, text=True, check=False)
    m = re.search(r"release [\d.]+, V[\d.]+", out.stdout)
    return m.group(0) if m else out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "unknown"


def supported_archs(nvcc: str | None = None) -> list[str]:
    """Real archs (sm_XX) this nvcc can compile for."""
    cmd = [nvcc or find_nvcc(), "--list-gpu-code"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return [a for a in out.stdout.split() if a.startswith("sm_")]


def sources(root: Path | None = None) -> list[Path]:
    root = root or csrc_dir()
    return sorted(root.glob("*.cu"))


def sources_hash(root: Path | None = None) -> str:
    """Hash of every source and header under `root` (headers change kernels too)."""
    root = root or csrc_dir()
    h = hashlib.sha256()
    for p in sorted(p for p in root.iterdir() if p.suffix in (".cu", ".cuh", ".h", ".hpp")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class KernelReport:
    """One kernel as ptxas compiled it for one arch."""

    mangled: str
    name: str  # readable config name, e.g. fwd_onepass[fp16,vec8]; the raw name when unknown
    arch: str
    source: str
    registers: int = 0
    static_smem: int = 0
    local_bytes: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    barriers: int = 0
    # LDL/STL instructions in the kernel's SASS (compile_arch(sass=True) with cuobjdump and nvdisasm found);
    # -1: not counted. Locals that never lived in registers show here, not in ptxas' spills.
    local_accesses: int = -1
    # The longest run of 64-bit L2 loads (ld.global.cg: the combine's float2 partials, csrc sum_partials) in
    # its SASS with no floating-point add between them: 16 where a batch of partials is in flight at once,
    # 1 where each load waits for the previous addition, 0 without such loads; -1: not read (as above).
    load_batch: int = -1

    @property
    def spills(self) -> bool:
        """Any register spill or local memory (both cost memory traffic the design avoids)."""
        return bool(self.spill_stores or self.spill_loads or self.local_bytes)

    @property
    def resources(self) -> KernelResources:
        return KernelResources(registers=self.registers, static_smem=self.static_smem)

    def describe(self) -> str:
        text = f"{self.name}: {self.registers} regs, {self.static_smem} B smem"
        if self.spills or self.stack_bytes:
            text += (
                f", {self.local_bytes} B lmem, {self.stack_bytes} B stack, "
                f"{self.spill_stores}/{self.spill_loads} B spill st/ld"
            )
        return text


def _source_name(mangled: str, pos: int) -> tuple[str, int]:
    m = re.match(r"(\d+)", mangled[pos:])
    if not m:
        raise ValueError
    n = int(m.group(1))
    start = pos + len(m.group(1))
    return mangled[start : start + n], start + n


def readable_name(mangled: str) -> str:
    """``_ZN2gn11fwd_onepassI6__halfLi8EEEv6GnArgs`` -> ``fwd_onepass[fp16,vec8]``.

    Only the shapes the kernels use are understood (namespace gn, template arguments that are
    x dtypes or int literals); every other name is returned unchanged. A type argument after the
    vector width is the task kernels' wide type (y or dy): left out where it is x's (a mangled
    substitution or the same code), ``wide`` where it is float32 for a float16/bfloat16 x
    (``fwd_task_apply[bf16,vec8,wide]``). A bool argument of a `VARIANT_FLAGS` kernel names its
    variant when true (``bwd_task_stats[fp16,vec8,cold]``) and is left out when false.
    """
    if not mangled.startswith("_ZN2gn"):
        return mangled
    try:
        base, pos = _source_name(mangled, len("_ZN2gn"))
        if mangled.startswith("E", pos):
            return base
        if not mangled.startswith("I", pos):
            return mangled
        pos += 1
        args: list[str] = []
        ints = 0
        while not mangled.startswith("E", pos):
            lit = re.match(r"L[ij](n?\d+)E", mangled[pos:])
            if lit:
                value = lit.group(1).replace("n", "-")
                args.append(f"vec{value}" if ints == 0 else value)
                ints += 1
                pos += len(lit.group(0))
                continue
            lit = re.match(r"Lb([01])E", mangled[pos:])
            if lit:
                flag = VARIANT_FLAGS.get(base)
                if flag is None:
                    args.append("true" if lit.group(1) == "1" else "false")
                elif lit.group(1) == "1":
                    args.append(flag)
                pos += len(lit.group(0))
                continue
            sub = re.match(r"S\d*_", mangled[pos:])
            if sub and ints:  # the wide type is x's, mangled as a back-reference
                pos += len(sub.group(0))
                continue
            for code, label in _TYPE_CODES.items():
                if mangled.startswith(code, pos):
                    if not ints:
                        args.append(label)
                    elif label != args[0]:
                        args.append("wide")
                    pos += len(code)
                    break
            else:
                return mangled
        return f"{base}[{','.join(args)}]"
    except (ValueError, IndexError):
        return mangled


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")


def kernel_of(config: str) -> str:
    """The kernel a config names: ``fwd_onepass[fp16,vec8]`` -> ``fwd_onepass``."""
    return config.split("[", 1)[0]


def parse_ptxas(text: str, arch: str = "", source: str = "") -> list[KernelReport]:
    """Parse ``ptxas -v`` output into one report per entry (kernel) function."""
    reports: dict[str, dict] = {}
    entry: str | None = None
    props_for: str | None = None
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            entry = m.group(1)
            reports[entry] = {"mangled": entry, "arch": m.group(2) or arch, "source": source}
            continue
        m = _PROPS.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = _FRAME.search(line)
        if m and props_for in reports:
            reports[props_for].update(
                stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3))
            )
            continue
        m = _USED.search(line)
        if m and entry in reports:
            r = reports[entry]
            r["registers"] = int(m.group(1))
            for key, pattern in (
                ("static_smem", r"(\d+) bytes smem"),
                ("local_bytes", r"(\d+) bytes lmem"),
                ("barriers", r"used (\d+) barriers"),
            ):
                mm = re.search(pattern, line)
                if mm:
                    r[key] = int(mm.group(1))
    return [KernelReport(name=readable_name(r["mangled"]), **r) for r in reports.values()]


@dataclass
class ArchReport:
    """Every kernel of every source compiled for one arch."""

    arch: str
    nvcc: str
    sources_hash: str
    kernels: list[KernelReport] = field(default_factory=list)
    cached: bool = False

    def by_name(self) -> dict[str, KernelReport]:
        return {k.name: k for k in self.kernels}

    def resources(self, config: str) -> KernelResources:
        """KernelResources of a config like ``fwd_onepass[fp16,vec8]`` (KeyError naming the known ones)."""
        table = self.by_name()
        if config not in table:
            # the same kernel's configurations where there are any (a renamed template argument), else all
            near = sorted(n for n in table if kernel_of(n) == kernel_of(config)) or sorted(table)
            raise KeyError(f"no kernel {config!r} for {self.arch}; compiled: {', '.join(near)}")
        return table[config].resources

    def launch_resources(self, config: str) -> KernelResources:
        """What a launch of ``config`` must plan residency for: its resources, or where the launcher
        may pick a `VARIANT_FLAGS` variant of it instead, the larger registers and shared memory of
        each (KeyError as `resources`)."""
        res = self.resources(config)
        flag = VARIANT_FLAGS.get(kernel_of(config))
        variant = f"{config[:-1]},{flag}]" if flag and config.endswith("]") else None
        table = self.by_name()
        if variant in table:
            alt = table[variant].resources
            res = KernelResources(max(res.registers, alt.registers), max(res.static_smem, alt.static_smem))
        return res

    @property
    def spilling(self) -> list[KernelReport]:
        return [k for k in self.kernels if k.spills]


def _cache_dir() -> Path:
    root = os.environ.get("GN_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "pytest-gn" / "resources"


def find_cuda_tool(name: str, nvcc: str | None = None) -> str | None:
    """A CUDA binary tool (cuobjdump, nvdisasm) on PATH, beside nvcc, or in its nvidia-cuda-* pip wheel."""
    found = shutil.which(name)
    if found:
        return found
    try:
        beside = Path(nvcc or find_nvcc()).parent / name
        if beside.exists():
            return str(beside)
    except NvccNotFound:
        pass
    try:
        import nvidia  # type: ignore[import-not-found]
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for candidate in Path(root).glob(f"cu*/bin/{name}"):
            return str(candidate)
    return None


def sass_tools(nvcc: str | None = None) -> tuple[str, str] | None:
    """(cuobjdump, nvdisasm), or None without either (``cuobjdump -sass`` runs nvdisasm)."""
    cuobjdump, nvdisasm = find_cuda_tool("cuobjdump", nvcc), find_cuda_tool("nvdisasm", nvcc)
    return None if cuobjdump is None or nvdisasm is None else (cuobjdump, nvdisasm)


def _kernel_lines(sass: str) -> dict[str, list[str]]:
    """The lines of a ``cuobjdump -sass`` listing per kernel (its mangled name), in order."""
    kernels: dict[str, list[str]] = {}
    lines: list[str] | None = None
    for line in sass.splitlines():
        head = re.search(r"Function : (\S+)", line)
        if head:
            lines = kernels.setdefault(head.group(1), [])
        elif lines is not None:
            lines.append(line)
    return kernels


def local_accesses(sass: str) -> dict[str, int]:
    """LDL/STL instructions per kernel (its mangled name) of a ``cuobjdump -sass`` listing."""
    return {
        kernel: sum(1 for line in lines if re.search(r"\b(LDL|STL)\b", line))
        for kernel, lines in _kernel_lines(sass).items()
    }


def load_batches(sass: str) -> dict[str, int]:
    """KernelReport.load_batch per kernel (its mangled name) of a ``cuobjdump -sass`` listing."""
    best: dict[str, int] = {}
    for kernel, lines in _kernel_lines(sass).items():
        run = best[kernel] = 0
        for line in lines:
            if re.search(r"\bLDG\.E\.64\.STRONG\.GPU\b", line):
                run += 1
                best[kernel] = max(best[kernel], run)
            elif re.search(r"\bFADD\b", line):
                run = 0
    return best


def _read_sass(cubin: Path, tools: tuple[str, str]) -> str:
    cuobjdump, nvdisasm = tools
    env = {**os.environ, "NVDISASM_PATH": str(Path(nvdisasm).parent)}
    cmd = [cuobjdump, "-sass", str(cubin)]
    dump = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if dump.returncode != 0:
        raise CompileError(f"cuobjdump -sass failed on {cubin.name}: {dump.stderr.strip()}")
    return dump.stdout


def compile_source(
    nvcc: str, src: Path, arch: str, extra_flags: Sequence[str] = (), sass: tuple[str, str] | None = None
) -> list[KernelReport]:
    """Compile one source to a cubin for `arch` and return its kernels (CompileError on failure); with
    `sass` (sass_tools()), each kernel's local_accesses from the cubin's SASS too."""
    with tempfile.TemporaryDirectory(prefix="gn-res-") as tmp:
        cubin = Path(tmp) / "out.cubin"
        cmd = [
            nvcc, "-cubin", f"-arch={arch}", *NVCC_FLAGS, *extra_flags,
            "-I", str(src.parent), "-o", str(cubin), str(src),
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        listing = _read_sass(cubin, sass) if proc.returncode == 0 and sass is not None else None
    if proc.returncode != 0:
        raise CompileError(
            f"nvcc failed for {src.name} on {arch} (exit {proc.returncode}):\n"
            f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
        )
    kernels = parse_ptxas(proc.stdout + proc.stderr, arch=arch, source=src.name)
    if listing is not None:
        counts, batches = local_accesses(listing), load_batches(listing)
        kernels = [
            replace(k, local_accesses=counts.get(k.mangled, -1), load_batch=batches.get(k.mangled, -1))
            for k in kernels
        ]
    return kernels


def compile_arch(
    arch: str,
    root: Path | None = None,
    *,
    nvcc: str | None = None,
    extra_flags: Sequence[str] = (),
    use_cache: bool = True,
    workers: int | None = None,
    only: Sequence[str] | None = None,
    sass: bool = False,
) -> ArchReport:
    """Compile every ``*.cu`` under `root` for `arch` (``sm_80`` or ``80``), or only the sources named in
    `only` (file names, e.g. a check that needs one kernel family: nvcc time is most of a CPU CI run);
    cached on disk. `sass`: also count each kernel's local loads and stores in its SASS (where
    sass_tools() finds the tools; else local_accesses stays -1), cached apart."""
    arch = arch if arch.startswith("sm_") else f"sm_{arch}"
    nvcc = nvcc or find_nvcc()
    root = Path(root) if root is not None else csrc_dir()
    srcs = sources(root)
    if only is not None:
        missing = sorted(set(only) - {s.name for s in srcs})
        if missing:
            raise FileNotFoundError(f"no source {', '.join(missing)} under {root}")
        srcs = [s for s in srcs if s.name in only]
    if not srcs:
        raise FileNotFoundError(f"no *.cu sources under {root}")
    version = nvcc_version(nvcc)
    digest = sources_hash(root)
    parts: list = [arch, digest, version, list(NVCC_FLAGS), list(extra_flags)]
    if only is not None:
        parts.append(sorted(s.name for s in srcs))
    tools = sass_tools(nvcc) if sass else None
    if sass:  # (the default key is unchanged: the plugin's cached reports stay valid)
        parts.append(["sass", tools is not None, "load_batch"])  # (the SASS fields read)
    key = hashlib.sha256(json.dumps(parts).encode())
    cache = _cache_dir() / f"{arch}-{key.hexdigest()[:20]}.json"
    if not use_cache:
        return _compile_report(nvcc, srcs, arch, version, digest, extra_flags, workers, tools)
    cached = _read_report(cache, arch, version, digest)
    if cached is not None:
        return cached
    # One process compiles, the others wait and read its result: without the lock every xdist worker
    # of a sweep compiled every profile's arch (8 workers: 8x the nvcc time, 245 s instead of 30 s).
    with _cache_lock(cache):
        cached = _read_report(cache, arch, version, digest)  # another process finished it meanwhile
        if cached is not None:
            return cached
        report = _compile_report(nvcc, srcs, arch, version, digest, extra_flags, workers, tools)
        try:
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"kernels": [asdict(k) for k in report.kernels]}))
            tmp.replace(cache)  # atomic: readers without the lock never see half a file
        except OSError:
            pass
    return report


def _compile_report(
    nvcc: str,
    srcs: list[Path],
    arch: str,
    version: str,
    digest: str,
    extra_flags: Sequence[str],
    workers: int | None,
    tools: tuple[str, str] | None = None,
) -> ArchReport:
    with ThreadPoolExecutor(max_workers=workers or min(len(srcs), os.cpu_count() or 1)) as pool:
        results = list(pool.map(lambda s: compile_source(nvcc, s, arch, extra_flags, tools), srcs))
    return ArchReport(arch, version, digest, [k for ks in results for k in ks])


def _read_report(cache: Path, arch: str, version: str, digest: str) -> ArchReport | None:
    if not cache.is_file():
        return None
    try:
        data = json.loads(cache.read_text())
        # names are derived again: a renaming here must not meet names cached under the old rules
        kernels = [KernelReport(**{**k, "name": readable_name(k["mangled"])}) for k in data["kernels"]]
        return ArchReport(arch, version, digest, kernels, cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a corrupt or stale-format entry is simply recompiled


@contextlib.contextmanager
def _cache_lock(cache: Path) -> Iterator[None]:
    """An exclusive lock on `cache`'s entry across processes (released by the OS if one dies);
    without a writable cache folder, no lock (each process compiles, as before)."""
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        fh = open(cache.with_suffix(".lock"), "w")  # noqa: SIM115 (held across the yield)
    except OSError:
        yield
        return
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def compile_archs(
    archs: Iterable[str],
    root: Path | None = None,
    *,
    workers: int | None = None,
    sass_archs: Iterable[str] = (),
    **kwargs,
) -> dict[str, ArchReport | Exception]:
    """compile_arch for several archs in parallel; a failed arch maps to its exception. `sass_archs`:
    the archs compiled with sass=True (tests/test_local_memory.py reads sm_90's from the same cache entry)."""
    archs = list(dict.fromkeys(archs))
    nvcc = kwargs.pop("nvcc", None) or find_nvcc()
    with_sass = set(sass_archs)

    def one(arch: str) -> ArchReport | Exception:
        try:
            return compile_arch(arch, root, nvcc=nvcc, workers=1, sass=arch in with_sass, **kwargs)
        except (CompileError, OSError) as exc:
            return exc

    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        return dict(zip(archs, pool.map(one, archs), strict=True))
