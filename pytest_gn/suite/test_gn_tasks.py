"""The task architecture's model (collected with ``--gn-arch tasks`` or ``both`` only).

Static, per profile (nvcc, no GPU): every configuration of ``fwd_task_onepass`` and ``bwd_task_stats``
(whose occupancy gives the backward's residency) keeps at least one chunk and has at least one resident
block. Self-check on the GPU at hand: the model's slots and residency (from the device's limits and
ptxas's registers) equal what gn_module launches with (its shared memory and the CUDA occupancy API; the
backward's under GN_ARCH=tasks+bwd), so the profiles' task numbers can be trusted.
"""

from __future__ import annotations

import pytest

from pytest_gn.device import task_kernel_configs

CONFIGS = task_kernel_configs()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "gn_profile" in metafunc.fixturenames:
        from pytest_gn.plugin import STATE

        names = [p.name for p in metafunc.config.stash[STATE].selected]
        metafunc.parametrize("gn_profile", names, ids=names)


def test_gn_task_residency_model(gn_sweep, gn_profile: str) -> None:
    """Every task configuration (forward, backward) keeps >= 1 chunk and has >= 1 resident block on the
    profile."""
    st = gn_sweep.static(gn_profile)
    if gn_sweep.nvcc_error:
        pytest.skip(gn_sweep.nvcc_error)
    assert st.report is not None, st.error
    missing = [name for name, _, _ in CONFIGS if name not in st.task_slots]
    assert not missing, f"no compiled kernel for task configs {missing}"
    print(f"\n{gn_profile}: " + ", ".join(f"{c} {st.task_slots[c]} slots, {r} blocks"
                                          for c, r in st.task_residency.items()))  # fmt: skip
    bad = [c for c in st.task_slots if st.task_slots[c] < 1 or st.task_residency[c] < 1]
    assert not bad, f"the task kernels cannot launch on {gn_profile} for {bad}"


@pytest.mark.gn_cuda
@pytest.mark.parametrize(("config", "dtype", "tiling"), CONFIGS, ids=[c[0] for c in CONFIGS])
def test_gn_task_model_matches_occupancy_api(config, dtype, tiling, gn_device) -> None:
    from gn_module import ops, resources, schedule
    from pytest_gn.runner import arch_env

    shape = (1, tiling.channels, tiling.rows)
    wide = "float32" if tiling.wide_itemsize else None  # a wide launch's configuration
    with arch_env("tasks+bwd"):  # where gn_module plans the backward on the task kernels too
        plan = ops.task_plan(shape, tiling.groups, dtype, tiling.direction, 2, gn_device.index, wide=wide)
    assert plan is not None, f"{config}: gn_module does not plan the task kernels for {tiling}"
    problems = []
    slots = schedule.task_slots(tiling, schedule.task_smem_budget(gn_device.limits))
    if slots != plan.slots:
        problems.append(f"model slots {slots} (from {gn_device.limits}) != launched {plan.slots}")
    try:  # the sweep models profiles from ptxas numbers: they must describe the real build too
        report = resources.compile_arch(gn_device.arch)
        res = report.launch_resources(config)
        modelled = schedule.task_model(gn_device.limits, res, tiling)
        if modelled != (plan.slots, plan.residency):
            launched = (plan.slots, plan.residency)
            problems.append(f"model from ptxas {res}: (slots, residency) {modelled} "
                            f"!= launched {launched} (occupancy API)")  # fmt: skip
    except resources.NvccNotFound as exc:
        print(f"ptxas cross-check skipped: {exc}")
    assert not problems, f"{config} on {gn_device.name}: " + "; ".join(problems)
