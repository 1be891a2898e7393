"""GPU checks of the pytest plugin's machinery (issue 11): the memory estimate that decides whether
a case fits bounds what checking it really allocates, and is not a wild overestimate either."""

from __future__ import annotations

import pytest
import torch

from pytest_gn.cases import FIXED_BYTES, CaseSpec, Ratio, resolve
from pytest_gn.runner import check_case

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SPECS = [
    CaseSpec("fwd", Ratio(4, 3), "fp32", "silu"),
    CaseSpec("bwd", Ratio(4, 3), "fp32", "silu"),
    CaseSpec("bwd", Ratio(2, 1), "bf16", None, 100, 20, geometry="batch"),
    CaseSpec("fwd", Ratio(2, 1), "fp16", "silu", 64, 1, geometry="partial"),
]


@pytest.mark.parametrize("spec", SPECS, ids=[s.id for s in SPECS])
def test_memory_estimate_bounds_the_measured_peak(spec: CaseSpec) -> None:
    from gn_module import ops

    case = resolve(spec, lambda t: ops.onepass_residency(t, spec.torch_dtype))
    torch.cuda.empty_cache()
    result = check_case(case, None, 0)
    assert result.ok, result.problems
    estimate = case.bytes_needed()
    assert result.peak_bytes is not None and 0 < result.peak_bytes <= estimate, (result.peak_bytes, estimate)
    assert estimate <= 3 * result.peak_bytes + FIXED_BYTES, (result.peak_bytes, estimate)
