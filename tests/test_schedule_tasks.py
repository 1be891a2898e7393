"""The task architecture's schedule model on CPU: windows, tiles and chunks, shared memory, teams, and the
founding rule that every tile of every task is reduced and applied exactly once at any residency."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from gn_module import profiles, schedule
from gn_module.schedule import TaskTiling

CSRC = Path(__file__).resolve().parents[1] / "csrc"
H200 = profiles.limits_for("H200", (9, 0), 132)
SHAPES = [  # (batch, channels, groups, rows, itemsize)
    (32, 128, 32, 65536, 2),
    (1, 128, 16, 2097152, 2),
    (2, 320, 32, 4096, 2),
    (2, 1280, 32, 256, 2),
    (3, 100, 10, 37, 2),
    (2, 96, 32, 1089, 4),
    (5, 64, 1, 323, 2),
    (2, 64, 64, 1600, 2),
    (1, 7, 7, 5, 4),
]


@pytest.mark.parametrize(
    ("channels", "groups", "itemsize", "window"),
    [(128, 32, 2, 128), (128, 16, 2, 128), (320, 32, 2, 160), (512, 32, 2, 128), (512, 32, 4, 64),
     (96, 32, 2, 96), (64, 1, 2, 64), (4096, 1, 2, 4096), (100, 10, 2, 100), (2560, 32, 2, 160),
     (1280, 32, 2, 160), (640, 32, 4, 80), (256, 32, 4, 64), (1024, 32, 2, 128)],
)  # fmt: skip
def test_window_is_the_narrowest_whole_groups_in_256_byte_rows_or_wider(channels, groups, itemsize, window):
    w = schedule.task_window(channels, groups, itemsize)
    assert w == window
    assert channels % w == 0 and w % (channels // groups) == 0
    # no narrower window of whole groups divides C into 16-byte-vector rows of 256 bytes or more
    cpg = channels // groups
    assert w == channels or (w * itemsize >= schedule.WINDOW_BYTES and w * itemsize % schedule.VEC_BYTES == 0)
    assert not any(
        channels % n == 0 and n * itemsize % schedule.VEC_BYTES == 0 and n * itemsize >= schedule.WINDOW_BYTES
        for n in range(cpg, w, cpg)
    )


def tilings(aligned: bool = True) -> list[TaskTiling]:
    """Every SHAPES tiling (aligned: all are covered; unaligned: scalar windows over THREADS columns,
    like C=320, are not, and run the tile kernels instead)."""
    out = []
    for n, c, g, rows, item in SHAPES:
        t = schedule.task_tiling(c, g, rows, item, "fwd", batch=n, aligned=aligned)
        assert t is not None or (not aligned and c > schedule.THREADS), (n, c, g, rows, item)
        if t is not None:
            out.append(t)
    return out


@pytest.mark.parametrize("aligned", [True, False])
def test_tiles_cover_each_task_in_whole_chunks(aligned: bool) -> None:
    for t in tilings(aligned):
        assert t.chunk_rows % t.rows_threads == 0  # a thread keeps its rows across chunks
        assert t.rows_per_tile == t.rows or t.rows_per_tile % t.chunk_rows == 0
        assert (t.tiles_per_task - 1) * t.rows_per_tile < t.rows <= t.tiles_per_task * t.rows_per_tile
        assert t.tiles_per_task <= schedule.MAX_TILES_PER_TASK
        assert t.cols_threads * t.vec == t.window and t.cols_threads <= schedule.THREADS
        assert t.vec == 1 or (aligned and t.window * t.itemsize % schedule.VEC_BYTES == 0)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_a_samples_tiles_stay_within_the_per_sample_budget(direction: str) -> None:
    # the windows of a sample share MAX_TILES_PER_SAMPLE tiles (a task at least MIN_TILES_PER_TASK):
    # with 4 windows (C=512 fp16) a task has
    # 64 tiles of 4 chunks (H200: 1x512x128x128 forward 29.8 -> 25.8 us against 256 tiles of 1 chunk),
    # while a one-window sample keeps all 256 (1x128x1024x2048: 256 blocks busy)
    def tiles(c: int, rows: int, batch: int = 1) -> tuple[int, int, int]:
        t = schedule.task_tiling(c, 32 if c > 16 else c, rows, 2, direction, batch=batch)
        assert t is not None
        return t.tasks, t.tiles_per_task, t.chunks_per_tile

    assert tiles(512, 128 * 128) == (4, 64, 4)
    assert tiles(512, 256 * 256) == (4, 64, 16)
    assert tiles(128, 1024 * 2048) == (1, 256, 128)
    assert tiles(128, 256 * 256, batch=8) == (8, 256, 4)  # 2048 tiles: the per-sample budget holds
    # a launch's budget (MAX_TILES_PER_LAUNCH): 2048 tiles forward, 4096 backward
    if direction == "fwd":
        assert tiles(128, 256 * 256, batch=16) == (16, 128, 8)
        assert tiles(128, 256 * 256, batch=32) == (32, 64, 16)
        assert tiles(320, 64 * 64, batch=32) == (64, 29, 3)  # batch-32 UNet block: 29 tiles of 3 chunks
        assert tiles(512, 64 * 64, batch=16) == (64, 32, 2)
    else:
        assert tiles(128, 256 * 256, batch=16) == (16, 256, 4)
        assert tiles(128, 256 * 256, batch=32) == (32, 128, 8)
        assert tiles(320, 64 * 64, batch=32) == (64, 43, 2)
        assert tiles(512, 64 * 64, batch=16) == (64, 64, 1)
    for c, rows, batch in ((128, 256 * 256, 32), (320, 64 * 64, 32), (512, 64 * 64, 16), (128, 1 << 20, 64)):
        t = schedule.task_tiling(c, 32, rows, 2, direction, batch=batch)
        assert t.tasks * t.tiles_per_task <= schedule.MAX_TILES_PER_LAUNCH[direction]
    assert tiles(1280, 16 * 16, batch=2)[1] == 6  # fewer chunks than the budget: a tile per chunk
    for c in (64, 128, 256, 320, 512, 640, 1280, 2560):
        for rows in (64, 4096, 65536, 1 << 20):
            t = schedule.task_tiling(c, 32, rows, 2, direction)
            assert t is not None
            windows = c // t.window
            assert t.tiles_per_task <= schedule.max_tiles_per_task(c, t.window)
            most = max(schedule.MAX_TILES_PER_SAMPLE, windows * schedule.MIN_TILES_PER_TASK)
            assert t.tiles_per_task * windows <= most
    assert tiles(2048, 1 << 20) == (16, 64, 256)  # 16 windows: 64 tiles each (MIN_TILES_PER_TASK)


def test_tiling_depends_on_shape_dtype_and_alignment_only() -> None:
    # no device argument exists; the same shape gives the same tiling, whatever plan uses it
    a = schedule.task_tiling(128, 32, 65536, 2, "fwd", batch=32)
    b = schedule.task_tiling(128, 32, 65536, 2, "fwd", batch=32)
    assert a == b
    assert schedule.task_tiling(4096, 1, 64, 4, "fwd") is None  # a window of 1024 vectors: not covered
    assert schedule.task_tiling(64, 4, 0, 2, "fwd") is None
    assert schedule.task_tiling(64, 1, 4, 2, "fwd", batch=2**31) is None  # tasks are 32-bit in csrc
    assert schedule.task_tiling(64, 1, 4, 2, "fwd", batch=2**31 - 1) is not None


def test_slots_fill_the_budget_without_passing_it() -> None:
    for limits in profiles.BUILTIN_PROFILES:
        budget = schedule.task_smem_budget(limits)
        for t in tilings():
            slots = schedule.task_slots(t, budget)
            if slots == 0:
                assert schedule.task_smem_bytes(t, 1) > budget
                continue
            assert schedule.task_smem_bytes(t, slots) <= budget <= limits.max_smem_per_block
            assert slots == schedule.MAX_SLOTS or schedule.task_smem_bytes(t, slots + 1) > budget


def test_max_slots_matches_the_kernels() -> None:
    text = (CSRC / "gn_task_primitives.cuh").read_text()
    assert int(re.search(r"constexpr int kMaxSlots = (\d+);", text).group(1)) == schedule.MAX_SLOTS


def assignment(t: TaskTiling, teams: schedule.TaskTeams) -> dict[tuple[int, int], int]:
    """(task, tile) -> how many times the one-pass grid (fwd_task_onepass) visits it."""
    seen: dict[tuple[int, int], int] = {}
    for block in range(teams.teams * teams.team_size):
        team, member = divmod(block, teams.team_size)
        t0, t1 = schedule.member_tiles(t.tiles_per_task, teams.team_size, member)
        for task in range(team, t.tasks, teams.teams):
            for tile in range(t0, t1):
                seen[(task, tile)] = seen.get((task, tile), 0) + 1
    return seen


@pytest.mark.parametrize("blocks", [1, 2, 3, 7, 61, 132, 264, 1000])
def test_every_tile_of_every_task_exactly_once_at_any_residency(blocks: int) -> None:
    for t in tilings():
        teams = schedule.choose_teams(t, blocks, slots=6)
        assert 1 <= teams.team_size <= min(t.tiles_per_task, blocks)
        assert 1 <= teams.teams <= t.tasks and teams.teams * teams.team_size <= blocks
        assert teams.teams * teams.rounds >= t.tasks
        seen = assignment(t, teams)
        assert set(seen) == {(k, i) for k in range(t.tasks) for i in range(t.tiles_per_task)}
        assert set(seen.values()) == {1}
        busiest = max(b - a for a, b in (schedule.member_tiles(t.tiles_per_task, teams.team_size, m)
                                         for m in range(teams.team_size)))  # fmt: skip
        assert teams.chunks_per_member == busiest * t.chunks_per_tile
        assert teams.overflow_chunks == max(0, teams.chunks_per_member - 6)


def test_plans_grid_and_workspace() -> None:
    t = schedule.task_tiling(128, 32, 65536, 2, "fwd", batch=32)
    one = schedule.make_task_plan(t, 1, 6, residency=264)
    assert one.grid == one.teams.teams * one.teams.team_size <= 264
    capped = schedule.make_task_plan(t, 1, 6, residency=264, cap=7)
    assert capped.grid <= 7 and capped.overflow_tiles == t.tiles - capped.grid
    two = schedule.make_task_plan(t, 2, 6, residency=264)
    assert two.teams is not None and two.grid == two.teams.teams * two.teams.team_size <= 264
    assert two.teams.overflow_chunks == 0 and two.slots == 6
    assert one.workspace_floats == {"partials": 2 * t.tasks * t.groups_per_window * t.tiles_per_task}
    assert one.sync_words == 3 * t.tasks
    with pytest.raises(ValueError):
        schedule.make_task_plan(t, 1, 0, residency=264)
    with pytest.raises(ValueError):
        schedule.make_task_plan(t, 1, 6, residency=0)


def test_reread_tiles_counts_the_chunks_members_cannot_keep() -> None:
    # 8x128x256x256 fp16: 8 tasks (256-byte rows) of 256 tiles of 4 chunks; 256-member teams hold
    # their one tile each
    t = schedule.task_tiling(128, 32, 65536, 2, "fwd", batch=8)
    cpt = t.chunks_per_tile
    assert (t.tasks, t.tiles_per_task, cpt) == (8, 256, 4)
    kept = schedule.make_task_plan(t, 1, 6, residency=264)
    assert kept.teams.overflow_chunks == 0 and kept.reread_tiles == 0
    # cap 7: one team of 7, members of 36-37 tiles (144-148 chunks) holding 6 chunks: 35-36 tiles re-read
    capped = schedule.make_task_plan(t, 1, 6, residency=264, cap=7)
    expected = 0
    for m in range(capped.teams.team_size):
        t0, t1 = schedule.member_tiles(t.tiles_per_task, capped.teams.team_size, m)
        expected += -(-max(0, (t1 - t0) * cpt - 6) // cpt)
    assert capped.reread_tiles == expected * t.tasks > 0
    assert schedule.make_task_plan(t, 2, 6, residency=264).reread_tiles == 0
    assert capped.describe()["reread_tiles"] == capped.reread_tiles


def test_bench_plan_cell_prefers_the_task_overflow() -> None:
    from types import SimpleNamespace

    from gn_module.bench.report import _plan_cell

    def cell(plan: dict) -> str:
        return _plan_cell(SimpleNamespace(plan=plan))  # the cell reads only the result's plan

    assert cell({"schedule": 1, "grid": 264, "overflow_tiles": 16120, "reread_tiles": 0}) == "1p grid 264"
    assert cell({"schedule": 1, "grid": 7, "overflow_tiles": 9, "reread_tiles": 4}) == "1p grid 7 +4 re-read"
    assert cell({"schedule": 1, "grid": 264, "overflow_tiles": 760}) == "1p grid 264 +760 ovf"


@pytest.mark.parametrize(
    ("shape", "groups", "expected"),
    [
        ((2, 320, 64 * 64), 32, 1),  # 5 MiB: one round
        ((1, 512, 128 * 128), 32, 1),  # 16 MiB: one round
        ((1, 512, 256 * 256), 32, 2),  # 64 MiB: several rounds
        ((32, 128, 256 * 256), 32, 2),  # 22 rounds
        ((1, 128, 1024 * 2048), 16, 2),  # overflows
    ],
)
def test_auto_schedule_is_one_pass_only_when_everything_fits_in_one_round(shape, groups, expected) -> None:
    n, c, s = shape
    t = schedule.task_tiling(c, groups, s, 2, "fwd", batch=n)
    slots = schedule.task_slots(t, schedule.task_smem_budget(profiles.get_profile("H200")))
    assert schedule.choose_task_schedule(t, 264, slots) == expected
    assert schedule.choose_task_schedule(t, 0, slots) == 2


def test_backward_plans_are_two_pass_with_their_workspace_and_two_tensors_per_slot() -> None:
    fwd = schedule.task_tiling(128, 32, 65536, 2, "fwd", batch=32)
    bwd = schedule.task_tiling(128, 32, 65536, 2, "bwd", batch=32)
    # x and dy share a slot: a slot holds two chunks, the fixed part is the forward's
    assert schedule.task_smem_bytes(bwd, 3) - schedule.task_smem_bytes(bwd, 0) == 2 * 3 * bwd.chunk_bytes
    assert schedule.task_smem_bytes(bwd, 0) == schedule.task_smem_bytes(fwd, 0)  # (scratch >= 8 x 32 float2)
    # a narrow window's scratch grows to the apply launch's dweight/dbias fold: 8 warps x 32 float2
    narrow = {d: schedule.task_tiling(4, 2, 4096, 2, d) for d in ("fwd", "bwd")}
    assert narrow["fwd"].cols_threads * narrow["fwd"].vec < 32
    extra = schedule.task_smem_bytes(narrow["bwd"], 0) - schedule.task_smem_bytes(narrow["fwd"], 0)
    assert extra == 8 * (256 - 8 * narrow["fwd"].cols_threads * narrow["fwd"].vec) > 0
    assert schedule.choose_task_schedule(bwd, 264, 3) == 2  # its one-pass kernel is opt-in
    one_round = schedule.task_tiling(1280, 32, 256, 2, "bwd", batch=2)
    assert schedule.choose_task_schedule(one_round, 264, 3) == 2
    assert schedule.choose_task_schedule(one_round, 264, 3, backward_onepass=True) == 1
    assert schedule.choose_task_schedule(bwd, 264, 3, backward_onepass=True) == 2  # several rounds
    assert schedule.make_task_plan(bwd, 1, 3, residency=264).schedule == 1
    p = schedule.make_task_plan(bwd, 2, 3, residency=264)
    assert p.workspace_floats == {
        "partials": 2 * bwd.tasks * bwd.tiles_per_task * bwd.window,
        "channel_sums": 2 * 32 * 128,
        "group_sums": 2 * 32 * 32,
        "group_partials": 2 * bwd.tasks * bwd.tiles_per_task * bwd.groups_per_window,
    }
    assert p.sync_words == 3 * bwd.tasks and p.reread_tiles == 0


def test_two_launch_backward_gets_a_sync_word_per_strip_column() -> None:
    """The apply launch sums dweight/dbias by strip column (csrc bwd_param_sums): each column's strips count
    on its own word, so a plan with more columns than tasks needs that many words; the forward, the one
    launch and batches of 2**16 samples or more (one word for every strip) need the tasks' words only."""
    small = schedule.task_tiling(1280, 32, 256, 2, "bwd", batch=2)  # 2x1280x16x16
    assert small.window % schedule.BWD_STRIP_CHANNELS == 0
    columns = small.channels // schedule.BWD_STRIP_CHANNELS
    assert schedule.strip_columns(small) == columns > small.tasks
    assert schedule.param_strips(small) == small.batch * columns
    two = schedule.make_task_plan(small, 2, 3, residency=264)
    assert two.sync_words == 3 * columns
    assert schedule.make_task_plan(small, 1, 3, residency=264).sync_words == 3 * small.tasks
    fwd = schedule.task_tiling(1280, 32, 256, 2, "fwd", batch=2)
    assert schedule.make_task_plan(fwd, 2, 3, residency=264).sync_words == 3 * fwd.tasks
    # one window of 60 channels (groups of 10): two strips per sample, of 32 and 28 channels; more tasks
    # than columns, so the tasks' words
    odd = schedule.task_tiling(60, 6, 100, 2, "bwd", batch=3)
    assert (odd.window, odd.tasks, schedule.strip_columns(odd), schedule.param_strips(odd)) == (60, 3, 2, 6)
    assert schedule.make_task_plan(odd, 2, 3, residency=264).sync_words == 3 * 3
    assert schedule.column_totals((1 << schedule.GENERATION_BITS) - 1)
    assert not schedule.column_totals(1 << schedule.GENERATION_BITS)
    many = schedule.task_tiling(1280, 32, 1, 2, "bwd", batch=1 << schedule.GENERATION_BITS)
    plan = schedule.make_task_plan(many, 2, 3, residency=264)
    assert plan.sync_words == 3 * many.tasks


