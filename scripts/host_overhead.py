"""Host time of one eager GroupNorm forward call, ours against torch's (issue 12: at most 20 us).

GPU (default): x 2x64x8x8 float16 channels_last, weight and bias float16, under torch.no_grad(), the
wall time per call of 500 back-to-back calls (GPU time per call is far below that, so the host is
the bound), for the same activation on both sides:

    ours silu    gn_module.group_norm(x, 32, w, b, act="silu")
    torch silu   F.silu(F.group_norm(x, 32, w, b))
    ours none    gn_module.group_norm(x, 32, w, b)
    torch none   F.group_norm(x, 32, w, b)
    floor        torch.empty_like(x)

Each is timed in --rounds rounds, interleaved; the median round is reported (min alongside), then
a cProfile of 500 of our silu calls (top 18 by tottime).

    python scripts/host_overhead.py [--json PATH] [--calls 500] [--rounds 7]

--cpu: no GPU needed. Runs our fast route on CPU tensors against a stub kernel library (a C stub
compiled with `cc` when there is one, else a Python one) and times each piece of the call path, so
the split of the microseconds can be seen on any machine. The CPU numbers are not the GPU ones:
CUDA allocations, the stream lookup and the kernel launches in the library cost more there.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import ctypes
import io
import json
import operator
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

import gn_module
from gn_module import _abi, functional, ops

TARGET_US = 20.0
SHAPE = (2, 64, 8, 8)
GROUPS = 32


def per_call_us(fn: Callable[[], object], calls: int, sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def time_rows(
    rows: dict[str, Callable[[], object]], calls: int, rounds: int, sync: Callable[[], None]
) -> dict[str, dict]:
    """Per-call microseconds of each row: `rounds` rounds of `calls` calls, rows interleaved."""
    for fn in rows.values():  # warm-up: builds, plan caches, allocator pools
        for _ in range(20):
            fn()
    samples: dict[str, list[float]] = {label: [] for label in rows}
    for _ in range(rounds):
        for label, fn in rows.items():
            samples[label].append(per_call_us(fn, calls, sync))
    return {
        label: {"median_us": statistics.median(s), "min_us": min(s), "rounds_us": [round(v, 3) for v in s]}
        for label, s in samples.items()
    }


def profile_top(fn: Callable[[], object], calls: int, top: int = 18) -> tuple[str, list[dict]]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).sort_stats("tottime")
    stats.print_stats(top)
    rows = []
    for (path, line, name), (_, ncalls, tottime, cumtime, _) in sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda kv: -kv[1][2],
    )[:top]:
        rows.append(
            {
                "function": f"{Path(path).name}:{line}({name})",
                "ncalls": ncalls,
                "tottime_us_per_call": tottime / calls * 1e6,
                "cumtime_us_per_call": cumtime / calls * 1e6,
            }
        )
    return out.getvalue(), rows


def print_rows(results: dict[str, dict], unit: str = "us") -> None:
    width = max(len(label) for label in results)
    for label, r in results.items():
        print(f"  {label:<{width}}  {r['median_us']:8.2f} {unit} per call (min {r['min_us']:.2f})")


# ---------------------------------------------------------------- GPU
def run_gpu(args: argparse.Namespace) -> dict:
    if not torch.cuda.is_available():
        sys.exit("host_overhead.py: no CUDA device (use --cpu for the CPU breakdown)")
    x = torch.randn(SHAPE, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    w = torch.randn(SHAPE[1], device="cuda", dtype=torch.float16)
    b = torch.randn(SHAPE[1], device="cuda", dtype=torch.float16)
    group_norm = gn_module.group_norm
    rows = {
        "ours silu": lambda: group_norm(x, GROUPS, w, b, act="silu"),
        "torch silu": lambda: F.silu(F.group_norm(x, GROUPS, w, b)),
        "ours none": lambda: group_norm(x, GROUPS, w, b),
        "torch none": lambda: F.group_norm(x, GROUPS, w, b),
        "torch.empty_like": lambda: torch.empty_like(x),
    }
    with torch.no_grad():
        ours = group_norm(x, GROUPS, w, b, act="silu")
        ref = F.silu(F.group_norm(x.float(), GROUPS, w.float(), b.float()))
        max_err = (ours.float() - ref).abs().max().item()
        results = time_rows(rows, args.calls, args.rounds, torch.cuda.synchronize)
        gpu_us = gpu_time_us(rows["ours silu"])
        text, top = profile_top(rows["ours silu"], args.calls)
    ours_us = results["ours silu"]["median_us"]
    report = {
        "mode": "gpu",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": list(SHAPE),
        "dtype": "float16",
        "groups": GROUPS,
        "calls": args.calls,
        "rounds": args.rounds,
        "results": results,
        "ours_silu_gpu_us_per_call": gpu_us,
        "max_abs_err_vs_fp32_torch": max_err,
        "target_us": TARGET_US,
        "meets_target": ours_us <= TARGET_US,
        "profile_top": top,
    }
    print(f"host time per eager forward call, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"x {'x'.join(map(str, SHAPE))} float16 channels_last, G={GROUPS}, no_grad, {args.calls} calls")
    print_rows(results)
    print(f"  GPU time of ours silu: {gpu_us:.2f} us per call (must be far below its host time)")
    print(f"  max |ours - fp32 torch| = {max_err:.3g}")
    verdict = "meets" if ours_us <= TARGET_US else "misses"
    print(f"ours silu: {ours_us:.2f} us per call {verdict} the {TARGET_US:.0f} us target")
    print(text)
    return report


def gpu_time_us(fn: Callable[[], object], calls: int = 100) -> float:
    """GPU time per call, for the condition that it be far below the host time: the calls are queued
    behind a spin longer than their host time (few enough for the launch queue), so the events time
    GPU work only."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e8))  # ~0.1 s at 2 GHz, against ~10 ms of host time for the calls
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


