"""Self-check of the model on the local GPU: for every one-pass kernel configuration the modelled
residency must equal the CUDA occupancy API's. A mismatch makes every emulated number suspect."""

from __future__ import annotations

import pytest

from pytest_gn.device import kernel_configs

CONFIGS = kernel_configs()


@pytest.mark.gn_cuda
@pytest.mark.parametrize(("config", "dtype", "tiling"), CONFIGS, ids=[c[0] for c in CONFIGS])
def test_gn_model_matches_occupancy_api(config, dtype, tiling, gn_device) -> None:
    from gn_module import ops, resources, schedule

    kind = config.split("[")[0]
    live = ops.kernel_resources(kind, dtype, tiling.vec, gn_device.index)
    api = ops.onepass_residency(tiling, dtype, gn_device.index)
    model = schedule.model_residency(gn_device.limits, live, tiling)
    problems = []
    if model != api:
        problems.append(f"model {model} (from cudaFuncGetAttributes {live}) != occupancy API {api}")
    try:  # the sweep models profiles from ptxas numbers: they must describe the real build too
        report = resources.compile_arch(gn_device.arch)
        from_ptxas = report.resources(config)
        modelled = schedule.model_residency(gn_device.limits, from_ptxas, tiling)
        if modelled != api:
            problems.append(f"model from ptxas {from_ptxas} gives {modelled} != API {api}")
    except resources.NvccNotFound as exc:
        print(f"ptxas cross-check skipped: {exc}")
    assert not problems, f"{config} on {gn_device.name}: " + "; ".join(problems)
