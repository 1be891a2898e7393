"""Overflow cases for the GPU at hand (natural and capped) and, in the arch sweep, per profile."""

from __future__ import annotations

import pytest


@pytest.mark.overflow_grid
def test_gn_overflow(gn_case, gn_check) -> None:
    gn_check(gn_case)