# ---------------------------------------------------------------- CPU (no GPU)
STUB_C = """
int gn_forward(const void* args, void* stream) { (void)args; (void)stream; return 0; }
int gn_backward(const void* args, void* stream) { (void)args; (void)stream; return 0; }
const char* gn_error_string(int code) { (void)code; return "stub"; }
"""


class PyStubLibrary:
    """The library's launch entry points in Python: records each call's GnArgs bytes and stream."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes, int]] = []

    @staticmethod
    def _bytes(args: object) -> bytes:
        if isinstance(args, bytes):
            return args[: ctypes.sizeof(_abi.GnArgs)]
        obj = args._obj if hasattr(args, "_obj") else args  # ctypes.byref(GnArgs) -> the GnArgs
        return bytes(obj)  # type: ignore[call-overload]

    def gn_forward(self, args: object, stream: int | None) -> int:
        self.calls.append(("fwd", self._bytes(args), stream or 0))
        return 0

    def gn_backward(self, args: object, stream: int | None) -> int:
        self.calls.append(("bwd", self._bytes(args), stream or 0))
        return 0

    @staticmethod
    def gn_error_string(code: int) -> bytes:
        return b"stub"


def c_stub_library(directory: Path) -> ctypes.CDLL | None:
    """The stub entry points compiled with the system C compiler (None without one)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    src, lib = directory / "stub.c", directory / "libgnstub.so"
    src.write_text(STUB_C)
    done = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], capture_output=True)
    if done.returncode != 0:
        return None
    dll = ctypes.CDLL(str(lib))
    for name in ("gn_forward", "gn_backward"):
        fn = getattr(dll, name)
        fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int
    dll.gn_error_string.argtypes, dll.gn_error_string.restype = [ctypes.c_int], ctypes.c_char_p
    return dll


@contextlib.contextmanager
def cpu_device(lib: object, blocks_per_sm: int = 2, sm_count: int = 132) -> Iterator[object]:
    """Run gn_module's fast route on CPU tensors: CPU counts as the kernels' device, the device facts
    are those given (an H200-like 132 SMs), the stream is 0 and the launches go to `lib`. The
    launch caches are emptied on entry and exit."""
    saved = [
        (functional, "_on_device", operator.attrgetter("is_cpu")),
        (torch.cuda, "is_available", lambda: True),
        (ops, "_sm_count", lambda index: sm_count),
        (ops, "_occupancy", lambda *key: blocks_per_sm),
        (ops, "_task_occupancy", lambda *key: blocks_per_sm),
        (ops, "_task_smem_budget", lambda index: 227 * 1024),
        (ops, "library", lambda index, variant=None: lib),
        (ops, "_raw_stream", lambda index: 0),
    ]
    originals = [(module, name, getattr(module, name)) for module, name, _ in saved]
    ops._launches.clear()
    try:
        for module, name, value in saved:
            setattr(module, name, value)
        yield lib
    finally:
        for module, name, value in originals:
            setattr(module, name, value)
        ops._launches.clear()


