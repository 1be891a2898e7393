"""Host time of one eager GroupNorm call, ours against torch's: the no-grad forward (issue 12: at most
20 us) and the training step, forward with gradients plus backward (issue 13).

GPU (default), x 2x64x8x8 channels_last (--shape N,C,H,W for another), G=32, the wall time per call of
--calls back-to-back calls (GPU time per call is far below that at this size, so the host is the
bound), for the same activation on both sides. The no-grad forward, float16 x, weight and bias:

    ours silu    gn_module.group_norm(x, 32, w, b, act="silu")
    torch silu   F.silu(F.group_norm(x, 32, w, b))
    ours none    gn_module.group_norm(x, 32, w, b)
    torch none   F.group_norm(x, 32, w, b)
    floor        torch.empty_like(x)

The training step, x, weight and bias requiring grad, `torch.autograd.grad(y, (x, w, b), dy)` after
the forward, in three precisions: fp32 (everything float32), bf16 autocast (bfloat16 x, float32
parameters, under torch.autocast: what a bf16-mixed model's layers see) and bf16 params (everything
bfloat16). Rows "ours|torch <precision> silu|none" (ours through the C++ autograd node, the default),
"ours-function <precision> silu" (the Python autograd.Function that GN_CPP_NODE=0 keeps), and a floor:
an autograd.Function that only allocates and saves (fp32).

Each is timed in --rounds rounds, interleaved; the median round is reported (min alongside), then a
cProfile of our silu calls (top 18 by tottime) for each table.

    python scripts/host_overhead.py [--json PATH] [--calls 500] [--rounds 7] [--shape 2,64,8,8]

--cpu: no GPU needed. Runs our fast route on CPU tensors against a stub kernel library (a C stub
compiled with `cc` when there is one, else a Python one) and times each piece of the call path, so
the split of the microseconds can be seen on any machine: the no-grad forward (float16) and the
training step (float32, plus whole steps in the two bf16 precisions). The CPU numbers are not the GPU
ones: CUDA allocations, the stream lookup and the kernel launches in the library cost more there.
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
from gn_module import _abi, autograd_node, functional, ops, schedule

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
    shape = args.shape
    x = torch.randn(shape, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    w = torch.randn(shape[1], device="cuda", dtype=torch.float16)
    b = torch.randn(shape[1], device="cuda", dtype=torch.float16)
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
    train, train_text = gpu_training(args)
    report = {
        "mode": "gpu",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": list(shape),
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
        "training": train,
    }
    print(f"host time per eager forward call, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"x {'x'.join(map(str, shape))} float16 channels_last, G={GROUPS}, no_grad, {args.calls} calls")
    print_rows(results)
    print(f"  GPU time of ours silu: {gpu_us:.2f} us per call (must be far below its host time)")
    print(f"  max |ours - fp32 torch| = {max_err:.3g}")
    verdict = "meets" if ours_us <= TARGET_US else "misses"
    print(f"ours silu: {ours_us:.2f} us per call {verdict} the {TARGET_US:.0f} us target")
    print(text)
    print_training(train, args)
    print(train_text)
    return report


# The training step's precisions: (x dtype, parameter dtype, autocast dtype or None).
PRECISIONS = {
    "fp32": (torch.float32, torch.float32, None),
    "bf16 autocast": (torch.bfloat16, torch.float32, torch.bfloat16),
    "bf16 params": (torch.bfloat16, torch.bfloat16, None),
}


def training_step(
    impl: str,
    act: str | None,
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor,
    autocast: torch.dtype | None,
) -> Callable[[], object]:
    """One eager training step of one layer: the forward with gradients, then autograd.grad of x, w, b."""

    def forward() -> torch.Tensor:
        return layer_forward(impl, act, x, w, b)

    device = x.device.type

    def region() -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if autocast is None else torch.autocast(device, dtype=autocast)

    with region():
        y = forward()
    dy = torch.randn_like(y)  # y's dtype (float32 for torch's under autocast) and layout
    inputs = (x, w, b)

    def step() -> object:
        with region():
            out = forward()
        return torch.autograd.grad(out, inputs, dy)

    return step


def training_inputs(
    shape: tuple[int, ...], x_dtype: torch.dtype, p_dtype: torch.dtype, device: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(shape, device=device).to(x_dtype).contiguous(memory_format=torch.channels_last)
    w = (1 + 0.5 * torch.randn(shape[1], device=device)).to(p_dtype)
    b = (0.5 * torch.randn(shape[1], device=device)).to(p_dtype)
    return x.requires_grad_(), w.requires_grad_(), b.requires_grad_()


def gpu_training(args: argparse.Namespace) -> tuple[dict, str]:
    rows: dict[str, Callable[[], object]] = {}
    for name, (x_dtype, p_dtype, autocast) in PRECISIONS.items():
        x, w, b = training_inputs(args.shape, x_dtype, p_dtype, "cuda")
        for act in ("silu", None):
            for impl in ("ours", "ours-function", "torch") if act else ("ours", "torch"):
                rows[f"{impl} {name} {act or 'none'}"] = training_step(impl, act, x, w, b, autocast)
        if name == "fp32":
            dy = torch.randn_like(x)
            grads = [
                torch.autograd.grad(layer_forward(impl, "silu", x, w, b), (x, w, b), dy)
                for impl in ("ours", "torch")
            ]
            max_err = max((g - r).abs().max().item() for g, r in zip(*grads, strict=True))
            rows["floor fp32 (empty autograd.Function)"] = lambda x=x, w=w, b=b, dy=dy: torch.autograd.grad(
                _FloorFunction.apply(x, w, b, GROUPS, 1e-5, 1, 0), (x, w, b), dy
            )
    results = time_rows(rows, args.calls, args.rounds, torch.cuda.synchronize)
    gpu = {label: gpu_time_us(rows[label]) for label in rows if label.endswith("silu")}
    text, top = profile_top(rows["ours fp32 silu"], args.calls)
    return {
        "results": results,
        "gpu_us_per_step": gpu,
        "max_abs_grad_err_fp32": max_err,
        "profile_top": top,
    }, text


_requested = autograd_node.requested


def _never() -> bool:
    return False


def layer_forward(
    impl: str, act: str | None, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor
) -> torch.Tensor:
    """The layer: ours (`gn_module.group_norm`, SiLU fused), ours with the C++ node off ("ours-function",
    what GN_CPP_NODE=0 runs: the switch costs two attribute writes) or torch's (F.group_norm, then F.silu)."""
    if impl == "ours":
        return gn_module.group_norm(x, GROUPS, w, b, act=act)
    if impl == "ours-function":
        autograd_node.requested = _never
        try:
            return gn_module.group_norm(x, GROUPS, w, b, act=act)
        finally:
            autograd_node.requested = _requested
    y = F.group_norm(x, GROUPS, w, b)
    return F.silu(y) if act == "silu" else y


