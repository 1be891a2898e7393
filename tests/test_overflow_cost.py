"""What the overflow support costs the one-pass kernels: compiled with and without the grid-stride
loop over overflow tiles (GN_OVERFLOW_LOOP=0), the loop may add at most a few registers (fewer is
fine: ptxas schedules the two builds differently), spill nothing and fit the same number of blocks per
SM. Needs nvcc, no GPU.

Measured 2026-11-30 (nvcc 13.0): equal within 3 registers on sm_80 and sm_90, 2 blocks per SM
either way. Both builds sit at the 128-register budget that __launch_bounds__(256, 2) gives the
one-pass kernel, so ptxas spends the same budget; the loop adds no spill and no occupancy loss."""

from __future__ import annotations

import pytest

from gn_module import profiles, resources, schedule

ARCHS = ("sm_80", "sm_90")
ONEPASS_SOURCES = ("gn_forward.cu", "gn_backward.cu")  # fwd_onepass, bwd_onepass


@pytest.fixture(scope="module")
def reports():
    try:
        resources.find_nvcc()
    except resources.NvccNotFound as exc:
        pytest.skip(str(exc))
    plain = ("-DGN_OVERFLOW_LOOP=0",)
    # with the loop: every source (test_multiarch_compile's cached build); without it: only the sources of
    # the one-pass kernels (the task backward's translation units would double this module's nvcc time)
    return {
        a: (resources.compile_arch(a), resources.compile_arch(a, extra_flags=plain, only=ONEPASS_SOURCES))
        for a in ARCHS
    }


@pytest.mark.parametrize("arch", ARCHS)
def test_overflow_loop_costs_no_occupancy(reports, arch, capsys):
    with_loop, without = reports[arch]
    limits = next(p for p in profiles.BUILTIN_PROFILES if p.arch == arch)
    # the tile architecture's one-pass kernels (the task kernels re-read overflow chunks instead)
    onepass = sorted(name for name in with_loop.by_name() if name.startswith(("fwd_onepass", "bwd_onepass")))
    assert len(onepass) == 12  # fwd and bwd x fp32, fp16, bf16 x two vector widths
    rows = []
    for name in onepass:
        a, b = with_loop.by_name()[name], without.by_name()[name]
        direction = name[:3]
        t = schedule.tiling(128, 16, 1 << 20, 2 if "fp32" not in name else 4, direction)
        occ_a = schedule.blocks_per_sm(limits, a.resources, schedule.THREADS, t.onepass_smem)
        occ_b = schedule.blocks_per_sm(limits, b.resources, schedule.THREADS, t.onepass_smem)
        rows.append(f"{arch} {name:28s} registers {a.registers:3d} with overflow loop, "
                    f"{b.registers:3d} without; blocks/SM {occ_a} vs {occ_b}")  # fmt: skip
        assert not a.spills and not b.spills, name
        assert a.registers - b.registers <= 4, name  # (session 6, fused activations: sm_80 bf16 122 vs 128)
        assert occ_a == occ_b, name
    with capsys.disabled():
        print("\n" + "\n".join(rows))
