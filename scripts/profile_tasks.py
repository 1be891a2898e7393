"""Per-call GPU time of the task forward (GN_ARCH=tasks): single calls vs back-to-back calls, for ncu.

python scripts/profile_tasks.py [--once]     # --once: one call per shape (under ncu)
"""

from __future__ import annotations

import os
import sys

import torch

os.environ.setdefault("GN_ARCH", "tasks")
import gn_module

SHAPES = [((2, 320, 64, 64), 32, "silu"), ((1, 512, 128, 128), 32, "silu"), ((32, 128, 256, 256), 32, None)]


def main() -> int:
    once = "--once" in sys.argv
    for shape, groups, act in SHAPES:
        x = torch.randn(shape, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
        w = torch.randn(shape[1], device="cuda", dtype=torch.float16)
        b = torch.randn(shape[1], device="cuda", dtype=torch.float16)
        for passes in (1, 2):

            def call(passes=passes, x=x, w=w, b=b, groups=groups, act=act):
                with torch.no_grad():
                    return gn_module.group_norm(x, groups, w, b, 1e-5, act, passes=passes)

            call()
            torch.cuda.synchronize()
            if once:
                call()
                torch.cuda.synchronize()
                continue
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(50):
                call()
            e.record()
            e.synchronize()
            burst = s.elapsed_time(e) * 1e3 / 50
            singles = []
            for _ in range(20):
                torch.cuda._sleep(200000)
                s.record()
                call()
                e.record()
                e.synchronize()
                singles.append(s.elapsed_time(e) * 1e3)
            singles.sort()
            print(
                f"{'x'.join(map(str, shape))} passes={passes}: back-to-back {burst:.1f} us/call, "
                f"single median {singles[10]:.1f} us"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