def test_sync_words_per_task_match_the_kernels() -> None:
    text = (Path(__file__).resolve().parents[1] / "csrc" / "gn_task_primitives.cuh").read_text()
    words = int(re.search(r"constexpr int kSyncWordsPerTask = (\d+);", text).group(1))
    assert words == schedule.SYNC_WORDS_PER_TASK
    bits = int(re.search(r"constexpr int kGenerationBits = (\d+);", text).group(1))
    assert bits == schedule.GENERATION_BITS
    # schedule.column_totals' rule, as the apply launch decides it
    sums = (Path(__file__).resolve().parents[1] / "csrc" / "gn_task_backward.cuh").read_text()
    assert "const bool by_column = a.n < kGeneration;  // (schedule.column_totals)" in sums


def test_wide_backward_slots_hold_a_float32_dy_chunk_beside_x() -> None:
    """Under autocast a bf16 x meets float32 dy (the wide launches): x's windows and vectors; the
    forward's chunks and slots unchanged (y is not on chip); the backward's slot an x chunk plus a dy
    chunk twice its size, of half the rows, so that every profile holds at least one (100 KB of shared
    memory per SM held none of the full height) and the H200 holds as many as the plain backward."""
    plain = {d: schedule.task_tiling(128, 32, 65536, 2, d, batch=32) for d in ("fwd", "bwd")}
    wide = {d: schedule.task_tiling(128, 32, 65536, 2, d, batch=32, wide_itemsize=4) for d in ("fwd", "bwd")}
    for d in ("fwd", "bwd"):
        assert wide[d].wide_itemsize == 4 and plain[d].wide_itemsize == 0
        assert (wide[d].window, wide[d].vec, wide[d].tiles_per_task) == (
            plain[d].window,
            plain[d].vec,
            plain[d].tiles_per_task,
        )
    assert wide["fwd"].chunk_rows == plain["fwd"].chunk_rows
    assert wide["bwd"].chunk_rows * 2 == plain["bwd"].chunk_rows
    assert wide["fwd"].slot_bytes == plain["fwd"].slot_bytes == plain["fwd"].chunk_bytes
    assert plain["bwd"].slot_bytes == 2 * plain["bwd"].chunk_bytes
    assert wide["bwd"].slot_bytes == 3 * wide["bwd"].chunk_bytes == 3 * plain["bwd"].slot_bytes // 4
    budget = schedule.smem_budget(233472, 232448, 1024)  # an H200's SM, two blocks
    slots = schedule.task_slots(wide["bwd"], budget)
    assert slots >= schedule.task_slots(plain["bwd"], budget)
    assert schedule.task_smem_bytes(wide["bwd"], slots) <= budget
    for p in profiles.BUILTIN_PROFILES:
        assert schedule.task_slots(wide["bwd"], schedule.task_smem_budget(p)) >= 1, p.name
    # the same itemsize is no wide launch
    assert schedule.task_tiling(128, 32, 64, 4, "bwd", wide_itemsize=4).wide_itemsize == 0


