"""Turn a collected CaseSpec into a concrete case on the GPU at hand (needs torch and CUDA)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_gn.cases import CaseSpec, CaseUnavailable, GnCase, resolve, resolve_foreign
from pytest_gn.sweep import ptx_variant


def resolve_for_device(
    spec: CaseSpec, state: Any, device: Any, config: pytest.Config | None = None
) -> GnCase:
    """Natural: this GPU's residency (occupancy API); capped: the case's cap; profile: the
    profile's modelled residency, run through its PTX build when the device can; foreign: the
    implementation's own description, else the 512-row rule. ``--gn-max-resident`` lowers every
    residency further. Skips (with the reason) a case whose geometry has no shape, or whose shape
    the implementation says it does not support."""
    try:
        return _resolve(spec, state, device, config)
    except CaseUnavailable as exc:
        pytest.skip(str(exc))
    except NotImplementedError as exc:  # from the implementation's description
        pytest.skip(f"not supported by {state.opts.impl}: {exc or 'NotImplementedError'}")


def _resolve(spec: CaseSpec, state: Any, device: Any, config: pytest.Config | None) -> GnCase:
    opts = state.opts
    if opts.foreign:
        describe = None
        if config is not None and state.impl is not None:
            import torch

            from pytest_gn.describe import DescriptionError, describer

            where = torch.device("cpu") if device.index == "cpu" else torch.device("cuda", device.index)
            describe = describer(config, state.impl, spec.groups, getattr(torch, spec.torch_dtype),
                                 spec.direction, where)  # fmt: skip
            if describe is not None:
                try:
                    return resolve_foreign(spec, device.sm_count, device.limits.max_blocks_per_sm, describe)
                except DescriptionError as exc:
                    pytest.fail(f"{spec.id}: {exc}", pytrace=False)
        return resolve_foreign(spec, device.sm_count, device.limits.max_blocks_per_sm)
    from gn_module import ops

    index, dtype = device.index, spec.torch_dtype
    if spec.is_task:
        return _resolve_task(spec, state, device)
    if spec.profile is not None:
        static = state.sweep.static(spec.profile)
        if static.report is None:
            pytest.skip(f"profile {spec.profile}: {static.error}")
        variant = ptx_variant(static.profile, device.cc)

        def on_device(t: Any) -> int:
            with ops.build_variant(variant):
                return ops.onepass_residency(t, dtype, index)

        return state.sweep.resolve_case(spec, device, on_device)
    if ops.onepass_residency(spec.tiling(), dtype, index) < 1:
        pytest.skip(f"{spec.config} cannot run one-pass on {device.name} (residency 0)")
    cap = opts.max_resident
    if spec.variant == "capped":
        cap = spec.cap if cap is None else min(cap, spec.cap)
    return resolve(spec, lambda t: ops.onepass_residency(t, dtype, index), cap=cap)


def task_model_of_device(dtype: str, index: int, variant: str | None = None) -> Any:
    """This GPU's (slots, residency) of the task kernels for a task tiling of either direction, as
    gn_module launches them (`ops.task_plan`: slots from the device's shared memory, blocks from the
    occupancy API under the build `variant`; the backward's under GN_ARCH=tasks+bwd, where it plans
    them; a wide tiling's, float32 y and dy, as its launches): a `pytest_gn.tasks.TaskModel`."""
    from gn_module import ops
    from pytest_gn.runner import arch_env

    def model(t: Any) -> tuple[int, int]:
        wide = "float32" if t.wide_itemsize else None
        with ops.build_variant(variant), arch_env("tasks+bwd"):
            p = ops.task_plan(
                (t.batch, t.channels, t.rows), t.groups, dtype, t.direction, 2, index, wide=wide
            )
        return (0, 0) if p is None else (p.slots, p.residency)

    return model


def _resolve_task(spec: CaseSpec, state: Any, device: Any) -> GnCase:
    """A task case (forward, backward or one-launch backward): this GPU's slots and residency (natural;
    capped at the case's cap), or a profile's modelled ones with the grid capped at the profile's
    residency. ``--gn-max-resident`` lowers this GPU's cases' cap further."""
    from pytest_gn.tasks_bwd import resolver_of

    dtype, index = spec.torch_dtype, device.index
    if spec.profile is not None:
        static = state.sweep.static(spec.profile)
        if static.report is None:
            pytest.skip(f"profile {spec.profile}: {static.error}")
        variant = ptx_variant(static.profile, device.cc)
        return state.sweep.resolve_task_case(spec, device, task_model_of_device(dtype, index, variant))
    cap = state.opts.max_resident
    if spec.variant == "capped":
        cap = spec.cap if cap is None else min(cap, spec.cap)
    return resolver_of(spec)(spec, task_model_of_device(dtype, index), cap=cap)
