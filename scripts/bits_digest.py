"""A digest of `gn_module`'s outputs and gradients (GPU), to show that two kernel trees give the same bits.

    PYTHONPATH=TREE/src python scripts/bits_digest.py [--acts silu,none] [--shapes 2x320x64x64,...]

Runs forward and backward of each shape, dtype (fp16, bf16, fp32) and activation on fixed seeded inputs
(channels_last), and prints one SHA-256 line per case over y, dx, dweight and dbias, then one over all.
Run it once per tree (PYTHONPATH picks the tree) and compare the lines: any differing bit changes them.
`--passes 2` forces the two-launch schedules (default: `auto`'s pick), for experiments that change only those.
"""

from __future__ import annotations

import argparse
import hashlib

import torch

import gn_module

SHAPES = "2x320x64x64,2x1280x16x16,1x512x128x128,1x512x256x256,3x96x17x19"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def case_digest(
    shape: tuple[int, ...], dtype: torch.dtype, act: str | None, seed: int, passes: int | str = "auto"
) -> str:
    g = torch.Generator(device="cuda").manual_seed(seed)
    c = shape[1]
    x = (3 * torch.randn(shape, generator=g, device="cuda")).to(dtype).to(memory_format=torch.channels_last)
    w = (1 + 0.5 * torch.randn(c, generator=g, device="cuda")).to(dtype).requires_grad_()
    b = (0.5 * torch.randn(c, generator=g, device="cuda")).to(dtype).requires_grad_()
    dy = torch.randn(shape, generator=g, device="cuda").to(dtype).to(memory_format=torch.channels_last)
    x.requires_grad_()
    y = gn_module.group_norm(x, 32, w, b, 1e-5, act, passes=passes)
    y.backward(dy)
    h = hashlib.sha256()
    for t in (y, x.grad, w.grad, b.grad):
        h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--acts", default="silu,none")
    ap.add_argument("--passes", default="auto", choices=("auto", "1", "2"))
    args = ap.parse_args()
    passes = args.passes if args.passes == "auto" else int(args.passes)
    total = hashlib.sha256()
    for i, spec in enumerate(args.shapes.split(",")):
        shape = tuple(int(v) for v in spec.split("x"))
        for dname, dtype in DTYPES.items():
            for act in args.acts.split(","):
                d = case_digest(shape, dtype, None if act == "none" else act, seed=i, passes=passes)
                total.update(d.encode())
                print(f"{spec:>16} {dname} {act:<5} {d[:16]}")
    print(f"all {total.hexdigest()}")


if __name__ == "__main__":
    main()
