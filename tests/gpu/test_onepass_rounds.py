"""GPU tests of one-launch forwards whose members keep all their chunks of a task on chip for several
rounds (tasks per team): the plans that a build with -DGN_EXP_STREAMED_ROUNDS=1 runs as one stream of
chunks per member, reading the next round's chunks while the team waits for the current round's
statistics (csrc gn_forward.cu, member_rounds_streamed); the default build runs them in lockstep. Either
way: fp64 agreement with poisoned outputs, mean/rstd and y bitwise equal to the two launches, every tile
in the launch record and no chunk read twice. The cases cover spare slots from none to five (the stream
reading up to five rounds ahead), members of unequal chunk counts, tiles of two chunks, teams with fewer
rounds than others, several windows per sample, partial chunks, 3-D input, the scalar path and the wide
(float32 y) launch."""

from __future__ import annotations

import pytest
import torch
from script_loader import load_script

from gn_module import _abi, ops, reference, schedule

from .test_kernels import make_case

forced_teams = load_script("l2_team_sweep").forced_teams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# (shape, groups, dtype, team size m, teams): the cap is m x teams. Chunk counts per member at the H200's
# 6 slots of 16 KB in the comments (schedule.task_tiling; the slots depend on the device).
CASES = [
    ((8, 128, 32, 32), 32, torch.float16, 4, 3),  # 4 chunks, 2 spare; 8 tasks over 3 teams: rounds 3, 3, 2
    ((8, 128, 32, 32), 32, torch.float16, 3, 2),  # 5, 5, 6 chunks: none spare for the third member
    ((8, 128, 32, 32), 32, torch.bfloat16, 16, 1),  # 1 chunk, 5 spare: reads up to 5 rounds ahead
    ((64, 128, 64, 64), 32, torch.bfloat16, 16, 4),  # tiles of 2 chunks, 4 per member, 16 rounds
    ((8, 128, 32, 32), 32, torch.float32, 5, 3),  # 2 windows per sample; 3 or 4 chunks per member
    ((6, 96, 20, 20), 8, torch.float16, 2, 2),  # partial chunks; 3 and 2 chunks
    ((4, 640, 4, 8, 8), 32, torch.float16, 1, 3),  # 3-D, 4 windows per sample; 6 chunks, none spare
    ((16, 256, 16, 16), 32, torch.float16, 2, 5),  # 2 chunks, 4 spare, rounds 7 and 6
]


def case_id(value: object) -> str:
    """ "8x128x32x32", "fp16", or the number."""
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    return {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}.get(value, str(value))


@pytest.fixture(autouse=True)
def _task_kernels(monkeypatch):
    monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd")
    monkeypatch.delenv(ops.ENV_STAGGER, raising=False)
    # the cases' tilings (the chunk counts above) are the plain ones; tests/gpu/test_small_forward.py
    # runs the small forward's geometry (schedule.small_forward_tiling)
    monkeypatch.setattr(schedule, "SMALL_FORWARD_GEOMETRY", False)
    ops._launches.clear()
    with ops.poison_outputs():
        yield
    ops._launches.clear()


def streamed_plan(x: torch.Tensor, groups: int, m: int, teams: int, wide=None) -> schedule.TaskPlan:
    """The one-launch plan of teams of m under a cap of m x teams; skips where this device's slots do not
    hold every member's chunks, and fails where the plan is not one of several rounds (a vacuous case)."""
    aligned = x.data_ptr() % schedule.VEC_BYTES == 0  # (as the launcher decides: y is new, so aligned)
    p = ops.plan(x.shape, groups, x.dtype, "fwd", 1, aligned=aligned, wide=wide)
    assert isinstance(p, schedule.TaskPlan) and p.schedule == 1 and p.teams is not None
    tm = p.teams
    assert (tm.team_size, tm.teams) == (m, teams) and tm.rounds >= 2, tm
    if tm.chunks_per_member > p.slots:
        pytest.skip(f"this GPU's {p.slots} slots do not hold a member's {tm.chunks_per_member} chunks")
    return p


def forward(x, w, b, groups, act, passes, wide=None):
    with torch.no_grad():
        return ops.forward(x, w, b, groups, 1e-5, _abi.ACT_CODES[act], passes, wide=wide)


