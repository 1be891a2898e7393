"""Cluster teams (on by default where the build runs sm_90 code) without a GPU: which plans may run their
one-launch forward's teams as thread-block clusters (schedule.cluster_teams_fit), and when a launch asks
for it (GnArgs.cluster_teams).

The stub library (scripts/host_overhead.py, an H200-like device) records launches and reports the build's
__CUDA_ARCH__: clusters are sm_90 code, so a compute_80 PTX build never asks. The bits with and without
clusters are compared on a GPU in tests/gpu/test_cluster_teams.py.
"""

from __future__ import annotations

import pytest
import torch
from arch_stub import ArchStub, host_overhead

from gn_module import _abi, ops, schedule

SMALL = (2, 1280, 16, 16)  # 16 tasks of 6 members on 264 blocks: one round


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ops.ENV_CAP, ops.ENV_ARCH, ops.ENV_DEPENDENT, ops.ENV_CLUSTER):
        monkeypatch.delenv(name, raising=False)


def launch(shape=SMALL, passes=1, cuda_arch=900, direction="fwd", cap: int | None = None) -> ops._Launch:
    x = torch.randn(shape).half().contiguous(memory_format=torch.channels_last)
    with host_overhead.cpu_device(ArchStub(cuda_arch)):
        if cap is None:
            return ops._launch(direction, x, x.get_device(), True, 32, 1e-5, 0, passes, None)
        with ops.max_resident_blocks(cap):
            return ops._launch(direction, x, x.get_device(), True, 32, 1e-5, 0, passes, None)


def flag(*args, **kwargs) -> int:
    return _abi.GnArgs.from_buffer_copy(launch(*args, **kwargs).args).cluster_teams


def test_plans_that_fit() -> None:
    t = schedule.task_tiling(1280, 32, 256, 2, "fwd", batch=2)
    one = schedule.make_task_plan(t, 1, 6, 264)
    assert (one.teams.team_size, one.teams.teams, one.teams.rounds) == (6, 16, 1)
    assert schedule.cluster_teams_fit(one)
    assert not schedule.cluster_teams_fit(schedule.make_task_plan(t, 2, 6, 264))  # two launches
    several_rounds = schedule.make_task_plan(t, 1, 6, 264, cap=12)
    assert several_rounds.teams.rounds > 1 and not schedule.cluster_teams_fit(several_rounds)
    big = schedule.make_task_plan(schedule.task_tiling(320, 32, 96 * 96, 2, "fwd", batch=2), 1, 6, 264)
    assert big.teams.team_size > schedule.CLUSTER_MAX_TEAM and not schedule.cluster_teams_fit(big)
    # 2x320x64x64 takes the small forward's geometry: 16 tasks of 6 tiles, one cluster each
    small = schedule.make_task_plan(schedule.task_tiling(320, 32, 64 * 64, 2, "fwd", batch=2), 1, 6, 264)
    assert (small.teams.team_size, small.teams.teams) == (6, 16) and schedule.cluster_teams_fit(small)
    bwd = schedule.make_task_plan(schedule.task_tiling(1280, 32, 256, 2, "bwd", batch=2), 1, 3, 264)
    assert not schedule.cluster_teams_fit(bwd)


def test_on_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ops.ENV_CLUSTER, raising=False)
    assert flag() == 1
    with ops.cluster_teams(False):
        assert flag() == 0
        with ops.cluster_teams():
            assert flag() == 1
    monkeypatch.setenv(ops.ENV_CLUSTER, "1")
    assert ops.cluster_teams_enabled() and flag() == 1
    monkeypatch.setenv(ops.ENV_CLUSTER, "0")
    assert not ops.cluster_teams_enabled() and flag() == 0


def test_only_plans_that_fit_ask_for_it() -> None:
    with ops.cluster_teams():
        assert flag(passes=2) == 0  # the two-launch forward
        assert flag(direction="bwd", passes=2) == 0
        assert flag((2, 320, 96, 96)) == 0  # teams of 64
        assert flag((2, 320, 64, 64)) == 1  # the small forward's teams of 6
        assert flag(cap=12) == 0  # several rounds per team
        assert flag(cap=96) == 1  # one round still: the same plan as uncapped


@pytest.mark.parametrize("cuda_arch", [800, 860, 890])
def test_never_for_code_below_sm90(cuda_arch: int) -> None:
    with ops.cluster_teams():
        assert flag(cuda_arch=cuda_arch) == 0


def test_the_setting_is_part_of_the_cached_launch() -> None:
    x = torch.randn(SMALL).half().contiguous(memory_format=torch.channels_last)
    with host_overhead.cpu_device(ArchStub(900)):
        clustered = ops._launch("fwd", x, x.get_device(), True, 32, 1e-5, 0, 1, None)
        with ops.cluster_teams(False):
            plain = ops._launch("fwd", x, x.get_device(), True, 32, 1e-5, 0, 1, None)
        assert ops._launch("fwd", x, x.get_device(), True, 32, 1e-5, 0, 1, None) is clustered
    assert clustered is not plain and clustered.plan == plain.plan


def test_only_a_bool_turns_it_on() -> None:
    with pytest.raises(TypeError, match="bool"), ops.cluster_teams("yes"):  # type: ignore[arg-type]
        pass
