"""Build the native library and the arch sweep's PTX variants in parallel (before the sweep)."""

import time
from concurrent.futures import ThreadPoolExecutor

import torch

from gn_module import build

VARIANTS = (None, "compute_80", "compute_86", "compute_87", "compute_89", "compute_90")

if __name__ == "__main__":
    cc = torch.cuda.get_device_capability()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(VARIANTS)) as ex:
        list(ex.map(lambda v: build.build(v, cc), VARIANTS))
    print(f"built {len(VARIANTS)} variants in {time.perf_counter() - t0:.1f} s")