@pytest.mark.parametrize(
    ("channels", "groups", "rows"),
    [(320, 32, 4096), (128, 32, 65536), (512, 32, 16384), (128, 32, 100_000), (128, 32, 100), (64, 32, 7)],
)
def test_wide_backward_tiles_keep_the_full_chunk_height(channels, groups, rows) -> None:
    """The wide backward's half-height chunks sit in tiles of at least the plain chunk height (H200,
    2x320x64x64 bf16-autocast backward: 47.4 us with half-height tiles, 42.4 with these): as few
    tiles as the plain backward's where those are one chunk each; whole chunks, or one tile per task."""
    plain = schedule.task_tiling(channels, groups, rows, 2, "bwd")
    wide = schedule.task_tiling(channels, groups, rows, 2, "bwd", wide_itemsize=4)
    assert plain is not None and wide is not None
    assert wide.chunk_rows <= plain.chunk_rows
    assert wide.rows_per_tile >= min(plain.chunk_rows, rows)
    if plain.rows_per_tile == plain.chunk_rows:
        assert wide.tiles_per_task == plain.tiles_per_task
    assert wide.rows_per_tile % wide.chunk_rows == 0 or wide.tiles_per_task == 1
    assert wide.tiles_per_task <= schedule.MAX_TILES_PER_TASK


