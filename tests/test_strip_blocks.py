"""The backward's strip blocks without a GPU (on by default; ops.strip_blocks, GN_STRIP_BLOCKS=0): which
plans give the two-launch backward's apply launch blocks of their own for the dweight/dbias strips
(schedule.TaskPlan.strip_blocks), and when a launch asks for them (GnArgs.strip_blocks). The bits with and
without them are compared on a GPU in tests/gpu/test_strip_blocks.py."""

from __future__ import annotations

import pytest
import torch
from arch_stub import ArchStub, host_overhead

from gn_module import _abi, ops, schedule

SMALL = (2, 1280, 16, 16)  # 16 tasks of 6 members (96 blocks), 5 strips each: 176 blocks fit in 264


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ops.ENV_CAP, ops.ENV_ARCH, ops.ENV_STRIP_BLOCKS, ops.ENV_STRIP_ROOM):
        monkeypatch.delenv(name, raising=False)


def plan(shape, direction="bwd", schedule_=2, residency=264, cap=None, itemsize=2) -> schedule.TaskPlan:
    """The plan without room for strips (schedule.room_for_strips), as GN_STRIP_ROOM=0 launches it."""
    n, c, rows = shape[0], shape[1], shape[2] * shape[3]
    t = schedule.task_tiling(c, 32, rows, itemsize, direction, batch=n)
    return schedule.make_task_plan(t, schedule_, 3, residency, cap=cap, strip_room=False)


def strip_blocks_asked(shape=SMALL, direction="bwd", passes=2, cap: int | None = None) -> int:
    x = torch.randn(shape).half().contiguous(memory_format=torch.channels_last)
    with host_overhead.cpu_device(ArchStub(900)):
        if cap is None:
            launch = ops._launch(direction, x, x.get_device(), True, 32, 1e-5, 1, passes, None)
        else:
            with ops.max_resident_blocks(cap):
                launch = ops._launch(direction, x, x.get_device(), True, 32, 1e-5, 1, passes, None)
    return _abi.GnArgs.from_buffer_copy(launch.args).strip_blocks


def test_strips_of_a_plan() -> None:
    p = plan(SMALL)
    assert p.tiling.window == 160 and p.tiling.tasks == 16
    assert p.param_strips == 16 * 5  # ceil(160 / 32) strips per task
    assert p.grid == 96 and p.strip_blocks == 80  # 96 + 80 <= 264
    assert plan(SMALL, direction="fwd").strip_blocks == 0  # the forward has no strips
    assert plan(SMALL, schedule_=1).strip_blocks == 0  # the one launch sums its strips itself


def test_only_where_they_fit_beside_the_grid() -> None:
    big = plan((32, 128, 256, 256))  # 256 blocks, 32 tasks x 4 strips: 384 > 264
    assert big.grid == 256 and big.param_strips == 128 and big.strip_blocks == 0
    one = plan((1, 128, 1024, 2048))  # one task of 4 strips beside 256 blocks
    assert one.grid + one.param_strips <= 264 and one.strip_blocks == 4
    assert plan(SMALL, cap=100).strip_blocks == 0  # 96 + 80 > the cap's 100 resident blocks
    assert plan(SMALL, cap=176).strip_blocks == 80  # exactly one wave
    assert plan(SMALL, cap=175).strip_blocks == 0
    assert plan(SMALL, residency=150).strip_blocks == 0


def test_on_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ops.strip_blocks_enabled() and strip_blocks_asked() == 80
    with ops.strip_blocks(False):
        assert strip_blocks_asked() == 0
        with ops.strip_blocks():
            assert strip_blocks_asked() == 80
    monkeypatch.setenv(ops.ENV_STRIP_BLOCKS, "0")
    assert not ops.strip_blocks_enabled() and strip_blocks_asked() == 0
    monkeypatch.setenv(ops.ENV_STRIP_BLOCKS, "1")
    assert strip_blocks_asked() == 80


def test_only_the_two_launch_backward_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    with ops.strip_blocks():
        assert strip_blocks_asked(direction="fwd") == 0
        assert strip_blocks_asked(passes=1) == 80  # passes=1 runs the two launches under the default arch
        assert strip_blocks_asked(cap=100) == 0
        assert strip_blocks_asked(cap=200) == 80
        monkeypatch.setenv(ops.ENV_ARCH, "tasks+bwd1")  # where passes=1 is the one-launch backward
        assert strip_blocks_asked(passes=1) == 0


def test_the_field_is_in_the_abi() -> None:
    assert _abi.GnArgs.strip_blocks.offset == _abi.GnArgs.stagger_phases.offset + 4


def test_room_for_strips_only_at_no_cost() -> None:
    mid = (2, 320, 64, 64)  # 4 tasks of 86 tiles: 66 members hold 2 tiles each, so do 61
    p = plan(mid)
    assert p.grid == 264 and p.param_strips == 20 and p.strip_blocks == 0
    n, c, rows = mid[0], mid[1], mid[2] * mid[3]
    t = schedule.task_tiling(c, 32, rows, 2, "bwd", batch=n)
    roomy = schedule.make_task_plan(t, 2, 3, 264, strip_room=True)
    assert roomy.teams.team_size == 61 and roomy.grid == 244 and roomy.strip_blocks == 20
    assert schedule.busiest_block(roomy.teams) == schedule.busiest_block(p.teams)
    # 1x512x128x128: 64 members hold one tile each; 62 would hold two: no room taken
    t = schedule.task_tiling(512, 32, 128 * 128, 2, "bwd", batch=1)
    assert schedule.make_task_plan(t, 2, 3, 264, strip_room=True).grid == 256
    # already room (2x1280x16x16), the forward, the one launch: unchanged
    t = schedule.task_tiling(1280, 32, 256, 2, "bwd", batch=2)
    assert schedule.make_task_plan(t, 2, 3, 264, strip_room=True).grid == 96
    t = schedule.task_tiling(320, 32, rows, 2, "fwd", batch=n)
    assert (
        schedule.make_task_plan(t, 2, 3, 264, strip_room=True).grid
        == schedule.make_task_plan(t, 2, 3, 264).grid
    )


def test_room_is_on_unless_turned_off_and_needs_strip_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    mid = (2, 320, 64, 64)
    assert ops.strip_room_enabled() and strip_blocks_asked(mid) == 20
    with ops.strip_room(False):
        assert not ops.strip_room_enabled() and strip_blocks_asked(mid) == 0
        with ops.strip_room():
            assert strip_blocks_asked(mid) == 20
    with ops.strip_blocks(False):
        assert not ops.strip_room_enabled() and strip_blocks_asked(mid) == 0
    monkeypatch.setenv(ops.ENV_STRIP_ROOM, "0")
    assert not ops.strip_room_enabled() and strip_blocks_asked(mid) == 0
    monkeypatch.setenv(ops.ENV_STRIP_ROOM, "1")
    assert strip_blocks_asked(mid) == 20
    assert schedule.make_task_plan(plan(mid).tiling, 2, 3, 264, strip_room=True).grid == 244