def print_training(train: dict, args: argparse.Namespace) -> None:
    print(
        f"host time per eager training step (forward with grad, autograd.grad of x, w, b), {args.calls} calls"
    )
    print(f"x {'x'.join(map(str, args.shape))} channels_last, G={GROUPS}")
    print_rows(train["results"])
    for label, us in train["gpu_us_per_step"].items():
        print(f"  GPU time of {label}: {us:.2f} us per step")
    print(f"  max |ours - torch| over dx, dweight, dbias (fp32 silu): {train['max_abs_grad_err_fp32']:.3g}")


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
int gn_runtime_arch(int index, int* arch) { (void)index; *arch = 900; return 0; }
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

    @staticmethod
    def gn_runtime_arch(index: int, out: object) -> int:
        """The build's __CUDA_ARCH__ (an H200's sm_90 code): asked once per new launch."""
        out._obj.value = 900  # type: ignore[attr-defined]
        return 0


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


#: The L2 cpu_device reports (an H200's 60 MB: ops._l2_keep_bytes).
H200_L2_BYTES = 60 * 10**6


@contextlib.contextmanager
def cpu_device(lib: object, blocks_per_sm: int = 2, sm_count: int = 132) -> Iterator[object]:
    """Run gn_module's fast route on CPU tensors: CPU counts as the kernels' device, the device facts
    are those given (an H200-like 132 SMs), the stream is 0 and the launches go to `lib`. The
    launch caches are emptied on entry and exit."""
    saved = [
        (functional, "_on_device", operator.attrgetter("is_cpu")),
        (torch.cuda, "is_available", lambda: True),
        (ops, "_sm_count", lambda index: sm_count),
        (ops, "_l2_keep_bytes", lambda index: schedule.l2_keep_bytes(H200_L2_BYTES)),
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
        with cpu_device(lib if lib is not None else PyStubLibrary()):
            with torch.no_grad():
                report = cpu_pieces(args, stub)
            report["training"] = cpu_training(args)
            return report


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


class _FloorFunction(torch.autograd.Function):
    """The autograd machinery alone, with our Function's signature: forward allocates y, saves the
    tensors, backward allocates dx, dweight and dbias."""

    @staticmethod
    def forward(ctx, x, weight, bias, num_groups, eps, act, passes):  # type: ignore[override]
        ctx.save_for_backward(x, weight, bias)
        ctx.config = (num_groups, eps, act, passes)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight, bias = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias), None, None, None, None


