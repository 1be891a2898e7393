"""NaN probes: one NaN in x stays in its (sample, group), as in torch's GroupNorm, forward and backward.

A probe (`pytest_gn.cases.nan_probe`) puts the NaN in group 1 of sample 0 of a tensor whose groups are 3
channels wide, so vectors of channels straddle groups. Its group's y and dx must be NaN, and its channels'
dweight and dbias; every other element must be finite and match the fp64 reference. gn_module also runs
its one launch and its two, which must agree. A foreign implementation runs in a child process, like an
overflow case.
"""

from __future__ import annotations

import pytest

from pytest_gn.cases import DTYPES, nan_probe


@pytest.mark.parametrize("act", [None, "silu"], ids=lambda a: a or "noact")
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_gn_nan_stays_in_its_group(direction: str, dtype: str, act: str | None, gn_check) -> None:
    gn_check(nan_probe(direction, dtype, act))
