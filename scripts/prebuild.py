"""Warm every cache an arch sweep needs, in parallel: the native library and the sweep's PTX variants
(JIT builds), and the ptxas resource reports of the built-in profiles' archs (gn_module.resources)."""

import time
from concurrent.futures import ThreadPoolExecutor

import torch

from gn_module import build, profiles, resources

VARIANTS = (None, "compute_80", "compute_86", "compute_87", "compute_89", "compute_90")

if __name__ == "__main__":
    cc = torch.cuda.get_device_capability()
    t0 = time.perf_counter()
    archs = sorted({p.arch for p in profiles.BUILTIN_PROFILES})
    with ThreadPoolExecutor(len(VARIANTS) + 1) as ex:
        reports = ex.submit(resources.compile_archs, archs)
        list(ex.map(lambda v: build.build(v, cc), VARIANTS))
        failed = [a for a, r in reports.result().items() if isinstance(r, Exception)]
    elapsed = time.perf_counter() - t0
    note = f"; reports failed for {failed}" if failed else ""
    print(f"built {len(VARIANTS)} variants and {len(archs)} resource reports in {elapsed:.1f} s{note}")
