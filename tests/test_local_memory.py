"""No task kernel keeps its values in local memory, and each loads its combine's partials in batches (sm_90
SASS, nvcc and cuobjdump, no GPU).

ptxas reports spills, which tests/test_multiarch_compile.py forbids, but not locals that never lived in
registers: an array whose address escapes (passed by reference to a non-inlined call) stays on the stack
for the whole loop around the call. The wide backward's stats kernel did that with its sums, 514 local
loads and stores per kernel, and ran at about half the plain kernel's bandwidth (RESULTS.md session 11).
A kernel may use local memory around an out-of-line call (the copies it passes, once per tile), never
per row: this test bounds the count per kernel. Skips without nvcc, cuobjdump or nvdisasm (the pip wheels
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` provide them).
"""

from __future__ import annotations

import pytest

from gn_module import resources

#: The task kernels' translation units.
SOURCES = ("gn_forward.cu", "gn_backward_tasks.cu")
#: Local loads and stores a kernel may have: the outlined fold's call site and frame (66 in the wide
#: backward's stats kernel); the sums kept on the stack per row had 514.
MAX_LOCAL_ACCESSES = 96


def test_local_access_counter() -> None:
    sass = "Function : k1\n  LDL R1, [R1]\n  STL.64 [R1], R2\n  LDS R3, [R4]\n"
    sass += "Function : k2\n  FADD R1, R2, R3\n"
    assert resources.local_accesses(sass) == {"k1": 2, "k2": 0}


@pytest.fixture(scope="module")
def sm90() -> resources.ArchReport:
    """Every source's sm_90 kernels with their SASS local counts: the same cache entry as
    tests/test_multiarch_compile.py's sm_90 (compile_archs(sass_archs=("sm_90",))), so one of the two
    modules compiles it and the other reads it."""
    try:
        nvcc = resources.find_nvcc()
    except resources.NvccNotFound as exc:
        pytest.skip(str(exc))
    if resources.sass_tools(nvcc) is None:
        pytest.skip("no cuobjdump or nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    return resources.compile_arch("sm_90", nvcc=nvcc, sass=True)


@pytest.mark.parametrize("source", SOURCES)
def test_task_kernels_keep_no_values_in_local_memory(source: str, sm90: resources.ArchReport) -> None:
    mine = [k for k in sm90.kernels if k.source == source and "_task_" in k.mangled]
    tasks = {k.mangled: k.local_accesses for k in mine}
    assert tasks, f"no task kernels in {source}'s sm_90 report"
    assert all(n >= 0 for n in tasks.values()), f"SASS not read for {source}: {tasks}"
    worst = {k: n for k, n in tasks.items() if n > MAX_LOCAL_ACCESSES}
    assert not worst, f"local-memory loads/stores per kernel over {MAX_LOCAL_ACCESSES}: {worst}"


def test_load_batch_counter() -> None:
    sass = "Function : k1\n  LDG.E.64.STRONG.GPU R2, desc[UR4][R6.64]\n  FADD R1, R2, R3\n"
    sass += "  @!P0 LDG.E.64.STRONG.GPU R2, desc[UR4][R6.64]\n  IADD3 R6, R6, 0x8, RZ\n"
    sass += "  LDG.E.64.STRONG.GPU R4, desc[UR4][R6.64]\n  FADD R1, R1, R4\n"
    sass += "Function : k2\n  LDG.E.64 R2, desc[UR4][R6.64]\n"
    assert resources.load_batches(sass) == {"k1": 2, "k2": 0}


#: sum_partials' batch (csrc gn_task_reduce.cuh kBatch): its loads leave together.
PARTIALS_BATCH = 16
#: Kernels that combine tile partials (the stats launches, the cluster forward, the backward's apply launch:
#: sum_partials). Not the one-launch forward (fwd_task_onepass): there ptxas issues the loads one at a time,
#: and batching them (loads at clamped indices, branch exp/combine-batch) made its forward no faster on the
#: H200 and the backward 1-7 us slower (RESULTS.md session 28), so it stays as it is.
COMBINING = ("fwd_task_cluster", "fwd_task_stats", "bwd_task_stats", "bwd_task_apply")


@pytest.mark.parametrize("source", SOURCES)
def test_combine_loads_leave_together(source: str, sm90: resources.ArchReport) -> None:
    """The combine loads the tile partials in batches of sum_partials' kBatch (16) in flight at once,
    as the combining kernels' SASS does today: a rewrite of sum_partials whose loads go one L2 round
    trip at a time fails here (`scripts/plant_bug.py combine-loads-serial` turns both sources red)."""
    mine = {k.name: k.load_batch for k in sm90.kernels if k.source == source and "_task_" in k.mangled}
    combining = {n: b for n, b in mine.items() if n.split("[")[0] in COMBINING}
    assert combining, f"no combining task kernels in {source}'s sm_90 report: {sorted(mine)}"
    assert all(b >= 0 for b in combining.values()), f"SASS not read for {source}: {combining}"
    short = {n: b for n, b in combining.items() if b < PARTIALS_BATCH}
    assert not short, f"combine loads in flight at once, below {PARTIALS_BATCH}: {short}"
