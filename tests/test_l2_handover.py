"""The two launches' L2 hand-over without a GPU (ops.l2_handover, GN_L2_HANDOVER): how many chunks per block
a plan keeps in L2 (schedule.TaskPlan.l2_kept_chunks) and when a launch asks for them
(GnArgs.l2_kept_chunks). The bits with and without it are compared on a GPU in
tests/gpu/test_l2_handover.py."""

from __future__ import annotations

import pytest
import torch
from arch_stub import ArchStub, host_overhead

from gn_module import _abi, ops, schedule


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ops.ENV_CAP, ops.ENV_ARCH, ops.ENV_L2_HANDOVER):
        monkeypatch.delenv(name, raising=False)


def plan(shape, direction="fwd", schedule_=2, residency=264, cap=None, groups=32, itemsize=2, wide=0):
    n, c = shape[0], shape[1]
    rows = 1
    for v in shape[2:]:
        rows *= v
    t = schedule.task_tiling(c, groups, rows, itemsize, direction, batch=n, wide_itemsize=wide)
    return schedule.make_task_plan(t, schedule_, 3, residency, cap=cap)


def kept_bytes(p: schedule.TaskPlan) -> int:
    t = p.tiling
    per_element = t.itemsize + ((t.wide_itemsize or t.itemsize) if t.direction == "bwd" else 0)
    return p.grid * p.l2_kept_chunks * t.chunk_rows * t.window * per_element


SHAPES = [(1, 128, 1024, 2048), (1, 512, 256, 256), (32, 128, 256, 256), (2, 320, 64, 64), (2, 1280, 16, 16)]


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("shape", SHAPES)
def test_within_the_budget_and_a_members_chunks(direction, shape):
    p = plan(shape, direction)
    most = max(schedule.task_member_chunks(p.tiling, p.teams.team_size))
    assert 1 <= p.l2_kept_chunks <= most
    assert kept_bytes(p) <= schedule.L2_KEPT_BYTES
    if p.l2_kept_chunks < most:  # one chunk more per block would pass the budget
        assert kept_bytes(p) // p.l2_kept_chunks * (p.l2_kept_chunks + 1) > schedule.L2_KEPT_BYTES


def test_the_numbers_of_the_benchmark_shapes():
    # 512 MiB, one task of 256 members: 6 chunks of 16 KiB each (24 MiB); the backward holds x and dy: 3
    assert plan((1, 128, 1024, 2048), groups=16).l2_kept_chunks == 6
    assert plan((1, 128, 1024, 2048), "bwd", groups=16).l2_kept_chunks == 3
    # small tensors: every chunk of a member (2x640x32x32: one each)
    assert plan((2, 640, 32, 32)).l2_kept_chunks == 1
    # a float32 dy (the wide backward: chunks of half the rows) counts three times x's bytes per element
    wide = plan((1, 512, 256, 256), "bwd", wide=4)
    assert wide.tiling.wide_itemsize == 4 and 0 < kept_bytes(wide) <= schedule.L2_KEPT_BYTES


def test_none_for_the_one_launch_and_a_smaller_grid_keeps_more():
    assert plan((1, 512, 256, 256), schedule_=1).l2_kept_chunks == 0
    assert plan((1, 512, 256, 256), cap=64).l2_kept_chunks > plan((1, 512, 256, 256)).l2_kept_chunks


def asked(direction="fwd", passes=2, shape=(1, 512, 64, 64)) -> int:
    x = torch.randn(shape).half().contiguous(memory_format=torch.channels_last)
    with host_overhead.cpu_device(ArchStub(900)):
        launch = ops._launch(direction, x, x.get_device(), True, 32, 1e-5, 1, passes, None)
    return _abi.GnArgs.from_buffer_copy(launch.args).l2_kept_chunks


def test_off_unless_turned_on(monkeypatch: pytest.MonkeyPatch):
    assert not ops.l2_handover_enabled() and asked() == 0 and asked("bwd") == 0
    with ops.l2_handover():
        assert asked() > 0 and asked("bwd") > 0
        with ops.l2_handover(False):
            assert asked() == 0
    monkeypatch.setenv(ops.ENV_L2_HANDOVER, "1")
    assert ops.l2_handover_enabled() and asked() > 0
    monkeypatch.setenv(ops.ENV_L2_HANDOVER, "0")
    assert asked() == 0


def test_the_field_is_in_the_abi():
    assert _abi.GnArgs.l2_kept_chunks.offset == _abi.GnArgs.strip_blocks.offset + 4
