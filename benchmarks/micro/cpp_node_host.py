"""Host time of one eager training step of one GroupNorm layer: the Python autograd.Function route
(`gn_module.group_norm`, what ships) against a C++ autograd node around the same launches
(`cpp_node.cpp`, a prototype), and torch's own GroupNorm.

    python benchmarks/micro/cpp_node_host.py            # on a GPU: the real kernels, bits checked
    python benchmarks/micro/cpp_node_host.py --cpu      # no GPU: CPU tensors, stub entry points

The step is issue 13's host-bound case: x 2x64x8x8 channels_last (GPU time far below host time), G=32,
SiLU fused (ours) or F.silu after F.group_norm (torch), x, weight and bias requiring grad, then
`torch.autograd.grad(y, (x, w, b), dy)`. Rows, microseconds per step of back-to-back steps, median over
rounds with the rows interleaved (scripts/host_overhead.py's timer):

- `python route`: gn_module.group_norm, what a swapped model runs;
- `GN_CPP_NODE=1`: gn_module.group_norm through the product node (gn_module/autograd_node.cpp), built
  on first use like the prototype;
- `C++ node + Python lookups`: the checks and plan lookups the Python front would still make per call
  (functional._fast_route, ops._launch of both directions), then the C++ node;
- `C++ node alone`: the node with its launches handed over once (its floor);
- `torch`: F.silu(F.group_norm(...)) (on CPU it runs torch's CPU kernels, so it is no floor there);
- `engine floor`: autograd.grad through one of torch's own C++ nodes (x * 1.5).

The node covers one call signature: a float32 or bfloat16 x with parameters of its dtype (the task
backward stores dweight/dbias in that dtype) and the default kernels (a task plan). On a GPU its y, dx,
dweight and dbias must equal the Python route's bitwise before anything is timed. The extension builds
with torch.utils.cpp_extension (ninja; `--build-dir`, default a cache under ~/.cache/pytest-gn).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

import gn_module
from gn_module import _abi, autograd_node, functional, ops, schedule

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "scripts"))
import host_overhead  # noqa: E402  (its timer, stub library and CPU device)

GROUPS, EPS, ACT, PASSES = 32, 1e-5, "silu", "auto"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build(build_dir: Path) -> tuple[object, float]:
    """The extension, and the seconds its build took (about 0 when ninja finds it up to date)."""
    from torch.utils.cpp_extension import load

    build_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    module = load(
        "gn_cpp_node", [str(HERE / "cpp_node.cpp")], extra_cflags=["-O2"], build_directory=str(build_dir)
    )
    return module, time.perf_counter() - start


def address(fn: object) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


def hand_over(node: object, x: torch.Tensor, w: torch.Tensor) -> None:
    """Give the node this call signature's launches, computed as the Python route computes them (one
    stream: a task plan's sync pointer is packed for the current one)."""
    index, aligned, act = x.get_device(), x.data_ptr() % schedule.VEC_BYTES == 0, ops._ACT_IDS[ACT]
    launches = [ops._launch(d, x, index, aligned, GROUPS, EPS, act, 0, w, None) for d in ("fwd", "bwd")]
    if not isinstance(launches[1].plan, schedule.TaskPlan):
        raise SystemExit("cpp_node_host.py: the node covers the task backward only (GN_ARCH=tiles is not it)")
    tails = []
    for launch in launches:
        tail = launch.tail
        if launch.sync_words:
            buf = ops._sync_buffer(x.device, ops._raw_stream(index), launch.sync_words)
            tail = launch.tail_before_sync + ops._SYNC.pack(buf.data_ptr()) + launch.tail_after_sync
        tails.append(tail)
    fwd, bwd = launches
    node.set_launch(  # type: ignore[attr-defined]
        address(fwd.entry),
        address(bwd.entry),
        address(fwd.lib.gn_error_string),
        tails[0],
        tails[1],
        fwd.stats_floats,
        fwd.workspace_floats,
        fwd.rstd_offset,
        bwd.scratch_floats,
        str(w.dtype).removeprefix("torch."),
    )


