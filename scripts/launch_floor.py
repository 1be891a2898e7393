"""The small shapes' floor (GPU): what one launch costs in the benchmark's timer, and what L2 flushing adds.

    python scripts/launch_floor.py [--shapes 2x1280x16x16:silu,2x640x32x32:silu,2x320x64x64:silu]

Times, with the benchmark's timer (CUDA events around one call, after an L2 flush and a GPU-side spin):
- an empty kernel (compiled here with nvcc) launched plainly and cooperatively, at 96 and 264 blocks of 256
  threads, each with and without the L2 flush: the launch floor every implementation pays;
- `gn_module.group_norm` (forward, no grad) and torch's group_norm on channels_last, both with and without
  the flush: how much of a small shape's time is the flush's cold start (code, parameters, TLB) beyond x.
Prints one line per row; `--json` writes them.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile

import torch

import gn_module
from gn_module.bench.timing import EventTimer, time_cuda

sys.path.insert(0, os.path.dirname(__file__))
from time_shapes import parse

EMPTY_CU = r"""
#include <cuda_runtime.h>
__global__ void empty_kernel(int* p) { if (p != nullptr && threadIdx.x == 0) p[blockIdx.x] = 1; }
extern "C" int launch_plain(void* stream, int blocks) {
  empty_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(nullptr);
  return static_cast<int>(cudaGetLastError());
}
extern "C" int launch_cooperative(void* stream, int blocks) {
  int* p = nullptr;
  void* args[] = {&p};
  const void* kernel = reinterpret_cast<const void*>(empty_kernel);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  return static_cast<int>(cudaLaunchCooperativeKernel(kernel, blocks, 256, args, 0, s));
}
"""


def build_empty(workdir: str) -> ctypes.CDLL:
    src, lib = os.path.join(workdir, "empty.cu"), os.path.join(workdir, "libempty.so")
    with open(src, "w") as fh:
        fh.write(EMPTY_CU)
    major, minor = torch.cuda.get_device_capability()
    nvcc = os.environ.get("NVCC", "nvcc")
    arch = f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"
    subprocess.run([nvcc, "-O3", "-shared", "-Xcompiler", "-fPIC", arch, src, "-o", lib], check=True)
    return ctypes.CDLL(lib)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="2x1280x16x16:silu,2x640x32x32:silu,2x320x64x64:silu")
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device("cuda", torch.cuda.current_device())
    timers = {"flushed": EventTimer(dev), "no flush": EventTimer(dev, flush=False)}
    rows = []

    def timed(label: str, fn) -> None:
        for name, timer in timers.items():
            t = time_cuda(fn, reps=200, warmup=10, min_reps=50, max_seconds=0.5, timer=timer)
            row = {"what": label, "l2": name, "us": round(t.median_us, 2), "iqr_us": round(t.iqr_us, 2)}
            rows.append(row)
            print(f"{label:44} {name:9} {t.median_us:7.2f} us (IQR {t.iqr_us:.2f})", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        lib = build_empty(tmp)
        for blocks in (96, 264):
            for kind in ("plain", "cooperative"):
                launch = getattr(lib, f"launch_{kind}")

                def call(launch=launch, blocks=blocks) -> None:
                    rc = launch(ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), blocks)
                    if rc:
                        raise RuntimeError(f"launch failed: {rc}")

                timed(f"empty kernel, {kind}, {blocks} blocks", call)
    for spec in args.shapes.split(","):
        shape, groups, act = parse(spec)
        x = torch.randn(shape, device=dev, dtype=torch.float16).to(memory_format=torch.channels_last)
        w = torch.randn(shape[1], device=dev, dtype=torch.float16)
        b = torch.randn(shape[1], device=dev, dtype=torch.float16)

        def ours(x=x, w=w, b=b, groups=groups, act=act):
            with torch.no_grad():
                return gn_module.group_norm(x, groups, w, b, 1e-5, act)

        def eager(x=x, w=w, b=b, groups=groups, act=act):
            with torch.no_grad():
                y = torch.nn.functional.group_norm(x, groups, w, b, 1e-5)
                return torch.nn.functional.silu(y) if act == "silu" else y

        timed(f"{spec} ours fwd", ours)
        timed(f"{spec} eager CL fwd", eager)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
