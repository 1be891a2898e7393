"""GPU tests of the one-launch kernels' team stagger ("auto" by default; ops.team_stagger,
GN_TEAM_STAGGER): team j starts its first task (j % phases) x ns late. Forced multi-team, multi-round
plans (some with overflow chunks re-read from global memory) against the fp64 reference with poisoned
outputs, bitwise equal unstaggered and to the two launches, every tile in the launch record; and the
delay reaches the kernel."""

from __future__ import annotations

import pytest
import torch
from script_loader import load_script

import gn_module
from gn_module import ops, reference, schedule

from .test_kernels import check_against_reference, make_case, run, shape_id

# the team sizes forced as scripts/l2_team_sweep.py forces them (one definition of a forced plan)
forced_teams = load_script("l2_team_sweep").forced_teams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# (shape, groups, team size, teams): the cap is team size x teams, so the team walks several rounds
CASES = [
    ((8, 128, 128, 128), 32, 16, 2),  # 4 rounds, members re-read 10 of 16 chunks
    ((8, 320, 32, 32), 32, 6, 4),
    ((6, 96, 20, 20), 8, 5, 3),  # fp16 C=96: 3 teams in 2 phases, the third starts with the first
    ((4, 640, 4, 8, 8), 32, 3, 4),
]


@pytest.fixture(autouse=True)
def _task_kernels(monkeypatch):
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd")
    monkeypatch.delenv(ops.ENV_STAGGER, raising=False)
    ops._launches.clear()
    with ops.poison_outputs():
        yield
    ops._launches.clear()


@pytest.mark.parametrize("phases", [2, 3])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize(("shape", "groups", "m", "teams"), CASES, ids=shape_id)
def test_against_fp64_and_bitwise_equal_unstaggered(monkeypatch, shape, groups, m, teams, dtype, phases):
    monkeypatch.setattr(schedule, "choose_teams", forced_teams(m))
    x, w, b, dy = make_case(shape, groups, dtype, mean=3.0)
    with ops.max_resident_blocks(m * teams):
        p = ops.plan(x.shape, groups, x.dtype, "fwd", 1)
        assert schedule.team_stagger(p, 20000, phases) == (20000, phases), p.teams  # not vacuous
        with ops.team_stagger(20000, phases), ops.launch_record() as rec:
            got = check_against_reference(x, groups, w, b, "silu", 1, dy)
        r = rec["fwd"]
        assert r["schedule"] == 1 and r["tiles_phase1"] == r["tiles_applied"] == p.tiles
        plain = run(x, groups, w, b, "silu", 1, dy)
    two = run(x, groups, w, b, "silu", 2, dy)
    for a, b_, c in zip(got, plain, two, strict=True):
        assert torch.equal(a, b_) and torch.equal(a, c)


def test_the_delay_reaches_the_kernel(monkeypatch):
    # a 3 ms stagger: the launch cannot end before its late teams start (a lower bound, not a speed test)
    monkeypatch.setattr(schedule, "choose_teams", forced_teams(16))
    x, w, b, _ = make_case((8, 128, 128, 128), 32, torch.float16)

    def elapsed_ms() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.no_grad():
            ops.forward(x, w, b, 32, 1e-5, 1, 1)  # (warm: the launch is built and cached)
            start.record()
            ops.forward(x, w, b, 32, 1e-5, 1, 1)
            end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    with ops.max_resident_blocks(32):
        with ops.team_stagger(0):
            plain = elapsed_ms()
        with ops.team_stagger(3_000_000):
            late = elapsed_ms()
    assert late >= 3.0 > plain, (late, plain)


