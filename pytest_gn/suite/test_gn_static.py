"""Arch sweep, static part: per GPU profile, compile for its arch and model one-pass residency.

Needs nvcc, no GPU. Results print with `-s` and feed the summary matrix."""

from __future__ import annotations

import pytest


def _profiles(config: pytest.Config) -> list[str]:
    from pytest_gn.plugin import STATE

    return [p.name for p in config.stash[STATE].selected]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "gn_profile" in metafunc.fixturenames:
        names = _profiles(metafunc.config)
        metafunc.parametrize("gn_profile", names, ids=names)


def _static(gn_sweep, gn_profile):
    st = gn_sweep.static(gn_profile)
    if gn_sweep.nvcc_error:
        pytest.skip(gn_sweep.nvcc_error)
    return st


def test_gn_compile(gn_sweep, gn_profile: str) -> None:
    """Every source compiles for the profile's arch with no register spill or local memory."""
    st = _static(gn_sweep, gn_profile)
    assert st.report is not None, st.error
    print(f"\n{gn_profile} {st.profile.arch}: " + "; ".join(k.describe() for k in st.report.kernels))
    assert not st.report.spilling, [k.describe() for k in st.report.spilling]


def test_gn_residency_model(gn_sweep, gn_profile: str) -> None:
    """The model gives every one-pass configuration at least one block per SM on the profile."""
    from pytest_gn.device import kernel_configs

    st = _static(gn_sweep, gn_profile)
    assert st.report is not None, st.error
    missing = [name for name, _, _ in kernel_configs() if name not in st.residency]
    assert not missing, f"no compiled kernel for one-pass configs {missing}: {st.error}"
    print(
        f"\n{gn_profile}: " + ", ".join(f"{c} {st.blocks_per_sm[c]}/SM={r}" for c, r in st.residency.items())
    )
    zero = [c for c, r in st.residency.items() if r < 1]
    assert not zero, f"one-pass cannot launch on {gn_profile} for {zero}"
