"""The L2 hints' budget without a GPU (csrc l2_hints, schedule.l2_keep_bytes): how much of the device's L2 a
one launch asks to keep for the overflow chunks its apply re-reads, how many of a member's chunks that is, and
that every task launch carries it (GnArgs.l2_keep_bytes) while the tile kernels' launches do not. The hints
change no bit: a GPU compares the outputs with and without them (scripts/fused_apply_check.sh, bits)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from arch_stub import ArchStub, host_overhead

from gn_module import _abi, ops, profiles, schedule

H200_L2 = host_overhead.H200_L2_BYTES  # what host_overhead.cpu_device reports


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (ops.ENV_CAP, ops.ENV_ARCH):
        monkeypatch.delenv(name, raising=False)


def test_keep_a_share_of_the_device_l2() -> None:
    assert schedule.l2_keep_bytes(H200_L2) == int(H200_L2 * schedule.L2_KEEP_SHARE)
    # the H200's measured safe size (x1.79 at 24 MiB with writes in between, x1.15 at 32 MiB)
    assert 20 * 2**20 <= schedule.l2_keep_bytes(H200_L2) <= 28 * 2**20
    assert schedule.l2_keep_bytes(0) == 0  # torch does not know the L2: no hints
    assert schedule.l2_keep_bytes(4 * 2**20) < 2 * 2**20  # Orin's 4 MB


@pytest.mark.parametrize(
    "blocks, chunk_bytes, reread, kept",
    [
        (256, 16 << 10, 10, 6),  # 32x128x256x256 fwd, one launch: 6 of its 10 overflow chunks
        (256, 16 << 10, 58, 6),  # 1x128x1024x1024 fwd forced into one launch: 6 of 58
        (256, 32 << 10, 5, 3),  # a backward chunk pair is x and dy
        (256, 16 << 10, 4, 4),  # all of them fit
        (256, 16 << 10, 0, 0),  # nothing re-read soon
        (10**6, 16 << 10, 10, 0),  # more blocks than the budget has chunks
    ],
)
def test_kept_chunks_the_newest_that_fit(blocks: int, chunk_bytes: int, reread: int, kept: int) -> None:
    assert schedule.l2_kept_chunks(24 << 20, blocks, chunk_bytes, reread) == kept


def test_no_budget_keeps_nothing() -> None:
    assert schedule.l2_kept_chunks(0, 256, 16 << 10, 10) == 0
    assert schedule.l2_kept_chunks(24 << 20, 0, 16 << 10, 10) == 0


def l2_keep_asked(direction: str, arch: str, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setenv(ops.ENV_ARCH, arch)
    x = torch.randn(2, 320, 16, 16).half().contiguous(memory_format=torch.channels_last)
    with host_overhead.cpu_device(ArchStub(900)):
        launch = ops._launch(direction, x, x.get_device(), True, 32, 1e-5, 1, 2, None)
    return _abi.GnArgs.from_buffer_copy(launch.args).l2_keep_bytes


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_task_launches_carry_the_budget(direction: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert l2_keep_asked(direction, "tasks+bwd", monkeypatch) == schedule.l2_keep_bytes(H200_L2)


def test_tile_launches_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    assert l2_keep_asked("fwd", "tiles", monkeypatch) == 0


def test_the_field_closes_the_abi() -> None:
    last_name, last_type = _abi.GnArgs._fields_[-1]
    assert (last_name, last_type) == ("l2_keep_bytes", _abi._i64)


def test_the_hints_default_is_the_kernels() -> None:
    """schedule.L2_HINTS says whether the kernels' one launch carries the hints by default (csrc GN_L2_HINTS):
    `auto` counts on them only then."""
    text = (Path(__file__).resolve().parents[1] / "csrc" / "gn_task_primitives.cuh").read_text()
    default = int(re.search(r"#define GN_L2_HINTS (\d+)", text).group(1))
    assert bool(default) == schedule.L2_HINTS


def h200_choice(shape: tuple[int, int, int], direction: str, keep: int, groups: int = 32) -> int:
    n, c, s = shape
    t = schedule.task_tiling(c, groups, s, 2, direction, batch=n)
    slots = schedule.task_slots(t, schedule.task_smem_budget(profiles.get_profile("H200")))
    return schedule.choose_task_schedule(t, 264, slots, l2_keep_bytes=keep)


def test_auto_takes_the_one_launch_whose_overflow_l2_keeps() -> None:
    """Session 47 (H200): 1x512x256x256's one-round teams of 64 re-read 10 of 16 chunks a member; with 6 of
    them kept the one launch took 52.2 us against 56.1 for the two launches."""
    keep = schedule.l2_keep_bytes(H200_L2)
    assert h200_choice((1, 512, 256 * 256), "fwd", 0) == 2
    assert h200_choice((1, 512, 256 * 256), "fwd", keep) == 1
    assert h200_choice((1, 512, 256 * 256), "fwd", schedule.l2_keep_bytes(4 * 10**6)) == 2  # Orin: none kept
    assert h200_choice((1, 512, 256 * 256), "bwd", keep) == 2  # 10 of 16 pairs a member from DRAM again
    # a tensor far larger than the chip: L2 keeps 6 of 58 overflow chunks a member
    assert h200_choice((1, 128, 1024 * 1024), "fwd", keep) == 2
    assert h200_choice((1, 128, 1024 * 2048), "fwd", keep, groups=16) == 2
    # nothing to keep: the old rule (one round on chip is one launch)
    assert h200_choice((1, 512, 128 * 128), "fwd", keep) == 1
    assert h200_choice((1, 512, 128 * 128), "fwd", 0) == 1


@pytest.mark.parametrize("hints", [False, True])
def test_ops_gives_auto_the_budget_only_with_the_hints(hints: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedule, "L2_HINTS", hints)
    with host_overhead.cpu_device(ArchStub(900)):
        p = ops.plan((1, 512, 256, 256), 32, torch.float16, "fwd", device=-1)
    assert p.schedule == (1 if hints else 2)


def test_a_backward_copy_counts_x_and_dy() -> None:
    """csrc l2_hints counts the budget in a copy's bytes: x's chunk forward, x's and dy's backward."""
    fwd = schedule.task_tiling(128, 32, 256 * 256, 2, "fwd", batch=32)
    bwd = schedule.task_tiling(128, 32, 256 * 256, 2, "bwd", batch=32)
    wide = schedule.task_tiling(128, 32, 256 * 256, 2, "bwd", batch=32, wide_itemsize=4)
    assert fwd.copy_bytes == fwd.chunk_rows * fwd.window * 2
    assert bwd.copy_bytes == bwd.chunk_rows * bwd.window * 4
    assert wide.copy_bytes == wide.chunk_rows * wide.window * 6


H100_L2 = 50 * 2**20  # what torch reports for an H100 SXM


@pytest.mark.parametrize(
    "shape, l2, one_launch",
    [
        # 2 x 128 for 16 rounds, 5 of 8 pairs a member re-read
        ((32, 128, 256 * 256), 60 * 2**20, True),  # 3 kept, 2 from DRAM: 612-625 against 655 us (session 48)
        ((32, 128, 256 * 256), H200_L2, True),  # the stub's 60 MB: 2 kept, 3 from DRAM, as on the H100
        ((32, 128, 256 * 256), H100_L2, True),  # 2 kept: 808-840 against 930 us (session 49)
        ((1, 512, 128 * 128), 60 * 2**20, True),  # 1 of 4, kept: 37.8 against 39.3 us
        ((1, 512, 128 * 128), H100_L2, True),  # 38.8 against 42.9 us
        ((1, 512, 256 * 256), 60 * 2**20, False),  # 10 of 16 from DRAM: 93.1 against 94.4, too close
        ((1, 512, 256 * 256), H100_L2, False),  # 11 of 16: 119.9 against 114.7
        ((1, 256, 512 * 512), 60 * 2**20, False),  # 26 of 32: 182.6 against 175.2
        ((2, 320, 64 * 64), 60 * 2**20, False),  # nothing re-read: the small backward's two launches stay
        ((16, 128, 256 * 256), 60 * 2**20, False),  # one team of 256 for 16 rounds: DRAM idles at its waits
    ],
)
def test_the_backward_one_launch_where_little_comes_from_dram_twice(
    shape: tuple[int, int, int], l2: int, one_launch: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    keep = schedule.l2_keep_bytes(l2)
    assert schedule.L2_BACKWARD_ONE_LAUNCH  # on by default since session 49
    assert h200_choice(shape, "bwd", keep) == (1 if one_launch else 2)
    assert h200_choice(shape, "bwd", 0) == 2  # without the hints: the two launches
    monkeypatch.setattr(schedule, "L2_BACKWARD_ONE_LAUNCH", False)
    assert h200_choice(shape, "bwd", keep) == 2


def test_the_share_read_twice_from_dram_decides() -> None:
    """At most L2_BWD_DRAM_REREAD_SHARE of a member's pairs read again from DRAM: 32x128x256x256's 5 of 8
    overflow pairs, with k of them kept, passes from k = 1 (4 of 8 from DRAM) and fails at k = 0."""
    t = schedule.task_tiling(128, 32, 256 * 256, 2, "bwd", batch=32)
    teams = schedule.choose_teams(t, 264, 3)
    assert (teams.teams, teams.chunks_per_member, teams.overflow_chunks) == (2, 8, 5)
    per_pair = teams.teams * teams.team_size * t.copy_bytes
    assert not schedule.l2_backward_one_launch(t, teams, per_pair - 1)  # keeps none
    assert schedule.l2_backward_one_launch(t, teams, per_pair)  # keeps one: 4 of 8 from DRAM
    fwd = schedule.task_tiling(128, 32, 256 * 256, 2, "fwd", batch=32)
    assert not schedule.l2_backward_one_launch(fwd, schedule.choose_teams(fwd, 264, 6), 10 * per_pair)
