"""Host-side cost of one eager GroupNorm call (cProfile), the part CUDA events do not show."""

import cProfile
import pstats
import time

import torch

import gn_module

x = torch.randn(2, 320, 64, 64, device="cuda", dtype=torch.float16)
x = x.contiguous(memory_format=torch.channels_last)
w = torch.randn(320, device="cuda", dtype=torch.float16)
b = torch.randn(320, device="cuda", dtype=torch.float16)
for _ in range(20):
    gn_module.group_norm(x, 32, w, b, act="silu")
torch.cuda.synchronize()
for label, fn in (
    ("ours", lambda: gn_module.group_norm(x, 32, w, b, act="silu")),
    ("eager F.group_norm", lambda: torch.nn.functional.group_norm(x, 32, w, b)),
    ("torch.empty_like", lambda: torch.empty_like(x)),
):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(500):
        fn()
    torch.cuda.synchronize()
    print(f"{label}: {(time.perf_counter() - t0) / 500 * 1e6:.1f} us per call")
prof = cProfile.Profile()
prof.enable()
for _ in range(500):
    gn_module.group_norm(x, 32, w, b, act="silu")
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(18)
