"""GPU tests of the small forward's geometry (schedule.small_forward_tiling): a small tensor whose tasks
would have more tiles than a thread-block cluster holds takes a narrower window and at most 8 taller
tiles per task, 88-96 blocks in all, so that its one launch runs teams that fit clusters. The tiling is
the shape's: against the fp64 reference with poisoned outputs (forward and backward), y/mean/rstd bitwise
equal to the two launches, to the cooperative teams (clusters off) and to capped grids of smaller teams and
several rounds, and every tile in the launch record."""

from __future__ import annotations

import pytest
import torch

from gn_module import _abi, ops, schedule

from .test_kernels import check_against_reference, make_case, shape_id

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# session 55's A/B rows (H100, fp16: 2x640x32x32 15.3 -> 12.7 us, 2x320x64x64 17.7 -> 16.6, ...), a
# 3-D tensor, and a shape whose best geometry has tiles of fewer rows than its chunks hold (2x640x20x20)
SHAPES = [
    ((2, 640, 32, 32), 32),
    ((2, 320, 64, 64), 32),
    ((4, 640, 32, 32), 32),
    ((1, 640, 32, 32), 32),
    ((2, 960, 32, 32), 32),
    ((8, 256, 32, 32), 32),
    ((2, 640, 20, 20), 32),
    ((2, 320, 4, 16, 16), 32),
]


@pytest.fixture(autouse=True)
def _task_kernels(monkeypatch):
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd")
    for name in (ops.ENV_CLUSTER, ops.ENV_CAP, ops.ENV_STAGGER):
        monkeypatch.delenv(name, raising=False)
    with ops.poison_outputs():
        yield


def forward(x, w, b, groups, act, passes):
    with torch.no_grad():
        return ops.forward(x, w, b, groups, 1e-5, _abi.ACT_CODES[act], passes)


def plain(x, groups) -> schedule.TaskTiling | None:
    saved = schedule.SMALL_FORWARD_GEOMETRY
    schedule.SMALL_FORWARD_GEOMETRY = False
    try:
        n, c = x.shape[0], x.shape[1]
        return schedule.task_tiling(c, groups, x[0, 0].numel(), x.element_size(), "fwd", batch=n)
    finally:
        schedule.SMALL_FORWARD_GEOMETRY = saved


@pytest.mark.parametrize("dtype", list(DTYPES), ids=str)
@pytest.mark.parametrize("act", [None, "silu"], ids=lambda a: a or "noact")
@pytest.mark.parametrize(("shape", "groups"), SHAPES, ids=shape_id)
def test_against_fp64_and_bitwise_equal_across_schedules(shape, groups, dtype, act):
    x, w, b, dy = make_case(shape, groups, DTYPES[dtype], mean=3.0)
    p = ops.plan(x.shape, groups, x.dtype, "fwd", "auto")
    t = p.tiling
    if t == plain(x, groups):
        pytest.skip(f"{dtype}: the plain tiling here ({t.window} channels, {t.tiles_per_task} tiles)")
    assert t.tiles_per_task <= schedule.CLUSTER_MAX_TEAM and t.tiles <= schedule.SMALL_FORWARD_GRID
    if p.residency >= t.tiles:  # (a GPU that holds its blocks: one round, everything on chip)
        assert p.schedule == 1 and p.teams.rounds == 1 and p.teams.overflow_chunks == 0, p.teams
    with ops.launch_record() as rec:
        check_against_reference(x, groups, w, b, act, "auto", dy)
    r = rec["fwd"]
    assert r["plan"] == p and r["schedule"] == p.schedule
    assert r["tiles_phase1"] == r["tiles_applied"] == p.tiles
    assert r["chunks_reread"] == schedule.task_reread_chunks(p)
    got = forward(x, w, b, groups, act, 1)
    assert all(torch.equal(a, c) for a, c in zip(got, forward(x, w, b, groups, act, 2), strict=True))
    with ops.cluster_teams(False):
        cooperative = forward(x, w, b, groups, act, 1)
    assert all(torch.equal(a, c) for a, c in zip(got, cooperative, strict=True))


@pytest.mark.parametrize("cap", [48, 24, 7, 2, 1])
def test_capped_grids_give_the_same_bits(cap):
    """Fewer resident blocks: smaller teams holding more chunks, then several rounds, then re-reads (the
    tiling stays the shape's: 6 tiles of 2 chunks per task). Caps 48-7 give members of 2 or 4 chunks, which
    the H100's blocks keep on chip; cap 2 gives 6 (on chip there too, session 57, but not where shared
    memory holds fewer slots) and cap 1 gives 12, more than any block holds (MAX_SLOTS): the overflow whose
    partials a member must publish too (caps 48-7 alone missed the planting task-overflow-drop)."""
    x, w, b, _ = make_case((2, 640, 32, 32), 32, torch.float16, mean=3.0)
    want = forward(x, w, b, 32, "silu", 1)
    with ops.max_resident_blocks(cap), ops.launch_record() as rec:
        p = ops.plan(x.shape, 32, x.dtype, "fwd", 1)
        assert p.grid <= cap and p.tiling.tiles_per_task == 6
        got = forward(x, w, b, 32, "silu", 1)
    if cap == 1:  # one member holds a task's 12 chunks: more than any block's slots (MAX_SLOTS)
        assert p.teams.overflow_chunks > 0 and schedule.MAX_SLOTS < 12, p.teams
    r = rec["fwd"]
    assert r["grid"] == p.grid and r["tiles_phase1"] == r["tiles_applied"] == p.tiles
    assert r["chunks_reread"] == schedule.task_reread_chunks(p)
    assert all(torch.equal(a, c) for a, c in zip(got, want, strict=True))


def test_the_cluster_kernel_runs_it():
    x, w, b, _ = make_case((2, 640, 32, 32), 32, torch.float16)
    p = ops.plan(x.shape, 32, x.dtype, "fwd", "auto")
    if p.residency < p.tiles:
        pytest.skip(f"this GPU holds {p.residency} blocks of the geometry's {p.tiles}: no one-round clusters")
    assert schedule.cluster_teams_fit(p), p.teams
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        forward(x, w, b, 32, "silu", 0)  # (0: auto)
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    assert any("fwd_task_cluster" in n for n in names) == (ops.runtime_cuda_arch() >= 900), names
