"""GPU tests of the backward stats kernel's cold variant (csrc gn_backward_tasks.cu `cold_stats_rows`): the
two-launch task backward launches `bwd_task_stats<..., kColdRows>`, whose row loop runs a row at a time, where
the plan's busiest member reads fewer than `kWarmChunks` chunks per task, and the unrolled kernel elsewhere.

Each case runs a small shape twice: at the natural residency, where the plan takes the cold variant, and under
a cap of one block, where every member reads all of its task's chunks and the plan takes the warm one. Both
runs are checked against the fp64 reference with poisoned outputs, and they must be bitwise equal. The
planting `bwd-cold-rows-first-row` (scripts/plant_bug.py) breaks the cold variant only, which turns the first
check red."""

from __future__ import annotations

import re

import pytest
import torch

import gn_module
from gn_module import build, ops

from .test_kernels import check_against_reference, make_case, run, shape_id

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
#: Members of one chunk (2x1280x16x16, 4x512x16x16, 2x640x32x32 on the H200) and of two (2x320x64x64).
SHAPES = [((2, 1280, 16, 16), 32), ((4, 512, 16, 16), 32), ((2, 640, 32, 32), 32), ((2, 320, 64, 64), 32)]


def warm_chunks() -> int:
    """csrc's kWarmChunks, read from the sources the kernels are built from (GN_CSRC_DIR included)."""
    text = (build.csrc_dir() / "gn_backward_tasks.cu").read_text()
    found = re.search(r"constexpr int kWarmChunks = (\d+);", text)
    assert found, "kWarmChunks is gone from gn_backward_tasks.cu: move this test's rule with it"
    return int(found[1])


def busiest_member_chunks(x: torch.Tensor, groups: int, cap: int | None) -> int:
    """The chunks per task of the plan's busiest member, the count cold_stats_rows compares."""
    return ops.plan(x.shape, groups, x.dtype, "bwd", 2, cap=cap).teams.chunks_per_member


@pytest.fixture(autouse=True)
def _task_kernels(monkeypatch):
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd")
    with ops.poison_outputs():
        yield


@pytest.mark.parametrize("act", [None, "silu", "relu"], ids=lambda a: a or "noact")
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(("shape", "groups"), SHAPES, ids=shape_id)
def test_cold_and_warm_variants_against_fp64_and_bitwise_equal(shape, groups, dtype, act):
    x, w, b, dy = make_case(shape, groups, DTYPES[dtype], mean=1.0)
    natural, capped = busiest_member_chunks(x, groups, None), busiest_member_chunks(x, groups, 1)
    if natural >= warm_chunks():
        pytest.skip(f"this GPU's plan gives members {natural} chunks: the warm variant runs either way")
    assert capped >= warm_chunks(), f"a cap of one block still gives members only {capped} chunks"
    cold = check_against_reference(x, groups, w, b, act, 2, dy)
    with gn_module.max_resident_blocks(1):
        warm = check_against_reference(x, groups, w, b, act, 2, dy)
    for name, c, h in zip(("y", "dx", "dw", "db"), cold, warm, strict=True):
        assert torch.equal(c, h), f"{name}: the cold variant's bits differ from the warm one's"


def test_the_natural_plans_of_the_small_shapes_take_the_cold_variant():
    """On a GPU of at least 64 resident blocks of these kernels, one of the shapes above runs cold (else the
    test above skips everywhere and checks nothing)."""
    if ops.plan((2, 1280, 16, 16), 32, torch.float16, "bwd", 2, cap=None).residency < 64:
        pytest.skip("fewer than 64 resident blocks: members of the small shapes read several chunks")
    runs = [busiest_member_chunks(make_case(s, g, torch.float16)[0], g, None) for s, g in SHAPES]
    assert min(runs) < warm_chunks(), f"busiest members' chunks {runs}: no shape runs the cold variant"


def test_repeatable_in_the_cold_variant():
    x, w, b, dy = make_case((2, 1280, 16, 16), 32, torch.bfloat16)
    first = run(x, 32, w, b, "silu", 2, dy)
    for _ in range(3):
        again = run(x, 32, w, b, "silu", 2, dy)
        assert all(torch.equal(a, c) for a, c in zip(first, again, strict=True))
