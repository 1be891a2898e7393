"""Hooks pytest-gn adds; implement them in a conftest.py."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec
def pytest_gn_add_profiles(config: pytest.Config) -> Any:
    """Return extra GPU profiles for the arch sweep.

    Each result may be a `gn_module.schedule.DeviceLimits`, a mapping like
    ``{"name": "MyGPU", "cc": "8.6", "sm_count": 30}`` (see `gn_module.profiles.profile_from_mapping`),
    or a list of those. A profile named like a built-in one replaces it.
    """


@pytest.hookspec(firstresult=True)
def pytest_gn_describe_impl(
    config: pytest.Config, impl: Any, shape: tuple[int, ...], num_groups: int, dtype: Any, direction: str,
    device: Any,
) -> Any:  # fmt: skip
    """Describe the implementation under test (``--gn-impl``) for one input shape, so that its
    overflow cases are sized for its own tiles instead of the conservative 512-row rule.

    Return a mapping ``{"tile_rows": R, "resident_blocks": B}``: the implementation cuts each
    sample's rows (positions of the (N, C, *spatial) input, all C channels) into tiles of R rows
    and its one-pass kernel holds B blocks for this `shape` (N, C, H, W) in `dtype` (a
    torch.dtype) for `direction` ("fwd" or "bwd") on `device` (a torch.device). Return None to
    leave it to the callable's ``gn_describe`` attribute (or the conservative sizing); raise
    NotImplementedError to skip the shape with your message. The first non-None result wins.

    Example::

        def pytest_gn_describe_impl(impl, shape, dtype, direction, device):
            if getattr(impl, "__name__", "") == "their_group_norm":
                return {"tile_rows": 64, "resident_blocks": 2 * 132}
    """
