"""A small workload for compute-sanitizer: both schedules, forward and backward, caps 1, 7 and
natural, every dtype, with and without SiLU and affine parameters, a one launch of several rounds whose
members keep their chunks, the one launch whose teams are thread-block clusters (sm_90 builds: its cluster
barrier), and the wide launches under CUDA autocast (float16/bfloat16 x, float32 y and dy). Exits non-zero
on a wrong result."""

from __future__ import annotations

import contextlib

import torch

import gn_module
from gn_module import ops, reference, schedule


def channels_last(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


def check(x: torch.Tensor, groups: int, dy: torch.Tensor, autocast: torch.dtype | None) -> None:
    """Our y and dx (SiLU, float32 weight and bias) against fp64, at both schedules and three caps;
    under `autocast` (the wide launches: y float32) when given."""
    w = torch.randn(x.shape[1], device="cuda")
    b = torch.randn(x.shape[1], device="cuda")
    ref_y, ref_dx, ref_dw, ref_db = reference.forward_backward(x, groups, w, b, 1e-5, "silu", dy)
    y_dtype = x.dtype if autocast is None else torch.float32
    for passes in (1, 2):
        for cap in (1, 7, None):
            # weight and bias take gradients too: the backward's dweight/dbias strips (and, where they fit
            # beside the grid, the apply launch's strip blocks) run under the tools
            xr, wr, br = (t.detach().requires_grad_(True) for t in (x, w, b))
            label = f"{x.dtype} {autocast=} {passes=} {cap=}"
            with gn_module.max_resident_blocks(cap) if cap else contextlib.nullcontext():
                with torch.autocast("cuda", dtype=autocast or torch.float16, enabled=autocast is not None):
                    y = gn_module.group_norm(xr, groups, wr, br, act="silu", passes=passes)
                dx, dw, db = torch.autograd.grad(y, (xr, wr, br), dy)
            reference.compare(y, ref_y, y_dtype, f"y {label}")
            reference.compare(dx, ref_dx, x.dtype, f"dx {label}")
            reference.compare(dw, ref_dw, torch.float16, f"dweight {label}")  # (float32 parameters)
            reference.compare(db, ref_db, torch.float16, f"dbias {label}")


def main() -> None:
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for shape, groups in (((2, 64, 24, 20), 8), ((1, 96, 9, 11), 32)):
            x = channels_last(torch.randn(shape, device="cuda").to(dtype))
            check(x, groups, torch.randn_like(x), None)
    # at cap 7 the one-launch forward runs 1 team of 7 members for 2 rounds, each member's chunks kept on
    # chip (what -DGN_EXP_STREAMED_ROUNDS=1 runs as one stream per member)
    x = channels_last(torch.randn((2, 64, 64, 64), device="cuda").to(torch.float16))
    check(x, 8, torch.randn_like(x), None)
    # the cluster teams (teams of 6 and of 2 on an H200; a scalar-path C): at the natural cap, where the
    # plan fits, sm_90 code runs fwd_task_cluster
    for shape, groups in (((2, 1280, 16, 16), 32), ((2, 2560, 8, 8), 32), ((2, 100, 37, 5), 10)):
        x = channels_last(torch.randn(shape, device="cuda").to(torch.float16))
        fits = schedule.cluster_teams_fit(ops.plan(x.shape, groups, x.dtype, "fwd", 1))
        print(
            f"cluster teams {shape}: {'fit' if fits else 'do not fit'} (sm_{ops.runtime_cuda_arch() // 10})"
        )
        check(x, groups, torch.randn_like(x), None)
    for dtype in (torch.float16, torch.bfloat16):  # the wide launches: float32 y and dy
        x = channels_last(torch.randn((2, 128, 24, 20), device="cuda").to(dtype))
        check(x, 32, channels_last(torch.randn(x.shape, device="cuda")), dtype)
    torch.cuda.synchronize()
    print("sanitize workload: all results correct")


if __name__ == "__main__":
    main()