def check_rounds(x, w, b, groups, m, teams, act, wide=None):
    """The one launch of teams of m (several rounds, nothing re-read) against fp64 and the two launches."""
    ops._launches.clear()  # (launches are cached by call signature, which the forced teams are not part of)
    with pytest.MonkeyPatch.context() as mp, ops.max_resident_blocks(m * teams):
        mp.setattr(schedule, "choose_teams", forced_teams(m))
        p = streamed_plan(x, groups, m, teams, wide)
        with ops.team_stagger(0), ops.launch_record() as rec:
            got = forward(x, w, b, groups, act, 1, wide)
        r = rec["fwd"]
        assert r["plan"] == p and r["schedule"] == 1 and r["grid"] == p.grid == m * teams
        assert r["tiles_phase1"] == r["tiles_applied"] == p.tiles
        assert r["chunks_reread"] == 0 == schedule.task_reread_chunks(p)
        with ops.team_stagger(20000, 2):  # (teams that start late: other rounds overlap)
            staggered = forward(x, w, b, groups, act, 1, wide)
    ops._launches.clear()
    two = forward(x, w, b, groups, act, 2, wide)
    ref = reference.forward(x, groups, w, b, 1e-5, act)
    reference.compare(got[0], ref, x.dtype if wide is None else wide, "y")
    for name, a, s, t in zip(("y", "mean", "rstd"), got, staggered, two, strict=True):
        assert torch.equal(a, t), f"{name} differs from the two launches"
        assert torch.equal(a, s), f"{name} differs staggered"
    return got


@pytest.mark.parametrize("act", [None, "silu"])
@pytest.mark.parametrize(("shape", "groups", "dtype", "m", "teams"), CASES, ids=case_id)
def test_rounds_kept_on_chip(shape, groups, dtype, m, teams, act):
    x, w, b, _ = make_case(shape, groups, dtype, mean=3.0)
    check_rounds(x, w, b, groups, m, teams, act)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=case_id)
def test_wide_rounds_kept_on_chip(dtype):
    x, w, b, _ = make_case((8, 128, 32, 32), 32, dtype, torch.float32, mean=3.0)
    check_rounds(x, w, b, 32, 4, 3, "silu", wide=torch.float32)


def test_scalar_path_rounds_kept_on_chip():
    base = torch.randn(1 + 8 * 64 * 24 * 24, device="cuda", dtype=torch.float16)
    x = base[1:].view(8, 24, 24, 64).permute(0, 3, 1, 2)  # channels-last, 2-byte aligned: vec 1
    assert x.data_ptr() % 16 != 0
    w = (1 + 0.5 * torch.randn(64, device="cuda")).half()
    b = (0.5 * torch.randn(64, device="cuda")).half()
    assert ops.plan(x.shape, 8, x.dtype, "fwd", 1, aligned=False).tiling.vec == 1
    check_rounds(x, w, b, 8, 2, 3, "silu")


def test_a_team_whose_larger_members_overflow_runs_in_lockstep():
    """Members of one team differ by a tile: here 6 and 7 chunks of a task against 6 slots, so the 7-chunk
    member re-reads one chunk per task. Under every build the team runs one protocol (csrc fwd_task_onepass,
    team_chunks: here the lockstep rounds); when session 42's rule let the 6-chunk member stream, a
    -DGN_EXP_STREAMED_PUBLISH=1 build's streamed member read mean/rstd at the flag that the lockstep last
    member raises before storing them (poisoned here). The record counts the same re-reads either way."""
    x, w, b, _ = make_case((4, 128, 26, 32), 32, torch.float16, mean=3.0)
    ops._launches.clear()
    with pytest.MonkeyPatch.context() as mp, ops.max_resident_blocks(4):
        mp.setattr(schedule, "choose_teams", forced_teams(2))
        p = ops.plan(x.shape, 32, x.dtype, "fwd", 1)
        assert isinstance(p, schedule.TaskPlan) and p.teams is not None and p.teams.rounds == 2
        chunks = schedule.task_member_chunks(p.tiling, 2)
        if not min(chunks) <= p.slots < max(chunks):
            pytest.skip(f"this GPU's {p.slots} slots do not split a team of {chunks} chunks per member")
        with ops.team_stagger(0), ops.launch_record() as rec:
            got = forward(x, w, b, 32, "silu", 1)
        r = rec["fwd"]
        assert r["tiles_phase1"] == r["tiles_applied"] == p.tiles
        assert r["chunks_reread"] == schedule.task_reread_chunks(p) > 0
    ops._launches.clear()
    two = forward(x, w, b, 32, "silu", 2)
    reference.compare(got[0], reference.forward(x, 32, w, b, 1e-5, "silu"), x.dtype, "y")
    for name, a, t in zip(("y", "mean", "rstd"), got, two, strict=True):
        assert torch.equal(a, t), f"{name} differs from the two launches"


def test_team_sizes_agree():
    """Teams of other sizes (other chunks per member, other rounds, other spare slots) give the same bits."""
    x, w, b, _ = make_case((8, 128, 32, 32), 32, torch.float16, mean=3.0)
    runs = [check_rounds(x, w, b, 32, m, teams, "silu") for m, teams in ((4, 2), (8, 1), (16, 1))]
    for other in runs[1:]:
        assert all(torch.equal(a, c) for a, c in zip(runs[0], other, strict=True))
