"""GPU tests of the cluster teams (ops.cluster_teams, on by default): the one-launch forward's teams of
at most schedule.CLUSTER_MAX_TEAM blocks run as thread-block clusters that meet at the cluster barrier
(csrc fwd_task_cluster) instead of an arrival counter and a flag. Against the fp64 reference with
poisoned outputs, bitwise equal to the cooperative teams (same plan, same partials, same combine), the
cluster kernel seen in the profiler where the build runs sm_90 code, and every tile in the launch record.
Below sm_90 the flag stays off and the same checks hold trivially."""

from __future__ import annotations

import pytest
import torch

import gn_module
from gn_module import ops, schedule

from .test_kernels import check_against_reference, make_case, run, shape_id

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# teams of 6, 4 and 2 on an H200; a scalar-path C (fp16 C=100); a 5-D tensor; 32 teams of 8 (256 blocks),
# whose clusters the H200 does not hold all at once: the launcher takes the cooperative teams there
SHAPES = [
    ((2, 1280, 16, 16), 32),
    ((4, 512, 16, 16), 32),
    ((2, 2560, 8, 8), 32),
    ((2, 100, 37, 5), 10),
    ((3, 640, 4, 8, 8), 32),
    ((16, 320, 32, 32), 32),
]


@pytest.fixture(autouse=True)
def _task_kernels(monkeypatch):
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd")
    monkeypatch.delenv(ops.ENV_CLUSTER, raising=False)
    with ops.poison_outputs():
        yield


@pytest.fixture
def plain_tiling(monkeypatch):
    """The forward's plain tiling (no small-forward geometry); the cached launches do not know the setting."""
    monkeypatch.setattr(schedule, "SMALL_FORWARD_GEOMETRY", False)
    ops._launches.clear()
    yield
    ops._launches.clear()


def sm90_code() -> bool:
    return ops.runtime_cuda_arch() >= 900


def forward_kernels(fn) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}


@pytest.mark.parametrize("dtype", list(DTYPES), ids=str)
@pytest.mark.parametrize("act", [None, "silu", "relu"], ids=lambda a: a or "noact")
@pytest.mark.parametrize(("shape", "groups"), SHAPES, ids=shape_id)
def test_against_fp64_and_bitwise_equal_to_cooperative_teams(shape, groups, dtype, act):
    x, w, b, dy = make_case(shape, groups, DTYPES[dtype], mean=3.0)
    with ops.cluster_teams(), ops.launch_record() as rec:
        got = check_against_reference(x, groups, w, b, act, 1, dy)
    r = rec["fwd"]
    assert r["schedule"] == 1 and r["tiles_phase1"] == r["tiles_applied"] == r["plan"].tiles
    assert r["grid"] == r["plan"].grid
    with ops.cluster_teams(False):
        plain = run(x, groups, w, b, act, 1, dy)
    for a, b_ in zip(got, plain, strict=True):
        assert torch.equal(a, b_)


@pytest.mark.parametrize(("shape", "groups"), SHAPES[:3])
def test_the_cluster_kernel_runs_where_the_plan_fits(shape, groups):
    x, w, b, _ = make_case(shape, groups, torch.float16)
    p = ops.plan(x.shape, groups, x.dtype, "fwd", 1)
    assert schedule.cluster_teams_fit(p), p.teams

    def forward():
        with torch.no_grad():
            ops.forward(x, w, b, groups, 1e-5, 1, 1)

    with ops.cluster_teams():
        names = forward_kernels(forward)
    clustered = any("fwd_task_cluster" in n for n in names)
    assert clustered == sm90_code(), names
    with ops.cluster_teams(False):
        assert not any("fwd_task_cluster" in n for n in forward_kernels(forward))


@pytest.mark.parametrize("cap", [32, 64])
def test_capped_teams_of_one_round(cap, plain_tiling):
    # teams of 4 and 8 members holding 6 and 3 chunks each: still one round, still clusters (the plain
    # tiling's 8 tasks of 22 one-chunk tiles: a small forward's geometry would give this shape 16 tasks of 6)
    x, w, b, dy = make_case((1, 1280, 32, 32), 32, torch.float16)
    with ops.max_resident_blocks(cap):
        p = ops.plan(x.shape, 32, x.dtype, "fwd", 1)
        assert schedule.cluster_teams_fit(p) and p.teams.team_size == cap // p.tiling.tasks
        with ops.cluster_teams():
            got = check_against_reference(x, 32, w, b, "silu", 1, dy)
    base = run(x, 32, w, b, "silu", 1, dy)  # natural residency, cooperative teams of 22
    for a, b_ in zip(got, base, strict=True):
        assert torch.equal(a, b_)


def test_autocast_wide_forward():
    # a bf16 x under autocast: the wide launch (float32 y) of the same teams
    x, w, b, _ = make_case((2, 1280, 16, 16), 32, torch.bfloat16, torch.float32)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        with ops.cluster_teams(False):
            plain = gn_module.group_norm(x, 32, w, b, act="silu", passes=1)
        with ops.cluster_teams():
            got = gn_module.group_norm(x, 32, w, b, act="silu", passes=1)
    assert got.dtype == torch.float32 and torch.equal(got, plain)


def test_cuda_graph_replays():
    x, w, b, _ = make_case((2, 1280, 16, 16), 32, torch.float16)
    static_x = x.clone()
    with torch.no_grad(), ops.cluster_teams():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                ops.forward(static_x, w, b, 32, 1e-5, 1, 1)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_y = ops.forward(static_x, w, b, 32, 1e-5, 1, 1)[0]
        for _ in range(5):
            static_x.copy_(torch.randn_like(static_x))
            g.replay()
            with ops.cluster_teams(False):
                want = ops.forward(static_x, w, b, 32, 1e-5, 1, 1)[0]
            assert torch.equal(static_y, want)