def test_fast_divisor_divides_every_kernel_operand() -> None:
    """csrc fast_div: (umulhi(n, mul) + n) >> shift == n // d for 0 <= n < 2**31, the sum in 32 bits."""

    def fast(n: int, mul: int, shift: int) -> int:
        total = ((n * mul) >> 32) + n
        assert total < 2**32
        return total >> shift

    rng = random.Random(0)
    divisors = [*range(1, 2050), 2**16 - 1, 2**16, 2**20 + 7, 2**30, 2**31 - 1]
    divisors += [rng.randrange(1, 2**31) for _ in range(300)]
    top = 2**31 - 1
    for d in divisors:
        mul, shift = schedule.fast_divisor(d)
        assert 0 < mul < 2**32 and 0 <= shift <= 31
        ns = {0, 1, d - 1, d, d + 1, top, top - 1, top - top % d, top - top % d - 1}
        ns |= {k * d + r for k in (1, 2, 3, 1000, top // d - 1) for r in (-1, 0, 1)}
        ns |= {rng.randrange(0, 2**31) for _ in range(50)}
        for n in ns:
            if 0 <= n <= top:
                assert fast(n, mul, shift) == n // d, (d, n)
    for n in range(0, 70000):  # every operand the prologue meets for small divisors
        for d in (3, 5, 6, 7, 10, 20, 22, 40, 66, 160):
            mul, shift = schedule.fast_divisor(d)
            assert fast(n, mul, shift) == n // d
    for bad in (0, -1, 2**31):
        with pytest.raises(ValueError, match="divisor"):
            schedule.fast_divisor(bad)


@pytest.mark.parametrize(
    ("shape", "clusters", "loses"),
    [
        ((2, 640, 1024), True, True),  # 8 teams of 22, one chunk each, meeting at a flag
        ((1, 640, 1024), False, True),
        ((2, 1280, 256), True, False),  # teams of 6 run as clusters
        ((2, 1280, 256), False, True),  # the same teams at a flag
        ((4, 640, 1024), True, False),  # two chunks per member
        ((1, 512, 16384), True, False),
        ((32, 128, 65536), True, False),  # several rounds: not a one-round plan
    ],
)
def test_one_chunk_flag_teams_take_two_launches_where_the_apply_is_dependent(
    shape, clusters, loses, monkeypatch
) -> None:
    monkeypatch.setattr(schedule, "SMALL_FORWARD_GEOMETRY", False)  # (the plain tiling's one-chunk teams)
    n, c, s = shape
    t = schedule.task_tiling(c, 32, s, 2, "fwd", batch=n)
    slots = schedule.task_slots(t, schedule.task_smem_budget(profiles.get_profile("H200")))
    teams = schedule.choose_teams(t, 264, slots)
    assert schedule.flag_teams_lose(t, teams, clusters) == loses
    plain = schedule.choose_task_schedule(t, 264, slots, clusters=clusters)
    dependent = schedule.choose_task_schedule(t, 264, slots, dependent_apply=True, clusters=clusters)
    assert dependent == (2 if loses else plain)
    if loses:
        assert plain == 1  # (without dependent launches the one launch stays)
    small_teams = teams.rounds == 1 and 1 < teams.team_size <= schedule.CLUSTER_MAX_TEAM
    assert schedule.cluster_shape(t, teams) == small_teams


def test_a_team_of_one_keeps_its_one_launch() -> None:
    t = schedule.task_tiling(64, 32, 64, 2, "fwd", batch=2)  # 2x64x8x8: one tile per task
    teams = schedule.choose_teams(t, 264, 6)
    assert teams.team_size == 1 and teams.chunks_per_member == 1
    assert not schedule.flag_teams_lose(t, teams, False)
    assert schedule.choose_task_schedule(t, 264, 6, dependent_apply=True) == 1


@pytest.mark.parametrize("fewer", [True, False])
def test_backward_ties_go_to_fewer_rounds(fewer: bool, monkeypatch) -> None:
    """8x256x56x56 fp16 on 264 blocks of 3 slots: 16 teams of 16 for one round (4 chunks, one re-read) tie
    with 8 teams of 33 for two rounds (2 chunks, none). The backward takes the one round, whose re-read the
    L2 keeps, so one launch (H100, RESULTS.md session 58: 41.4 -> 38.1-39.8 us); without
    BACKWARD_FEWER_ROUNDS the larger grid's two rounds and two launches. The forward's ties stay as they
    were."""
    monkeypatch.setattr(schedule, "BACKWARD_FEWER_ROUNDS", fewer)
    t = schedule.task_tiling(256, 32, 56 * 56, 2, "bwd", batch=8)
    one_round = schedule.TaskTeams(16, 16, 1, 4, 1)
    two_rounds = schedule.TaskTeams(33, 8, 2, 2, 0)
    assert schedule.busiest_block(one_round) == schedule.busiest_block(two_rounds)
    teams = schedule.choose_teams(t, 264, 3)
    assert teams == (one_round if fewer else two_rounds)
    keep = schedule.l2_keep_bytes(50 << 20)  # (the H100's L2)
    assert schedule.choose_task_schedule(t, 264, 3, l2_keep_bytes=keep) == (1 if fewer else 2)
    monkeypatch.setattr(schedule, "SMALL_FORWARD_GEOMETRY", False)
    fwd = schedule.task_tiling(256, 32, 56 * 56, 2, "fwd", batch=8)
    assert schedule.choose_teams(fwd, 264, 3) == two_rounds


def plain_tiling(*args, **kwargs) -> schedule.TaskTiling | None:
    """`task_tiling` without the small forward's geometry."""
    saved = schedule.SMALL_FORWARD_GEOMETRY
    schedule.SMALL_FORWARD_GEOMETRY = False
    try:
        return schedule.task_tiling(*args, **kwargs)
    finally:
        schedule.SMALL_FORWARD_GEOMETRY = saved


@pytest.mark.parametrize(
    ("shape", "window", "rows_per_tile", "tiles"),
    [
        ((2, 640, 32 * 32), 80, 200, 6),  # session 55, H100: 15.46 -> 12.75 us (clusters of 6)
        ((2, 320, 64 * 64), 40, 816, 6),  # 17.60 -> 16.78 us
    ],
)
def test_the_measured_small_forwards_take_their_geometry(shape, window, rows_per_tile, tiles) -> None:
    n, c, s = shape
    t = schedule.task_tiling(c, 32, s, 2, "fwd", batch=n)
    assert (t.window, t.rows_per_tile, t.tiles_per_task, t.tiles) == (window, rows_per_tile, tiles, 96)
    assert plain_tiling(c, 32, s, 2, "fwd", batch=n).tiles_per_task > schedule.CLUSTER_MAX_TEAM
    slots = schedule.task_slots(t, schedule.task_smem_budget(profiles.get_profile("H200")))
    plan = schedule.make_task_plan(t, 1, slots, 264)
    assert plan.teams.overflow_chunks == 0 and schedule.cluster_teams_fit(plan)
    assert schedule.choose_task_schedule(t, 264, slots, dependent_apply=True, clusters=True) == 1


@pytest.mark.parametrize(
    "shape",
    [
        (2, 1280, 16 * 16),  # already 16 clusters of 6
        (1, 512, 128 * 128),  # 4 teams of 64 won against every other geometry
        (16, 768, 8 * 8),
        (1, 128, 64 * 64),  # no geometry of 88-96 blocks
        (32, 128, 256 * 256),
    ],
)
def test_other_forwards_and_every_backward_keep_the_plain_tiling(shape) -> None:
    n, c, s = shape
    for itemsize in (2, 4):
        t = schedule.task_tiling(c, 32, s, itemsize, "fwd", batch=n)
        assert t == plain_tiling(c, 32, s, itemsize, "fwd", batch=n)
    for small in ((2, 640, 32 * 32), (2, 320, 64 * 64), shape):
        n, c, s = small
        assert schedule.task_tiling(c, 32, s, 2, "bwd", batch=n) == plain_tiling(c, 32, s, 2, "bwd", batch=n)
    # the scalar path (rows not of 16-byte vectors) keeps its tiling too
    assert schedule.task_tiling(640, 32, 1024, 2, "fwd", batch=2, aligned=False) == plain_tiling(
        640, 32, 1024, 2, "fwd", batch=2, aligned=False
    )


@pytest.mark.parametrize("channels", [128, 256, 320, 640, 960, 1280])
@pytest.mark.parametrize("itemsize", [2, 4])
@pytest.mark.parametrize("batch", [1, 2, 4, 8, 16])
def test_small_forward_rows_is_exactly_where_the_tiling_changes(channels, itemsize, batch) -> None:
    small = schedule.small_forward_rows(channels, 32, itemsize, batch)
    for s in range(1, 3 * schedule.SMALL_FORWARD_TILE_CHUNKS * 8 * 204, 5):
        t = schedule.task_tiling(channels, 32, s, itemsize, "fwd", batch=batch)
        plain = plain_tiling(channels, 32, s, itemsize, "fwd", batch=batch)
        assert (t != plain) == (s in small), (s, small, t, plain)
        if t != plain:
            assert t.tiles_per_task <= schedule.CLUSTER_MAX_TEAM < plain.tiles_per_task
            assert t.chunks_per_tile <= schedule.SMALL_FORWARD_TILE_CHUNKS
            assert t.tiles <= schedule.SMALL_FORWARD_GRID and t.window <= plain.window
            assert t.row_bytes >= schedule.SMALL_FORWARD_ROW_BYTES and t.vec * itemsize == schedule.VEC_BYTES
            assert (t.window // (channels // 32)) * (channels // 32) == t.window and channels % t.window == 0


def test_the_plugin_inverse_leaves_out_the_small_forward_rows() -> None:
    small = schedule.small_forward_rows(640, 32, 2, 2)
    assert small, "2x640 fp16 has small-forward rows"
    found = 0
    for tiles in range(1, 65):
        rows = schedule.task_rows_for_tiles(640, 32, 2, tiles, 1, batch=2)  # (checks its ends itself)
        assert not set(rows) & set(small)
        found += bool(rows)
    assert found  # (the tiles beyond the small rows' tilings are still there)
