"""No task kernel keeps its values in local memory (sm_90 SASS, nvcc and cuobjdump, no GPU).

ptxas reports spills, which tests/test_multiarch_compile.py forbids, but not locals that never lived in
registers: an array whose address escapes (passed by reference to a non-inlined call) stays on the stack
for the whole loop around the call. The wide backward's stats kernel did that with its sums, 514 local
loads and stores per kernel, and ran at about half the plain kernel's bandwidth (RESULTS.md session 11).
A kernel may use local memory around an out-of-line call (the copies it passes, once per tile), never
per row: this test bounds the count per kernel. Skips without nvcc, cuobjdump or nvdisasm (the pip wheels
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` provide them).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from gn_module import build, resources

#: The task kernels' translation units.
SOURCES = ("gn_forward.cu", "gn_backward_tasks.cu")
#: Local loads and stores a kernel may have: the outlined fold's call site and frame (66 in the wide
#: backward's stats kernel); the sums kept on the stack per row had 514.
MAX_LOCAL_ACCESSES = 96


def find_tool(name: str) -> str | None:
    """`name` (cuobjdump, nvdisasm) on PATH, beside nvcc, or in its nvidia-cuda-* wheel."""
    found = shutil.which(name)
    if found:
        return found
    try:
        beside = Path(resources.find_nvcc()).parent / name
        if beside.exists():
            return str(beside)
    except Exception:  # no nvcc: the test skips on that first
        pass
    try:
        import nvidia  # type: ignore[import-not-found]
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for candidate in Path(root).glob(f"cu*/bin/{name}"):
            return str(candidate)
    return None


def local_accesses(sass: str) -> Counter:
    """LDL/STL instructions per kernel of a `cuobjdump -sass` listing."""
    counts: Counter = Counter()
    kernel = None
    for line in sass.splitlines():
        head = re.search(r"Function : (\S+)", line)
        if head:
            kernel = head.group(1)
            counts[kernel] += 0
        elif kernel and re.search(r"\b(LDL|STL)\b", line):
            counts[kernel] += 1
    return counts


def test_local_access_counter() -> None:
    sass = "Function : k1\n  LDL R1, [R1]\n  STL.64 [R1], R2\n  LDS R3, [R4]\n"
    sass += "Function : k2\n  FADD R1, R2, R3\n"
    assert local_accesses(sass) == Counter({"k1": 2, "k2": 0})


@pytest.mark.parametrize("source", SOURCES)
def test_task_kernels_keep_no_values_in_local_memory(source: str, tmp_path: Path) -> None:
    try:
        nvcc = resources.find_nvcc()
    except resources.NvccNotFound as exc:
        pytest.skip(str(exc))
    cuobjdump, nvdisasm = find_tool("cuobjdump"), find_tool("nvdisasm")
    if cuobjdump is None or nvdisasm is None:  # (cuobjdump -sass runs nvdisasm)
        pytest.skip("no cuobjdump or nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    src = build.csrc_dir() / source
    cubin = tmp_path / "out.cubin"
    cmd = [nvcc, "-cubin", "-arch=sm_90", "-O3", "-std=c++17", "-I", str(src.parent)]
    cmd += ["-o", str(cubin), str(src)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    env = {**os.environ, "NVDISASM_PATH": str(Path(nvdisasm).parent)}
    dump = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, env=env)
    assert dump.returncode == 0, f"cuobjdump -sass failed: {dump.stderr.strip()}"
    sass = dump.stdout
    counts = local_accesses(sass)
    tasks = {k: n for k, n in counts.items() if "_task_" in k}
    assert tasks, f"no task kernels in {source}'s SASS"
    worst = {k: n for k, n in tasks.items() if n > MAX_LOCAL_ACCESSES}
    assert not worst, f"local-memory loads/stores per kernel over {MAX_LOCAL_ACCESSES}: {worst}"
