"""Compile every CUDA source for each arch of the profile table; fail on compile errors or spills.

Runs wherever nvcc is installed (no GPU needed) and skips with the reason otherwise. The
archs compile in parallel once per module; each arch is its own test so a failure names it.
"""

from __future__ import annotations

import pytest

from gn_module import profiles, resources

ARCHS = sorted({p.arch for p in profiles.BUILTIN_PROFILES}, key=lambda a: int(a[3:]))


@pytest.fixture(scope="module")
def compiled() -> dict:
    try:
        nvcc = resources.find_nvcc()
    except resources.NvccNotFound as exc:
        pytest.skip(str(exc))
    if not resources.sources():
        pytest.skip(f"no CUDA sources under {resources.csrc_dir()}")
    # sm_90 with its SASS local counts: tests/test_local_memory.py reads the same cache entry
    return resources.compile_archs(ARCHS, nvcc=nvcc, sass_archs=("sm_90",))


def test_profile_table_covers_required_archs() -> None:
    required = {"sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_110", "sm_120", "sm_121"}
    assert required <= set(ARCHS)


@pytest.mark.parametrize("arch", ARCHS)
def test_compiles_without_spills(arch: str, compiled: dict) -> None:
    report = compiled[arch]
    if isinstance(report, Exception):
        pytest.fail(f"{arch}: {report}", pytrace=False)
    assert report.kernels, f"{arch}: ptxas reported no kernels"
    print(f"\n{arch} ({report.nvcc}, sources {report.sources_hash}):")
    for k in sorted(report.kernels, key=lambda k: k.name):
        print(f"  {k.source:16s} {k.describe()}")
    spilling = [k.describe() for k in report.spilling]
    assert not spilling, f"{arch}: register spills or local memory in: {spilling}"


@pytest.mark.parametrize("arch", ARCHS)
def test_dynamic_shared_memory_starts_128_byte_aligned(arch: str, compiled: dict) -> None:
    """The dynamic region (the task kernels' chunk slots) begins after a kernel's static __shared__
    words; ptxas reports their size rounded up to the region's alignment. At 16 bytes the cp.async rows
    of every warp straddled two shared-memory wavefronts and L2 served each sector of x twice (H200,
    RESULTS.md session 15: the forward stats launch 158 -> 138 us once aligned)."""
    report = compiled[arch]
    if isinstance(report, Exception):
        pytest.fail(f"{arch}: {report}", pytrace=False)
    misaligned = [k.describe() for k in report.kernels if k.static_smem % 128]
    assert not misaligned, f"{arch}: the dynamic shared memory of {misaligned} is not 128-byte aligned"


def cluster_kernel_problems(report: resources.ArchReport) -> list[str]:
    """fwd_task_cluster has its body only in sm_90+ code (csrc gn_forward.cu: it is never launched below):
    a real kernel there (barriers: __syncthreads, the cluster barrier), an empty stub below."""
    arch = int(report.arch[3:])
    kernels = [k for k in report.kernels if "fwd_task_cluster" in k.mangled]
    if not kernels:
        return [f"{report.arch}: no fwd_task_cluster kernels"]
    if arch >= 90:
        return [f"{k.describe()}: no body on {report.arch}" for k in kernels if k.barriers == 0]
    return [f"{k.describe()}: a body on {report.arch} (never run there)" for k in kernels if k.barriers > 0]


@pytest.mark.parametrize("arch", ARCHS)
def test_cluster_kernel_has_its_body_only_from_sm_90(arch: str, compiled: dict) -> None:
    report = compiled[arch]
    if isinstance(report, Exception):
        pytest.fail(f"{arch}: {report}", pytrace=False)
    assert not cluster_kernel_problems(report)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_config_the_sweep_models_is_compiled(arch: str, compiled: dict) -> None:
    """The sweep models residency from the ptxas report by config name (pytest_gn.device's configs); a
    renamed or re-templated kernel must not drop out of it (session 34: bwd_task_stats' cold flag made
    every task backward case of `--gn-arch-sweep` error at setup). Each variant the launcher may pick
    instead (resources.VARIANT_FLAGS) sits next to its default, so launch_resources weighs it."""
    from pytest_gn.device import MAIN_CONFIGS, MAIN_TASK_CONFIGS, kernel_configs, task_kernel_configs

    report = compiled[arch]
    if isinstance(report, Exception):
        pytest.fail(f"{arch}: {report}", pytrace=False)
    names = set(report.by_name())
    wanted = [c for c, _, _ in kernel_configs() + task_kernel_configs()] + [*MAIN_CONFIGS, *MAIN_TASK_CONFIGS]
    missing = [c for c in wanted if c not in names]
    assert not missing, f"{arch}: the sweep models {missing}, not compiled (compiled: {sorted(names)})"
    variants = [n for n in names for flag in resources.VARIANT_FLAGS.values() if n.endswith(f",{flag}]")]
    assert variants, f"{arch}: no bwd_task_stats cold variant compiled"
    orphans = [n for n in variants if n.rsplit(",", 1)[0] + "]" not in names]
    assert not orphans, f"{arch}: variants without their default instantiation: {orphans}"
