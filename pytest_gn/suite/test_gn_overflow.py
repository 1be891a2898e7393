"""Overflow cases for the GPU at hand (natural and capped) and, in the arch sweep, per profile.

The default kinds ((C, G) pairs, or --gn-shapes, times the even, partial and batch geometries)
rotate over the cells and scopes (`pytest_gn.cases`), so each scope keeps 48 cases; the two
cases over 2**31 elements (one-pass forward and backward) are this GPU's only. With ``--gn-arch
tasks`` or ``both`` the task kernels' cases come too: forward (24 per scope and one over 2**31
elements; `pytest_gn.tasks`) and backward (as many; `pytest_gn.tasks_bwd`).
"""

from __future__ import annotations

import pytest


@pytest.mark.overflow_grid(over_2_31=True)
def test_gn_overflow(gn_case, gn_check) -> None:
    gn_check(gn_case)
