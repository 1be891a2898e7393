"""The schedule model: tiling, residency, grid cap and overflow (pure Python, no GPU)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from gn_module import schedule
from gn_module.schedule import DeviceLimits, KernelResources, blocks_per_sm, make_plan, tiling

H200 = DeviceLimits("H200", (9, 0), 132, 2048, 32, 233472, 232448)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("itemsize", [2, 4])
@pytest.mark.parametrize("channels", [1, 3, 30, 96, 128, 320, 1280, 4096, 40000])
def test_tiling_covers_every_row_and_channel(direction, itemsize, channels):
    for batch, rows in ((1, 1), (2, 7), (1, 4096), (3, 100_003), (512, 64)):
        t = tiling(channels, 1, rows, itemsize, direction, batch=batch)
        assert t.rows_per_tile >= 1
        assert (t.tiles_per_slice - 1) * t.rows_per_tile < rows <= t.tiles_per_slice * t.rows_per_tile
        assert t.cols_threads * t.col_chunks * t.vec >= channels  # every channel has a thread
        assert t.cols_threads * t.rows_threads <= schedule.THREADS
        assert channels % t.vec == 0
        if t.rows_per_tile > 1:  # a multi-row tile stays within the on-chip budget
            budget = schedule.TILE_BYTES // schedule.TENSORS_ON_CHIP[direction]
            assert t.tile_bytes <= budget


def test_vectors_need_alignment_and_divisible_channels():
    assert tiling(128, 16, 64, 2, "fwd").vec == 8
    assert tiling(128, 16, 64, 4, "fwd").vec == 4
    assert tiling(130, 13, 64, 2, "fwd").vec == 1
    assert tiling(128, 16, 64, 2, "fwd", aligned=False).vec == 1


def test_tiling_depends_on_shape_only():
    # Same shape and dtype give the same tiles whatever the device or schedule: the basis of
    # bitwise equality across caps and schedules.
    a = tiling(320, 32, 4096, 2, "fwd", batch=2)
    plans = [make_plan(a, 2, s, r, cap) for s in (1, 2) for r in (1, 50, 10_000) for cap in (None, 1, 7)]
    assert {p.tiling for p in plans} == {a}


def test_small_tensors_are_cut_finer_large_ones_into_full_tiles():
    small = tiling(320, 32, 4096, 2, "fwd", batch=2)
    assert 2 * small.tiles_per_slice >= schedule.MIN_TILES
    assert small.rows_per_tile >= schedule.MIN_TILE_ROWS
    large = tiling(128, 16, 1024 * 2048, 2, "fwd")
    assert large.tile_bytes == schedule.TILE_BYTES


def test_levels_reduce_to_fanin():
    t = tiling(128, 16, 1024 * 2048, 2, "bwd")
    sizes = (t.tiles_per_slice, *t.level_tiles)
    assert all(-(-a // schedule.FANIN) == b for a, b in itertools.pairwise(sizes))
    assert sizes[-1] <= schedule.FANIN
    assert tiling(128, 16, 100, 2, "bwd").level_tiles == ()


@pytest.mark.parametrize("cap", [None, 1, 7, 263, 264, 10_000])
def test_grid_and_overflow(cap):
    t = tiling(128, 16, 1024 * 2048, 2, "fwd")
    p = make_plan(t, 1, 1, residency=264, cap=cap)
    limit = 264 if cap is None else min(264, cap)
    assert p.grid == min(p.tiles, limit)
    assert p.overflow_tiles == p.tiles - p.grid
    assert p.waves == -(-p.tiles // p.grid)
    two = make_plan(t, 1, 2, residency=264, cap=cap)
    assert two.overflow_tiles == 0 and two.grid == two.tiles


def test_plan_rejects_bad_arguments():
    t = tiling(64, 8, 64, 2, "fwd")
    with pytest.raises(ValueError, match="schedule"):
        make_plan(t, 1, 3, 10)
    with pytest.raises(ValueError, match="cap"):
        make_plan(t, 1, 1, 10, cap=0)
    with pytest.raises(ValueError, match="divisible"):
        tiling(30, 4, 64, 2, "fwd")
    with pytest.raises(ValueError, match="direction"):
        tiling(30, 3, 64, 2, "sideways")


def test_workspace_layout():
    t = tiling(128, 16, 1024 * 2048, 2, "bwd")
    layout = schedule.workspace_layout(t, 2)
    assert layout["partials"] == 2 * 2 * 128 * t.tiles_per_slice
    assert layout["level"] == 2 * 2 * 128 * t.level_tiles[0]
    assert layout["channel_sums"] == 2 * 2 * 128 and layout["group_sums"] == 2 * 2 * 16
    assert "channel_sums" not in schedule.workspace_layout(tiling(128, 16, 64, 2, "fwd"), 2)


def test_occupancy_model_limits():
    res = KernelResources(registers=64)
    assert blocks_per_sm(H200, res, 256, 0) == 4  # registers: 64K / (64 * 256)
    assert blocks_per_sm(H200, KernelResources(registers=32), 256, 0) == 8  # threads: 2048 / 256
    assert blocks_per_sm(H200, KernelResources(registers=32), 256, 100_000) == 2  # shared memory
    assert blocks_per_sm(H200, KernelResources(registers=32), 256, 300_000) == 0  # too big for a block
    capped = dataclasses.replace(H200, max_blocks_per_sm=3)
    assert blocks_per_sm(capped, KernelResources(registers=16), 64, 0) == 3


def test_slice_for_tiles_inverts_tiling():
    for batch in (1, 2, 5):
        for tiles in (batch, 7 * batch, 255, 256, 265, 2 * 264 + 1, 5000):
            if tiles < batch:
                continue
            rows = schedule.slice_for_tiles(128, 16, 2, "bwd", batch, tiles)
            t = tiling(128, 16, rows, 2, "bwd", batch=batch)
            assert batch * t.tiles_per_slice >= tiles
            assert batch * (t.tiles_per_slice - 1) < tiles


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("tiles", [1, 2, 3, 82, 165, 255, 256, 329, 529, 4000])
def test_batch_rows_for_tiles_gives_exact_tile_counts(direction, tiles):
    heights = schedule.tile_row_choices(128, 2, direction)
    found_any = False
    for rows_per_tile in heights:
        found = schedule.batch_rows_for_tiles(128, 16, 2, direction, tiles, rows_per_tile)
        if found is None:
            continue
        found_any = True
        batch, rows = found
        t = tiling(128, 16, rows, 2, direction, batch=batch)
        assert (t.rows_per_tile, batch * t.tiles_per_slice) == (rows_per_tile, tiles)
    assert found_any  # the short tiles reach any count


@pytest.mark.parametrize(
    ("channels", "itemsize", "direction"),
    [(128, 2, "fwd"), (640, 2, "fwd"), (1024, 2, "bwd"), (2048, 2, "fwd"), (4096, 4, "bwd")],
)  # largest tiles of 256, 51, 16, 16 and 2 rows (the last three: no height between the usual ones)
@pytest.mark.parametrize("batch", [1, 2, 3, 85, 300])
def test_slice_rows_for_tiles_inverts_tiling(
    channels: int, itemsize: int, direction: str, batch: int
) -> None:
    largest = schedule.max_tile_rows(channels, itemsize, direction)
    limit = -(-schedule.MIN_TILES // batch) * (largest + 2) + 3 * largest  # past the largest tiles' onset
    seen: dict[tuple[int, int], list[int]] = {}
    for rows in range(1, limit):
        t = tiling(channels, 1, rows, itemsize, direction, batch=batch)
        seen.setdefault((t.tiles_per_slice, t.rows_per_tile), []).append(rows)
    for h in range(1, largest + 2):
        for per in range(1, limit // h):
            got = schedule.slice_rows_for_tiles(channels, itemsize, direction, batch, per, h)
            assert list(got) == seen.get((per, h), []), (per, h)
