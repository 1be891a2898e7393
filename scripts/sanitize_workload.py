"""A small workload for compute-sanitizer: both schedules, forward and backward, caps 1, 7 and
natural, every dtype, with and without SiLU and affine parameters. Exits non-zero on a wrong result."""

from __future__ import annotations

import contextlib

import torch

import gn_module
from gn_module import reference


def main() -> None:
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for shape, groups in (((2, 64, 24, 20), 8), ((1, 96, 9, 11), 32)):
            x = torch.randn(shape, device="cuda").to(dtype).contiguous(memory_format=torch.channels_last)
            w = torch.randn(shape[1], device="cuda")
            b = torch.randn(shape[1], device="cuda")
            dy = torch.randn_like(x)
            ref_y, ref_dx, _, _ = reference.forward_backward(x, groups, w, b, 1e-5, "silu", dy)
            for passes in (1, 2):
                for cap in (1, 7, None):
                    xr = x.detach().requires_grad_(True)
                    with gn_module.max_resident_blocks(cap) if cap else contextlib.nullcontext():
                        y = gn_module.group_norm(xr, groups, w, b, act="silu", passes=passes)
                        (dx,) = torch.autograd.grad(y, xr, dy)
                    reference.compare(y, ref_y, dtype, f"y {dtype} {passes=} {cap=}")
                    reference.compare(dx, ref_dx, dtype, f"dx {dtype} {passes=} {cap=}")
    torch.cuda.synchronize()
    print("sanitize workload: all results correct")


if __name__ == "__main__":
    main()