def check_bits(node: object, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> None:
    """y, dx, dweight and dbias of the prototype and of gn_module's node (GN_CPP_NODE=1) against the Python
    route's: bitwise."""
    dy = torch.randn_like(x)
    autograd_node.requested = _no
    ours = gn_module.group_norm(x, GROUPS, w, b, act=ACT)
    autograd_node.requested = _yes
    product = gn_module.group_norm(x, GROUPS, w, b, act=ACT)
    if "GroupNormNode" not in product.grad_fn.name():
        raise SystemExit(f"cpp_node_host.py: GN_CPP_NODE=1 did not take the node ({product.grad_fn.name()})")
    for which, theirs in (("prototype", node.group_norm(x, w, b)), ("GN_CPP_NODE=1 node", product)):  # type: ignore[attr-defined]
        pairs = [(ours, theirs)]
        pairs += zip(
            torch.autograd.grad(ours, (x, w, b), dy, retain_graph=True),
            torch.autograd.grad(theirs, (x, w, b), dy),
            strict=True,
        )
        for name, (a, c) in zip(("y", "dx", "dweight", "dbias"), pairs, strict=True):
            if a.dtype != c.dtype or a.stride() != c.stride() or not torch.equal(a, c):
                raise SystemExit(f"cpp_node_host.py: the {which}'s {name} differs from the Python route's")
    print(
        "bits: y, dx, dweight and dbias of the prototype and the GN_CPP_NODE=1 node equal the Python route's"
    )


ENTRY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
ERROR_STRING = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_int)


class RecordingLibrary(host_overhead.PyStubLibrary):
    """The stub library with C-callable entry points that record each launch's GnArgs bytes, for the
    Python route and the node alike (on CPU, where no kernel writes anything to compare)."""

    def __init__(self) -> None:
        super().__init__()
        size = ctypes.sizeof(_abi.GnArgs)
        for direction in ("fwd", "bwd"):
            record = self._recorder(direction, size)
            setattr(self, f"gn_{'forward' if direction == 'fwd' else 'backward'}", ENTRY(record))
        self.gn_error_string = ERROR_STRING(lambda code: b"stub")

    def _recorder(self, direction: str, size: int) -> Callable[[int, int | None], int]:
        def record(args: int, stream: int | None) -> int:
            self.calls.append((direction, ctypes.string_at(args, size), stream or 0))
            return 0

        return record


