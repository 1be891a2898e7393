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