def run_cpu(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        lib = c_stub_library(Path(tmp))
        stub = "C stub (cc)" if lib is not None else "Python stub (no C compiler)"
        with cpu_device(lib if lib is not None else PyStubLibrary()), torch.no_grad():
            return cpu_pieces(args, stub)


def cpu_pieces(args: argparse.Namespace, stub: str) -> dict:
    x = torch.randn(SHAPE, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(SHAPE[1], dtype=torch.float16), torch.randn(SHAPE[1], dtype=torch.float16)
    eps, act, passes = 1e-5, 1, 0
    launch = ops._launch("fwd", x, x.get_device(), True, GROUPS, eps, act, passes, w)
    y = torch.empty_like(x)
    scratch = torch.empty(launch.scratch_floats, dtype=torch.float32)
    packed = _abi.POINTERS.pack(1, 0, 2, 3, 4, 5, 6, 7, 0, 0, 0) + launch.tail
    p, a = ops._prepare("fwd", x, GROUPS, eps, act, passes, w)
    rows: dict[str, Callable[[], object]] = {
        "group_norm (ours, whole call)": lambda: gn_module.group_norm(x, GROUPS, w, b, act="silu"),
        "  functional._fast_route": lambda: functional._fast_route(x, GROUPS, w, b, eps, "silu", "auto"),
        "  ops._needs_autograd": lambda: ops._needs_autograd(x, w, b),
        "  ops.forward_nograd": lambda: ops.forward_nograd(x, w, b, GROUPS, eps, act, passes),
        "    ops._launch (cache hit)": lambda: ops._launch(
            "fwd", x, x.get_device(), True, GROUPS, eps, act, passes, w
        ),
        "      ops.current_cap": ops.current_cap,
        "      ops.current_arch": ops.current_arch,
        "    2 allocations (y, scratch)": lambda: (
            torch.empty_like(x),
            torch.empty(launch.scratch_floats, dtype=torch.float32, device=x.device),
        ),
        "    data_ptr x4": lambda: (x.data_ptr(), y.data_ptr(), w.data_ptr(), scratch.data_ptr()),
        "    GnArgs: pack pointers + tail": lambda: (
            _abi.POINTERS.pack(1, 0, 2, 3, 4, 5, 6, 7, 0, 0, 0) + launch.tail
        ),
        "    library call (ctypes)": lambda: launch.entry(packed, 0),
        "full checks (check_args + fast_path_reason)": lambda: (
            functional.check_args(x, GROUPS, w, b, eps, "silu", "auto"),
            functional.fast_path_reason(x, w),
        ),
        "autograd.Function route (_EagerGroupNorm.apply)": lambda: ops._EagerGroupNorm.apply(
            x, w, b, GROUPS, eps, act, passes
        ),
        "ops.forward (4 allocations, GnArgs fields)": lambda: ops.forward(x, w, b, GROUPS, eps, act, passes),
        "  ops._prepare (cache hit + GnArgs copy)": lambda: ops._prepare(
            "fwd", x, GROUPS, eps, act, passes, w
        ),
        "  ops._run (GnArgs byref)": lambda: ops._run("fwd", p, a, x),
        "torch.empty_like (floor)": lambda: torch.empty_like(x),
    }
    calls = args.calls
    results = time_rows(rows, calls, args.rounds, lambda: None)
    text, top = profile_top(rows["group_norm (ours, whole call)"], calls)
    print(f"CPU breakdown of one eager forward call (no GPU: {stub}, torch {torch.__version__})")
    print(f"x {'x'.join(map(str, SHAPE))} float16 channels_last on CPU, G={GROUPS}, no_grad, {calls} calls")
    print_rows(results)
    print(text)
    return {
        "mode": "cpu",
        "stub": stub,
        "torch": torch.__version__,
        "shape": list(SHAPE),
        "calls": calls,
        "rounds": args.rounds,
        "results": results,
        "profile_top": top,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=500, help="back-to-back calls per round (default 500)")
    ap.add_argument("--rounds", type=int, default=7, help="rounds per row (default 7; median reported)")
    ap.add_argument("--json", type=Path, help="also write the results to this JSON file")
    ap.add_argument("--cpu", action="store_true", help="CPU breakdown against a stub library (no GPU)")
    args = ap.parse_args(argv)
    report = run_cpu(args) if args.cpu else run_gpu(args)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