def test_the_delay_reaches_the_backward_kernel(monkeypatch):
    # the one-launch backward (GN_ARCH=tasks+bwd1) at a 3 ms stagger: its late teams hold the launch back
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd1")
    monkeypatch.setattr(schedule, "choose_teams", forced_teams(16))
    x, w, b, dy = make_case((8, 128, 128, 128), 32, torch.float16)
    with torch.no_grad():
        _, mean, rstd = ops.forward(x, w, b, 32, 1e-5, 1, 2)

    def elapsed_ms() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ops.backward(dy, x, w, b, mean, rstd, 32, 1e-5, 1, 1)  # (warm: the launch is built and cached)
        start.record()
        ops.backward(dy, x, w, b, mean, rstd, 32, 1e-5, 1, 1)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    with ops.max_resident_blocks(32):
        assert ops.plan(x.shape, 32, x.dtype, "bwd", 1).schedule == 1  # (not vacuous: the one launch)
        with ops.team_stagger(0):
            plain = elapsed_ms()
        with ops.team_stagger(3_000_000):
            late = elapsed_ms()
    assert late >= 3.0 > plain, (late, plain)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_auto_takes_the_staggered_one_launch_where_it_fits(dtype):
    # 16x512x128x128 (256 MiB): 8 teams of 32 for 8 rounds on an H200, re-reading 2 chunks each
    x, w, b, _ = make_case((16, 512, 128, 128), 32, dtype, mean=3.0)
    one = ops.plan(x.shape, 32, x.dtype, "fwd", 1)
    if not schedule.stagger_fits(one.teams):
        pytest.skip(f"this GPU's one-launch teams take no automatic stagger: {one.teams}")
    with ops.team_stagger(0):
        assert ops.plan(x.shape, 32, x.dtype, "fwd", "auto").schedule == 2  # (unstaggered: two launches)
    with ops.team_stagger("auto"):  # (the default, unless GN_TEAM_STAGGER says otherwise)
        staggered = ops.plan(x.shape, 32, x.dtype, "fwd", "auto")
        assert staggered == one and schedule.team_stagger(staggered, "auto")[0] > 0
        with torch.no_grad(), ops.launch_record() as rec:
            got = gn_module.group_norm(x, 32, w, b, act="silu")
        r = rec["fwd"]
        assert r["schedule"] == 1 and r["tiles_phase1"] == r["tiles_applied"] == staggered.tiles
    reference.compare(got, reference.forward(x, 32, w, b, 1e-5, "silu"), dtype, "y")
    with torch.no_grad():
        two = gn_module.group_norm(x, 32, w, b, act="silu", passes=2)
    assert torch.equal(got, two)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize(("shape", "groups", "m", "teams"), CASES, ids=shape_id)
def test_the_one_launch_backward_staggered(monkeypatch, shape, groups, m, teams, dtype):
    # the one-launch backward (GN_ARCH=tasks+bwd1) of several teams in several rounds, staggered: fp64
    # agreement with poisoned outputs, every tile in both phases, and the bits of the unstaggered one
    # launch and of the two launches
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd1")
    monkeypatch.setattr(schedule, "choose_teams", forced_teams(m))
    x, w, b, dy = make_case(shape, groups, dtype, mean=3.0)
    with ops.max_resident_blocks(m * teams):
        p = ops.plan(x.shape, groups, x.dtype, "bwd", 1)
        assert p.schedule == 1 and schedule.team_stagger(p, 20000) == (20000, 2), p.teams  # not vacuous
        with ops.team_stagger(20000), ops.launch_record() as rec:
            got = check_against_reference(x, groups, w, b, "silu", 1, dy)
        r = rec["bwd"]
        assert r["schedule"] == 1 and r["tiles_phase1"] == r["tiles_applied"] == p.tiles
        assert r["chunks_reread"] == schedule.task_reread_chunks(r["plan"])
        with ops.team_stagger(0):
            plain = run(x, groups, w, b, "silu", 1, dy)
    two = run(x, groups, w, b, "silu", 2, dy)
    for name, a, b_, c in zip(("y", "dx", "dweight", "dbias"), got, plain, two, strict=True):
        assert torch.equal(a, b_) and torch.equal(a, c), name