def cpu_training(args: argparse.Namespace) -> dict:
    """The training step's pieces on CPU (the fast route against the stub): float32 x, weight and
    bias requiring grad, act="silu"; whole steps in the bf16 precisions too. The floor is an
    autograd.Function that only allocates and saves what ours does (`_FloorFunction`)."""
    calls = args.calls
    x, w, b = training_inputs(SHAPE, torch.float32, torch.float32, "cpu")
    eps, act, passes = 1e-5, 1, 0
    inputs = (x, w, b)
    y = layer_forward("ours-function", "silu", x, w, b)
    ctx = y.grad_fn  # the Function's ctx: its saved tensors stay while the rows below retain the graph
    dy = torch.randn_like(y)
    stats, rstd_at = ctx.saved_tensors[3], ctx.gn[4]
    mean = stats.data_ptr()
    index = x.get_device()
    launch = ops._launch("fwd", x, index, True, GROUPS, eps, act, passes, w)
    pointers = _abi.POINTERS.pack(1, 0, 2, 3, 4, 5, 6, 7, 0, 0, 0)
    floor_y = _FloorFunction.apply(x, w, b, GROUPS, eps, act, passes)
    rows: dict[str, Callable[[], object]] = {
        "train step fp32 (group_norm + autograd.grad)": training_step("ours", "silu", x, w, b, None),
        "train step fp32, the Python Function (GN_CPP_NODE=0)": training_step(
            "ours-function", "silu", x, w, b, None
        ),
        "  forward: group_norm with grad (the Function)": lambda: layer_forward(
            "ours-function", "silu", x, w, b
        ),
        "    functional._fast_route": lambda: functional._fast_route(x, GROUPS, w, b, eps, "silu", "auto"),
        "    ops._needs_autograd": lambda: ops._needs_autograd(x, w, b),
        "    ops._function_apply (Function.apply's C part)": lambda: ops._function_apply(
            x, w, b, GROUPS, eps, act, passes
        ),
        "    _EagerGroupNorm.apply (with its Python wrapper)": lambda: ops._EagerGroupNorm.apply(
            x, w, b, GROUPS, eps, act, passes
        ),
        "      ops._forward_lean": lambda: ops._forward_lean(x, w, b, GROUPS, eps, act, passes),
        "        ops._launch fwd (cache hit)": lambda: ops._launch(
            "fwd", x, index, True, GROUPS, eps, act, passes, w
        ),
        "        3 allocations (y, stats, workspace)": lambda: (
            torch.empty_like(x),
            torch.empty(launch.stats_floats, dtype=torch.float32, device=x.device),
            torch.empty(launch.workspace_floats, dtype=torch.float32, device=x.device),
        ),
        "        ops._send (GnArgs bytes, library call)": lambda: ops._send(
            launch, pointers, x.device, index, "GroupNorm fwd launch"
        ),
        "  backward: torch.autograd.grad (retain_graph)": lambda: torch.autograd.grad(
            y, inputs, dy, retain_graph=True
        ),
        "    _EagerGroupNorm.backward(ctx, dy) alone": lambda: ops._EagerGroupNorm.backward(ctx, dy),
        "      ctx.saved_tensors, ctx.gn, needs_input_grad": lambda: (
            ctx.saved_tensors,
            ctx.gn,
            ctx.needs_input_grad,
        ),
        "      ops._backward_lean": lambda: ops._backward_lean(
            dy, x, w, b, mean, mean + rstd_at, GROUPS, eps, act, passes, True, True
        ),
        "        ops._launch bwd (cache hit)": lambda: ops._launch(
            "bwd", x, index, True, GROUPS, eps, act, passes, w
        ),
        "        4 allocations (dx, scratch, dweight, dbias)": lambda: (
            torch.empty_like(x),
            torch.empty(launch.scratch_floats, dtype=torch.float32, device=x.device),
            torch.empty(SHAPE[1], dtype=torch.float32, device=x.device),
            torch.empty(SHAPE[1], dtype=torch.float32, device=x.device),
        ),
    }
    for name in ("bf16 autocast", "bf16 params"):
        x_dtype, p_dtype, autocast = PRECISIONS[name]
        xb, wb, bb = training_inputs(SHAPE, x_dtype, p_dtype, "cpu")
        rows[f"train step {name}"] = training_step("ours", "silu", xb, wb, bb, autocast)
    rows |= {
        "floor: empty autograd.Function step": lambda: torch.autograd.grad(
            _FloorFunction.apply(x, w, b, GROUPS, eps, act, passes), inputs, dy
        ),
        "  floor forward: _FloorFunction.apply": lambda: _FloorFunction.apply(
            x, w, b, GROUPS, eps, act, passes
        ),
        "  floor backward: torch.autograd.grad (retain_graph)": lambda: torch.autograd.grad(
            floor_y, inputs, dy, retain_graph=True
        ),
        "torch F.silu(F.group_norm) step (CPU kernels)": training_step("torch", "silu", x, w, b, None),
    }
    results = time_rows(rows, calls, args.rounds, lambda: None)
    text, top = profile_top(rows["train step fp32 (group_norm + autograd.grad)"], calls)
    print("CPU breakdown of one eager training step (forward with grad + autograd.grad of x, w, b)")
    print(f"x {'x'.join(map(str, SHAPE))} float32 channels_last on CPU, G={GROUPS}, silu, {calls} calls")
    print_rows(results)
    print(text)
    return {"dtype": "float32", "results": results, "profile_top": top}


def parse_shape(text: str) -> tuple[int, ...]:
    shape = tuple(int(v) for v in text.split(","))
    if len(shape) != 4 or min(shape) < 1 or shape[1] % GROUPS:
        raise argparse.ArgumentTypeError(f"expected N,C,H,W with C a multiple of {GROUPS}, got {text!r}")
    return shape


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=500, help="back-to-back calls per round (default 500)")
    ap.add_argument("--rounds", type=int, default=7, help="rounds per row (default 7; median reported)")
    ap.add_argument("--json", type=Path, help="also write the results to this JSON file")
    ap.add_argument("--cpu", action="store_true", help="CPU breakdown against a stub library (no GPU)")
    ap.add_argument(
        "--shape",
        type=parse_shape,
        default=SHAPE,
        help="GPU mode: x's shape N,C,H,W (default 2,64,8,8; C a multiple of 32); --cpu keeps the default",
    )
    args = ap.parse_args(argv)
    report = run_cpu(args) if args.cpu else run_gpu(args)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
