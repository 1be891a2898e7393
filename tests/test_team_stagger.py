"""The one-launch kernels' team stagger ("auto" by default; ops.team_stagger / GN_TEAM_STAGGER) without a
GPU: which plans take it (schedule.team_stagger), how it is asked for, and that a launch carries it
(GnArgs.stagger_ns, stagger_phases). Its bits and its delay are checked on a GPU in
tests/gpu/test_team_stagger.py."""

from __future__ import annotations

import pytest
import torch
from arch_stub import ArchStub, host_overhead

from gn_module import _abi, ops, schedule

LARGE = (32, 128, 256, 256)  # one launch: 4 teams of 64 for 8 rounds on an H200


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ops.ENV_CAP, ops.ENV_ARCH, ops.ENV_STAGGER):
        monkeypatch.delenv(name, raising=False)


def fields(shape=LARGE, passes=1, direction="fwd") -> tuple[int, int]:
    x = torch.empty(shape, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    with host_overhead.cpu_device(ArchStub(900)):
        launch = ops._launch(direction, x, x.get_device(), True, 32, 1e-5, 0, passes, None)
    a = _abi.GnArgs.from_buffer_copy(launch.args)
    return a.stagger_ns, a.stagger_phases


def test_only_plans_of_several_teams_and_rounds() -> None:
    t = schedule.task_tiling(128, 32, 256 * 256, 2, "fwd", batch=32)
    one = schedule.make_task_plan(t, 1, 6, 264)
    assert one.teams.teams > 1 and one.teams.rounds > 1
    assert schedule.team_stagger(one, 16000) == (16000, 2)
    assert schedule.team_stagger(one, 16000, 4) == (16000, 4)
    assert schedule.team_stagger(one, 0) == (0, 0)  # off
    assert schedule.team_stagger(one, 16000, 1) == (0, 0)  # one phase: nobody is late
    assert schedule.team_stagger(schedule.make_task_plan(t, 2, 6, 264), 16000) == (0, 0)  # two launches
    small = schedule.make_task_plan(schedule.task_tiling(1280, 32, 256, 2, "fwd", batch=2), 1, 6, 264)
    assert small.teams.rounds == 1 and schedule.team_stagger(small, 16000) == (0, 0)
    capped = schedule.task_tiling(128, 32, 128 * 128, 2, "fwd", batch=8)
    single = schedule.make_task_plan(capped, 1, 6, 264, 32)
    assert single.teams.teams == 1 and schedule.team_stagger(single, 16000) == (0, 0)
    bwd = schedule.make_task_plan(schedule.task_tiling(128, 32, 256 * 256, 2, "bwd", batch=32), 1, 3, 264)
    assert bwd.teams.teams > 1 and bwd.teams.rounds > 1
    assert schedule.team_stagger(bwd, 16000) == (16000, 2)  # the one-launch backward's teams take turns too
    assert schedule.team_stagger(schedule.make_task_plan(bwd.tiling, 2, 3, 264), 16000) == (0, 0)
    assert schedule.team_stagger(one, 2**40) == (2**31 - 1, 2)  # (an int32 field)


@pytest.mark.parametrize(("ns", "phases"), [(-1, 2), (5, 0), (1.5, 2)])
def test_schedule_rejects_bad_values(ns, phases) -> None:
    t = schedule.task_tiling(128, 32, 256 * 256, 2, "fwd", batch=32)
    with pytest.raises(ValueError, match="stagger"):
        schedule.team_stagger(schedule.make_task_plan(t, 1, 6, 264), ns, phases)


def test_auto_unless_asked_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    default = fields()
    assert ops.team_stagger_setting() == ("auto", 2) and default[0] > 0 and default[1] == 2
    with ops.team_stagger("auto"):
        assert fields() == default
    for off in ("0", "off", "0:4"):
        monkeypatch.setenv(ops.ENV_STAGGER, off)
        assert ops.team_stagger_setting()[0] == 0 and fields() == (0, 0)
    monkeypatch.delenv(ops.ENV_STAGGER)
    with ops.team_stagger(16000):
        assert fields() == (16000, 2)
        assert fields(passes=2) == (0, 0)
        assert fields((2, 1280, 16, 16)) == (0, 0)  # one round
        assert fields(direction="bwd") == (0, 0)
        with ops.team_stagger(8000, 3):
            assert fields() == (8000, 3)
        with ops.team_stagger(0):
            assert fields() == (0, 0)
    monkeypatch.setenv(ops.ENV_STAGGER, "12000")
    assert ops.team_stagger_setting() == (12000, 2) and fields() == (12000, 2)
    monkeypatch.setenv(ops.ENV_STAGGER, "12000:4")
    assert fields() == (12000, 4)
    with ops.team_stagger(0):  # the block wins over the environment
        assert fields() == (0, 0)


@pytest.mark.parametrize("raw", ["fast", "10:x", "-5", "10:0", "1e4"])
def test_a_bad_environment_value_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(ops.ENV_STAGGER, raw)
    with pytest.raises(ValueError, match=ops.ENV_STAGGER):
        ops.team_stagger_setting()


def test_the_setting_is_part_of_the_cached_launch() -> None:
    x = torch.empty(LARGE, dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    with host_overhead.cpu_device(ArchStub(900)):
        plain = ops._launch("fwd", x, x.get_device(), True, 32, 1e-5, 0, 1, None)
        with ops.team_stagger(16000):
            staggered = ops._launch("fwd", x, x.get_device(), True, 32, 1e-5, 0, 1, None)
        assert ops._launch("fwd", x, x.get_device(), True, 32, 1e-5, 0, 1, None) is plain
    assert staggered is not plain and staggered.plan == plain.plan


@pytest.mark.parametrize(
    ("ns", "phases", "error"),
    [(True, 2, TypeError), (1.0, 2, TypeError), (-1, 2, ValueError), (10, 0, ValueError)],
)
def test_the_block_checks_its_arguments(ns, phases, error) -> None:
    with pytest.raises(error), ops.team_stagger(ns, phases):
        pass


def test_auto_takes_the_one_launch_where_the_teams_fit() -> None:
    fits = schedule.task_tiling(128, 32, 256 * 256, 2, "fwd", batch=32)  # 4 teams x 8 rounds, re-reads
    on_chip = schedule.task_tiling(512, 32, 128 * 128, 2, "fwd", batch=8)  # 4 x 8, keeps every chunk
    two_teams = schedule.task_tiling(128, 32, 256 * 256, 2, "fwd", batch=16)  # 2 teams of 128
    few_rereads = schedule.task_tiling(256, 32, 128 * 256, 2, "fwd", batch=16)  # 4 teams re-reading 2 chunks
    assert schedule.stagger_fits(schedule.choose_teams(fits, 264, 6))
    assert schedule.choose_task_schedule(fits, 264, 6) == 2
    assert schedule.choose_task_schedule(fits, 264, 6, staggered=True) == 1
    for t in (on_chip, two_teams, few_rereads):
        assert not schedule.stagger_fits(schedule.choose_teams(t, 264, 6))
        assert schedule.choose_task_schedule(t, 264, 6, staggered=True) == 2
    bwd = schedule.task_tiling(128, 32, 256 * 256, 2, "bwd", batch=32)
    assert schedule.choose_task_schedule(bwd, 264, 3, backward_onepass=True, staggered=True) == 2
    p = schedule.make_task_plan(fits, 1, 6, 264)
    ns, phases = schedule.team_stagger(p, "auto")
    # a third of a round: 4 teams x 64 members x (2 x 16 + 10) chunks of 16 KiB at 4.25 TB/s
    assert phases == 2 and ns == round(4 * 64 * 42 * 16384 / 4250 / 3) == schedule.auto_stagger_ns(p)
    assert schedule.team_stagger(schedule.make_task_plan(on_chip, 1, 6, 264), "auto") == (0, 0)
    # the backward's round moves x and dy in, dx out, and re-reads x and dy of its overflow chunks
    wide_bwd = schedule.task_tiling(128, 32, 128 * 128, 2, "bwd", batch=64)
    q = schedule.make_task_plan(wide_bwd, 1, 3, 264)
    tm = q.teams
    assert tm.teams == 4 and tm.rounds == 16 and tm.overflow_chunks > 0
    traffic = 3 * tm.chunks_per_member + 2 * tm.overflow_chunks
    assert schedule.auto_stagger_ns(q) == round(
        tm.teams * tm.team_size * traffic * wide_bwd.chunk_bytes / schedule.STAGGER_COPY_BYTES_PER_NS / 3
    )


def test_auto_in_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.empty(LARGE, dtype=torch.float16).contiguous(memory_format=torch.channels_last)

    def auto_launch() -> ops._Launch:
        with host_overhead.cpu_device(ArchStub(900)):
            return ops._launch("fwd", x, x.get_device(), True, 32, 1e-5, 0, 0, None)

    with ops.team_stagger(0):
        assert auto_launch().plan.schedule == 2  # off: two launches
    launch = auto_launch()  # (the default)
    a = _abi.GnArgs.from_buffer_copy(launch.args)
    assert launch.plan.schedule == 1 and (a.stagger_ns, a.stagger_phases) == (
        schedule.auto_stagger_ns(launch.plan),
        2,
    )
    monkeypatch.setenv(ops.ENV_STAGGER, "auto:3")
    assert ops.team_stagger_setting() == ("auto", 3)
    a = _abi.GnArgs.from_buffer_copy(auto_launch().args)
    assert a.stagger_phases == 3 and a.stagger_ns > 0


def test_the_backward_takes_its_staggered_one_launch_where_the_teams_fit() -> None:
    # H200 teams (264 blocks, 3 chunk pairs): 128x128x128x128 runs 8 teams of 32 for 16 rounds, each
    # member re-reading 5 of its 8 chunk pairs; 64x128x128x128 4 teams re-reading 1; 32x128x256x256 2 teams
    fits, few, two = (
        schedule.task_tiling(128, 32, hw, 2, "bwd", batch=n)
        for n, hw in ((128, 128 * 128), (64, 128 * 128), (32, 256 * 256))
    )
    assert schedule.choose_task_schedule(fits, 264, 3) == 2
    assert schedule.choose_task_schedule(fits, 264, 3, staggered=True) == 1  # without GN_ARCH=tasks+bwd1
    short = schedule.task_tiling(256, 32, 64 * 64, 2, "bwd", batch=128)  # 16 teams of 16, 4 pairs each
    short_teams = schedule.choose_teams(short, 264, 3)
    assert short_teams.chunks_per_member < schedule.STAGGER_MIN_BWD_CHUNKS
    assert schedule.stagger_fits(short_teams, "fwd") and not schedule.stagger_fits(short_teams, "bwd")
    assert schedule.choose_task_schedule(short, 264, 3, staggered=True) == 2
    for t in (few, two):
        assert not schedule.stagger_fits(schedule.choose_teams(t, 264, 3), "bwd")
        assert schedule.choose_task_schedule(t, 264, 3, staggered=True) == 2
        assert schedule.choose_task_schedule(t, 264, 3, backward_onepass=True, staggered=True) == 2


def test_the_backward_launch_under_the_default_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    shape = (128, 128, 128, 128)
    x = torch.empty(shape, dtype=torch.float16).contiguous(memory_format=torch.channels_last)

    def launch(passes: int) -> ops._Launch:
        with host_overhead.cpu_device(ArchStub(900)):
            return ops._launch("bwd", x, x.get_device(), True, 32, 1e-5, 0, passes, None)

    auto = launch(0)
    a = _abi.GnArgs.from_buffer_copy(auto.args)
    assert auto.plan.schedule == 1 and a.schedule == 1
    assert (a.stagger_ns, a.stagger_phases) == (schedule.auto_stagger_ns(auto.plan), 2)
    assert launch(1).plan.schedule == 2  # passes=1 under tasks+bwd: the two launches, as before
    with ops.team_stagger(0):
        # unstaggered, L2 still keeps 2 of each member's 5 overflow pairs (3 of 8 from DRAM again:
        # schedule.l2_backward_one_launch); without that rule, the two launches
        assert launch(0).plan.schedule == 1
        monkeypatch.setattr(schedule, "L2_BACKWARD_ONE_LAUNCH", False)
        assert launch(0).plan.schedule == 2


def test_two_backward_teams_take_turns_at_half_a_round() -> None:
    """32x128x256x256's backward one launch (the L2 rule's, 2 x 128 for 16 rounds, 8 pairs a member, 5 of
    them re-read): staggered by half a round, 16.8 us (the H200's best measured was 16 us). Only a stagger:
    it does not choose the one launch, and two forward teams take none."""
    bwd = schedule.task_tiling(128, 32, 256 * 256, 2, "bwd", batch=32)
    p = schedule.make_task_plan(bwd, 1, 3, 264)
    tm = p.teams
    assert (tm.teams, tm.team_size, tm.rounds, tm.chunks_per_member, tm.overflow_chunks) == (2, 128, 16, 8, 5)
    assert schedule.backward_pair_stagger(tm, "bwd") and not schedule.stagger_fits(tm, "bwd")
    round_bytes = 2 * 128 * (3 * 8 + 2 * 5) * bwd.chunk_bytes
    ns = round(round_bytes / 2 / schedule.STAGGER_COPY_BYTES_PER_NS)
    assert schedule.team_stagger(p, "auto") == (ns, 2) and 16_000 < ns < 17_500
    assert schedule.choose_task_schedule(bwd, 264, 3, staggered=True) == 2  # (no L2 budget: two launches)
    fwd = schedule.task_tiling(128, 32, 256 * 256, 2, "fwd", batch=16)  # 2 teams of 128
    q = schedule.make_task_plan(fwd, 1, 6, 264)
    assert q.teams.teams == 2 and schedule.team_stagger(q, "auto") == (0, 0)
    half = schedule.task_tiling(128, 32, 256 * 256, 2, "bwd", batch=16)
    one_team = schedule.make_task_plan(half, 1, 3, 264)
    assert one_team.teams.teams == 1 and schedule.team_stagger(one_team, "auto") == (0, 0)