def check_packing(node: object, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> None:
    """On CPU: the GnArgs bytes the node launches with against the Python route's, a step of each. The
    tails (everything but the data pointers) must be equal, and so must the pointers both routes take
    from the caller (x, dy, weight, bias); the ones each allocates must be set, rstd at its offset."""
    lib = RecordingLibrary()
    with host_overhead.cpu_device(lib):
        hand_over(node, x, w)
        dy = torch.randn_like(x)
        torch.autograd.grad(gn_module.group_norm(x, GROUPS, w, b, act=ACT), (x, w, b), dy)
        torch.autograd.grad(node.group_norm(x, w, b), (x, w, b), dy)  # type: ignore[attr-defined]
    (pf, py_fwd, _), (pb, py_bwd, _), (nf, node_fwd, _), (nb, node_bwd, _) = lib.calls
    assert (pf, pb, nf, nb) == ("fwd", "bwd", "fwd", "bwd"), [c[0] for c in lib.calls]
    size = _abi.POINTERS_SIZE
    for name, ours, theirs in (("fwd", py_fwd, node_fwd), ("bwd", py_bwd, node_bwd)):
        if ours[size:] != theirs[size:]:
            raise SystemExit(f"cpp_node_host.py: the node's {name} GnArgs differ from the Python route's")
        p, q = _abi.POINTERS.unpack(ours[:size]), _abi.POINTERS.unpack(theirs[:size])
        given = (0, 3, 4) if name == "fwd" else (0, 1, 3, 4)
        if any(p[i] != q[i] for i in given) or not all(q[i] for i in (2, 5, 6, 7)):
            raise SystemExit(f"cpp_node_host.py: the node's {name} data pointers {q} (Python route: {p})")
        if q[6] - q[5] != p[6] - p[5]:
            raise SystemExit(f"cpp_node_host.py: the node's {name} rstd offset differs")
    print("packing: the node's GnArgs equal the Python route's (tails, the caller's pointers, rstd offset)")


def _yes() -> bool:
    return True


def _no() -> bool:
    return False


def rows_for(
    node: object, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor
) -> dict[str, Callable[[], object]]:
    dy, inputs, index = torch.randn_like(x), (x, w, b), x.get_device()
    aligned, act = x.data_ptr() % schedule.VEC_BYTES == 0, ops._ACT_IDS[ACT]

    def python_route() -> object:
        autograd_node.requested = _no  # (an attribute store: the rows below switch it per call)
        return torch.autograd.grad(gn_module.group_norm(x, GROUPS, w, b, act=ACT), inputs, dy)

    def product_node() -> object:
        autograd_node.requested = _yes
        return torch.autograd.grad(gn_module.group_norm(x, GROUPS, w, b, act=ACT), inputs, dy)

    def node_with_lookups() -> object:
        functional._fast_route(x, GROUPS, w, b, EPS, ACT, PASSES)
        ops._launch("fwd", x, index, aligned, GROUPS, EPS, act, 0, w, None)
        ops._launch("bwd", x, index, aligned, GROUPS, EPS, act, 0, w, None)
        return torch.autograd.grad(node.group_norm(x, w, b), inputs, dy)  # type: ignore[attr-defined]

    def node_alone() -> object:
        return torch.autograd.grad(node.group_norm(x, w, b), inputs, dy)  # type: ignore[attr-defined]

    def torch_step() -> object:
        return torch.autograd.grad(F.silu(F.group_norm(x, GROUPS, w, b, EPS)), inputs, dy)

    def engine_floor() -> object:
        return torch.autograd.grad(x * 1.5, (x,), dy)

    y_py = gn_module.group_norm(x, GROUPS, w, b, act=ACT)
    y_node = node.group_norm(x, w, b)  # type: ignore[attr-defined]
    return {
        "train step: python route": python_route,
        "train step: GN_CPP_NODE=1 (gn_module's node)": product_node,
        "train step: C++ node + Python lookups": node_with_lookups,
        "train step: C++ node alone": node_alone,
        "train step: torch F.silu(F.group_norm)": torch_step,
        "train step: engine floor (x * 1.5)": engine_floor,
        "forward: python route": lambda: gn_module.group_norm(x, GROUPS, w, b, act=ACT),
        "forward: C++ node alone": lambda: node.group_norm(x, w, b),  # type: ignore[attr-defined]
        "backward: python route (autograd.grad)": lambda: torch.autograd.grad(
            y_py, inputs, dy, retain_graph=True
        ),
        "backward: C++ node (autograd.grad)": lambda: torch.autograd.grad(
            y_node, inputs, dy, retain_graph=True
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="CPU tensors and stub entry points (no GPU)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="x, weight and bias dtype")
    ap.add_argument("--calls", type=int, default=1000, help="steps per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--build-dir", type=Path, default=Path.home() / ".cache/pytest-gn/cpp_node")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        sys.exit("cpp_node_host.py: no CUDA device (use --cpu)")
    node, seconds = build(args.build_dir)
    print(f"extension built in {seconds:.1f} s ({args.build_dir})")
    device = "cpu" if args.cpu else "cuda"
    with contextlib.ExitStack() as stack:
        sync: Callable[[], None] = torch.cuda.synchronize if device == "cuda" else lambda: None
        dtype = DTYPES[args.dtype]
        if args.cpu:
            x, w, b = host_overhead.training_inputs(host_overhead.SHAPE, dtype, dtype, device)
            check_packing(node, x, w, b)
            lib = host_overhead.c_stub_library(Path(stack.enter_context(tempfile.TemporaryDirectory())))
            stack.enter_context(host_overhead.cpu_device(lib or host_overhead.PyStubLibrary()))
        x, w, b = host_overhead.training_inputs(host_overhead.SHAPE, dtype, dtype, device)
        hand_over(node, x, w)
        if not args.cpu:
            check_bits(node, x, w, b)
        results = host_overhead.time_rows(rows_for(node, x, w, b), args.calls, args.rounds, sync)
    where = "CPU, stub entry points" if args.cpu else torch.cuda.get_device_name()
    print(
        f"x {'x'.join(map(str, host_overhead.SHAPE))} {args.dtype} channels_last, G={GROUPS}, {ACT}; {where}"
    )
    print(f"us per call, median of {args.rounds} rounds of {args.calls} (min)")
    for label, r in results.items():
        print(f"  {label:42s} {r['median_us']:8.2f}  ({r['min_us']:.2f})")
    if args.json:
        args.json.write_text(json.dumps({"device": where, "dtype": args.dtype, "rows": results}, indent=1))


if __name__ == "__main__":
    main()
