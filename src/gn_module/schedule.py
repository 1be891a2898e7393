"""The one schedule model: tiles, residency, grid cap and overflow for every GroupNorm launch.

Everything here is pure Python (no torch, no CUDA) so that the launcher, the pytest plugin, the
docs and the arch sweep all read the same numbers. The CUDA launcher receives a `Plan` and
follows it; it derives nothing on its own.

Vocabulary
----------
slice      one sample n of the input, viewed as ``S`` rows of ``C`` channels (memory order N, S, C).
tile       ``rows_per_tile`` consecutive rows of one slice, all channels. The unit of work and of
           every partial reduction. The tiling depends on the shape and dtype only, never on the
           device, the schedule or the residency cap: that is what makes results bitwise
           identical across schedules and caps.
level      a fixed-fan-in reduction of per-tile partials over the tile axis (``FANIN`` at a time)
           until at most ``FANIN`` partials per (n, c) remain; the group-combine phase finishes.
one-pass   one cooperative launch: tile partials, grid barrier, levels, grid barrier, combine,
           grid barrier, apply. Each block keeps its last tile on chip across the barriers.
two-pass   the same phases as separate ordinary launches (the tensor is read twice).
residency  blocks of the one-pass kernel that can be co-resident on the whole device.
grid       ``min(tiles, residency, cap)``; ``overflow_tiles = tiles - grid`` are processed by
           resident blocks in the same launch (grid-stride), and reach every reduction.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

#: Threads per block of every kernel.
THREADS = 256
#: Bytes of one vector access per thread.
VEC_BYTES = 16
#: On-chip bytes per block that hold the tile(s) across the one-pass grid barriers; also the
#: largest tile of the two-pass schedule (the tiling is the same for both).
TILE_BYTES = 64 * 1024
#: Small tensors are cut into at least this many tiles (when rows allow) so they spread over SMs.
MIN_TILES = 256
#: Fewest rows per tile: below it the per-tile partials (8 bytes per channel) outweigh the tile.
MIN_TILE_ROWS = 16
#: Fan-in of each reduction level over the tile axis.
FANIN = 32
#: Largest number of reduction levels the launcher accepts (FANIN**8 tiles is far beyond any tensor).
MAX_LEVELS = 8

DIRECTIONS = ("fwd", "bwd")
#: Tensors held on chip per tile by the one-pass kernel: x (fwd); x and dy (bwd).
TENSORS_ON_CHIP = {"fwd": 1, "bwd": 2}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class DeviceLimits:
    """Per-SM limits of a GPU (CUDA programming guide, compute-capability tables) and its SM count."""

    name: str
    cc: tuple[int, int]
    sm_count: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    smem_per_sm: int  # bytes usable by blocks of one SM (largest carveout)
    max_smem_per_block: int  # bytes a block may opt into
    regs_per_sm: int = 65536
    max_regs_per_block: int = 65536
    reg_alloc_unit: int = 256  # registers per warp are allocated in units of this many
    smem_alloc_unit: int = 128
    reserved_smem_per_block: int = 1024  # the driver's share of each block, sm_80 and newer
    warp_size: int = 32

    @property
    def arch(self) -> str:
        return f"sm_{self.cc[0]}{self.cc[1]}"


@dataclass(frozen=True)
class KernelResources:
    """What the compiler gave one kernel: registers per thread and static shared memory."""

    registers: int
    static_smem: int = 0


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def blocks_per_sm(limits: DeviceLimits, res: KernelResources, threads: int, dynamic_smem: int) -> int:
    """Co-resident blocks per SM, the way the CUDA occupancy calculator derives it."""
    warps = -(-threads // limits.warp_size)
    by_threads = limits.max_threads_per_sm // (warps * limits.warp_size)
    by_blocks = limits.max_blocks_per_sm
    if res.registers > 0:
        regs_per_warp = _round_up(res.registers * limits.warp_size, limits.reg_alloc_unit)
        if regs_per_warp * warps > limits.max_regs_per_block:
            return 0
        by_regs = (limits.regs_per_sm // regs_per_warp) // warps
    else:
        by_regs = by_blocks
    smem = res.static_smem + dynamic_smem
    if smem > limits.max_smem_per_block:
        return 0
    smem_block = _round_up(smem + limits.reserved_smem_per_block, limits.smem_alloc_unit)
    by_smem = limits.smem_per_sm // smem_block
    return max(0, min(by_threads, by_blocks, by_regs, by_smem))


@dataclass(frozen=True)
class Tiling:
    """How one slice is cut into tiles and how a block's threads cover a tile."""

    direction: str
    channels: int
    groups: int
    rows: int  # S, rows per slice
    itemsize: int
    vec: int  # channels per thread access (16-byte vectors when the layout allows)
    cols_threads: int  # threads across one row (each owns `vec` channels per column chunk)
    col_chunks: int  # column chunks per thread when a row is wider than the block
    rows_threads: int  # rows a block walks at once
    rows_per_tile: int
    tiles_per_slice: int

    @property
    def tile_bytes(self) -> int:
        """Bytes of one tensor's tile."""
        return self.rows_per_tile * self.channels * self.itemsize

    @property
    def scratch_bytes(self) -> int:
        """Shared memory for the in-tile per-channel reduction (one float per thread-channel; an
        upper bound: the kernel folds lanes of a warp first where the row width allows)."""
        return self.rows_threads * self.cols_threads * self.vec * 4

    @property
    def onepass_smem(self) -> int:
        """Dynamic shared memory of the one-pass kernel: the tile(s) kept on chip plus scratch."""
        return TENSORS_ON_CHIP[self.direction] * _round_up(self.tile_bytes, 16) + self.scratch_bytes

    @property
    def twopass_smem(self) -> int:
        """Dynamic shared memory of the two-pass tile kernels: scratch only."""
        return self.scratch_bytes

    @property
    def level_tiles(self) -> tuple[int, ...]:
        """Partials per (n, c) after each reduction level (the combine phase takes the last)."""
        sizes = []
        t = self.tiles_per_slice
        while t > FANIN:
            t = -(-t // FANIN)
            sizes.append(t)
        return tuple(sizes)


def max_tile_rows(channels: int, itemsize: int, direction: str) -> int:
    """Rows of the largest tile that fits the on-chip budget (at least one row)."""
    return max(1, TILE_BYTES // TENSORS_ON_CHIP[direction] // (channels * itemsize))


def tiling(
    channels: int,
    groups: int,
    rows: int,
    itemsize: int,
    direction: str,
    *,
    batch: int = 1,
    aligned: bool = True,
) -> Tiling:
    """Cut each of `batch` slices of ``rows`` x ``channels`` into tiles.

    Depends on the shape and dtype only (never on the device, schedule or cap). Tiles are as
    large as the on-chip budget allows, but small tensors are cut finer, down to MIN_TILE_ROWS,
    so that the whole tensor makes at least MIN_TILES tiles.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if channels < 1 or groups < 1 or channels % groups:
        raise ValueError(f"expected num_channels ({channels}) divisible by num_groups ({groups})")
    full = VEC_BYTES // itemsize
    vec = full if (aligned and channels % full == 0) else 1
    vectors_per_row = channels // vec
    cols_threads = min(vectors_per_row, THREADS)
    col_chunks = -(-vectors_per_row // cols_threads)
    rows_threads = THREADS // cols_threads
    largest = max_tile_rows(channels, itemsize, direction)
    wanted = -(-rows // -(-MIN_TILES // max(batch, 1))) if rows > 0 else 1
    rows_per_tile = min(largest, max(min(MIN_TILE_ROWS, largest), wanted), max(rows, 1))
    tiles_per_slice = max(1, -(-rows // rows_per_tile)) if rows > 0 else 0
    return Tiling(
        direction=direction,
        channels=channels,
        groups=groups,
        rows=rows,
        itemsize=itemsize,
        vec=vec,
        cols_threads=cols_threads,
        col_chunks=col_chunks,
        rows_threads=rows_threads,
        rows_per_tile=rows_per_tile,
        tiles_per_slice=tiles_per_slice,
    )


@dataclass(frozen=True)
class Plan:
    """A complete description of one launch. `asdict(plan)` is what tests and reports print."""

    tiling: Tiling
    batch: int
    schedule: int  # 1 = one-pass (cooperative), 2 = two-pass
    residency: int  # co-resident one-pass blocks on the device (0: one-pass impossible)
    cap: int | None
    grid: int  # blocks of the one-pass launch (two-pass: blocks of the tile kernels = tiles)
    tiles: int
    overflow_tiles: int
    waves: int  # tiles per block of the one-pass launch, rounded up
    workspace_floats: dict[str, int] = field(default_factory=dict)

    @property
    def direction(self) -> str:
        return self.tiling.direction

    @property
    def smem(self) -> int:
        return self.tiling.onepass_smem if self.schedule == 1 else self.tiling.twopass_smem

    @property
    def workspace_bytes(self) -> int:
        return 4 * sum(self.workspace_floats.values())

    def describe(self) -> dict:
        out = asdict(self)
        out["smem"] = self.smem
        out["workspace_bytes"] = self.workspace_bytes
        return out


def workspace_layout(t: Tiling, batch: int) -> dict[str, int]:
    """Float counts of each scratch region, in the order the launcher lays them out."""
    pair = 2 * batch * t.channels  # (sum, sum) per (n, c)
    layout = {"partials": pair * t.tiles_per_slice}
    levels = t.level_tiles
    if levels:
        layout["level"] = pair * levels[0]
    if t.direction == "bwd":
        layout["channel_sums"] = pair
        layout["group_sums"] = 2 * batch * t.groups
    return layout


def make_plan(t: Tiling, batch: int, schedule: int, residency: int, cap: int | None = None) -> Plan:
    """Grid, overflow and workspace for `t` on a device that holds `residency` one-pass blocks."""
    if schedule not in (1, 2):
        raise ValueError(f"schedule must be 1 (one-pass) or 2 (two-pass), got {schedule!r}")
    if cap is not None and cap < 1:
        raise ValueError(f"residency cap must be >= 1, got {cap}")
    tiles = batch * t.tiles_per_slice
    if schedule == 1:
        grid = min(tiles, residency if cap is None else min(residency, cap))
        overflow = max(0, tiles - grid)
        waves = -(-tiles // grid) if grid else 0
    else:
        grid, overflow, waves = tiles, 0, 1 if tiles else 0
    return Plan(
        tiling=t,
        batch=batch,
        schedule=schedule,
        residency=residency,
        cap=cap,
        grid=grid,
        tiles=tiles,
        overflow_tiles=overflow,
        waves=waves,
        workspace_floats=workspace_layout(t, batch),
    )


def model_residency(limits: DeviceLimits, res: KernelResources, t: Tiling) -> int:
    """Co-resident one-pass blocks on a described device (the arch sweep's emulated residency)."""
    return blocks_per_sm(limits, res, THREADS, t.onepass_smem) * limits.sm_count


def tile_row_choices(channels: int, itemsize: int, direction: str) -> tuple[int, ...]:
    """The two tile heights `tiling` produces for tensors that have rows to spare: the largest
    (big tensors) and MIN_TILE_ROWS (small ones), largest first."""
    largest = max_tile_rows(channels, itemsize, direction)
    return tuple(dict.fromkeys((largest, min(MIN_TILE_ROWS, largest))))


def slice_rows_for_tiles(
    channels: int, itemsize: int, direction: str, batch: int, tiles_per_slice: int, rows_per_tile: int
) -> range:
    """Every S whose `tiling` (of `batch` slices of S rows) has exactly `tiles_per_slice` tiles of
    `rows_per_tile` rows per slice: the inverse of `tiling`, empty when there is none.

    `tiling` takes the largest tile for slices of at least ceil(MIN_TILES / batch) largest tiles,
    MIN_TILE_ROWS for slices of at most that many MIN_TILE_ROWS-row tiles, and the height that
    makes about that many tiles in between; so a height between the two only cuts a slice into
    close to ceil(MIN_TILES / batch) tiles.
    """
    h, per_slice = rows_per_tile, tiles_per_slice
    largest = max_tile_rows(channels, itemsize, direction)
    smallest = min(MIN_TILE_ROWS, largest)
    if batch < 1 or per_slice < 1 or not 1 <= h <= largest:
        return range(0)
    if h < smallest:  # only a slice shorter than the smallest tile: one tile of all its rows
        return range(h, h + 1) if per_slice == 1 else range(0)
    aim = -(-MIN_TILES // batch)  # tiles per slice `tiling` aims for: its height is ceil(S / aim)
    lo, hi = max((per_slice - 1) * h + 1, h), per_slice * h  # ceil(S / h) == per_slice
    if h == largest and h > smallest:
        lo = max(lo, aim * (h - 1) + 1)  # ceil(S / aim) >= largest
    elif h == smallest and h < largest:
        hi = min(hi, aim * h)  # ceil(S / aim) <= MIN_TILE_ROWS
    elif smallest < h < largest:
        lo, hi = max(lo, aim * (h - 1) + 1), min(hi, aim * h)  # ceil(S / aim) == h
    return range(lo, max(lo, hi + 1))


def batch_rows_for_tiles(
    channels: int, groups: int, itemsize: int, direction: str, tiles: int, rows_per_tile: int
) -> tuple[int, int] | None:
    """(batch, rows per slice) whose tiling has exactly `tiles` tiles of `rows_per_tile` rows.

    Used to generate overflow shapes from residencies (the residency depends on the tile height,
    so callers fix the height first). Tries two samples, one sample, and one tile per sample;
    every candidate is checked against `tiling` itself. None when no candidate fits.
    """
    if tiles < 1 or rows_per_tile < 1:
        raise ValueError(f"need tiles >= 1 and rows_per_tile >= 1, got {tiles} and {rows_per_tile}")
    candidates = [(b, tiles // b * rows_per_tile) for b in (2, 1) if tiles % b == 0]
    candidates.append((tiles, rows_per_tile))
    for batch, rows in candidates:
        t = tiling(channels, groups, rows, itemsize, direction, batch=batch)
        if t.rows_per_tile == rows_per_tile and batch * t.tiles_per_slice == tiles:
            return batch, rows
    return None


def slice_for_tiles(channels: int, groups: int, itemsize: int, direction: str, batch: int, tiles: int) -> int:
    """Rows per slice so that `batch` slices hold at least `tiles` tiles in total.

    Totals of at least MIN_TILES get the largest tiles; smaller totals get MIN_TILE_ROWS-row tiles
    (see `tiling`). The result is checked against `tiling` itself.
    """
    if tiles < batch:
        raise ValueError("need at least one tile per sample")
    per_slice = -(-tiles // batch)
    largest = max_tile_rows(channels, itemsize, direction)
    rows_each = largest if per_slice * batch >= MIN_TILES else min(MIN_TILE_ROWS, largest)
    rows = per_slice * rows_each
    check = tiling(channels, groups, rows, itemsize, direction, batch=batch)
    if check.tiles_per_slice != per_slice:  # a full slice never shrinks its tiles; guard the invariant
        raise RuntimeError(f"tiling invariant broken: {check} does not hold {per_slice} tiles")
    return rows


def elements(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


# ================================================================ task architecture (arch 2)
# A task is one sample times a window of channels that holds whole groups; see csrc/gn_tasks.cuh.

#: The narrowest row segment a task window reads: at least 256 bytes. Measured on the H200 (RESULTS.md,
#: session 9, scripts/window_sweep.py): 32x128x256x256 fp16 forward 505 -> 456 us and backward 797 ->
#: 743 us with 256-byte rows (the whole C) instead of 128-byte ones; 2x320x64x64 forward 25.0 -> 20.3
#: us with 320-byte rows (4 tasks of 66 members) instead of 640 (2 tasks of 132).
WINDOW_BYTES = 256
#: Rows of a shared-memory chunk per thread (csrc kChunkRowsPerThread, a compile-time bound there so
#: the row loops unroll): 4 rows of 16-byte vectors (16 KB chunks when the window's columns divide
#: the block), 16 on the scalar path. A tile (the reduction unit) is one or more whole chunks, as
#: many as keep a sample within MAX_TILES_PER_SAMPLE tiles over its windows (`max_tiles_per_task`),
#: which bounds the combine (it reads tiles x groups partials) and the per-tile folds.
CHUNK_ROWS_PER_THREAD_VECTOR = 4
CHUNK_ROWS_PER_THREAD_SCALAR = 16
#: Measured on the H200 (RESULTS.md, session 13): with 4 windows per sample, 64 tiles per task instead
#: of 256 took 1x512x128x128's one-launch forward from 29.8 to 25.8 us and its stats launch from 17.5
#: to 13.0 us (fewer folds per member, a quarter of the partials to combine); 256 tiles for the whole
#: of a one-window sample keep 1x128x1024x2048's 256 blocks busy (64 tiles there: 440 -> 578 us).
MAX_TILES_PER_SAMPLE = 256
MAX_TILES_PER_TASK = MAX_TILES_PER_SAMPLE  # (one window per sample)
#: ... but a task may always have this many: a sample of many windows (C >= 1024 in 16 bits) keeps
#: more than 256 tiles, as many as its teams' members (so that a tensor over 2**31 elements, one
#: sample, still gives 264 blocks several tiles each: the plugin's BIG_TASK_SHAPE).
MIN_TILES_PER_TASK = 64
#: Tiles of a whole launch (batch x windows x tiles per task), per direction, once a batch has so many
#: samples that the per-sample budget would give more. Fewer, larger tiles mean fewer per-tile folds
#: and partials: on the H200 (RESULTS.md, session 14), forward 16x512x64x64 76.0 -> 66.6 us and
#: 32x320x64x64 92.3 -> 89.9 us at 2048 against 4096 (107.5 us without a launch budget), backward
#: 129.7 -> 121.0 and 162.5 -> 159.8 us. The backward keeps 4096: at 2048 no batch shape gives its
#: plugin cases of x4p3 team sizes of tiles with several rounds on 264-340 resident blocks (11 cases
#: on the H100, H200, B200 and RTX 4090/5090 profiles).
MAX_TILES_PER_LAUNCH = {"fwd": 2048, "bwd": 4096}
#: Most chunks a block holds (csrc kMaxSlots: the copy pipeline waits with immediates 0..7).
MAX_SLOTS = 8
#: Persistent blocks per SM the one-pass grid aims for: two, so that one block's wait for its
#: task's other blocks overlaps the other's copies.
TASK_BLOCKS_PER_SM = 2
#: Per-round overhead of a one-pass team (barrier, combine), in chunk-equivalents of time.
ROUND_OVERHEAD_CHUNKS = 1
#: Slots `choose_teams` assumes for the two-pass schedule, whose members keep nothing on chip.
TWO_PASS_NO_OVERFLOW = 1 << 30
#: Synchronisation words per task (csrc kSyncWordsPerTask): arrivals, flag, column count.
SYNC_WORDS_PER_TASK = 3
#: Most blocks of a team that runs as one thread-block cluster (the portable cluster size; csrc
#: fwd_task_cluster, sm_90 builds, ops.cluster_teams).
CLUSTER_MAX_TEAM = 8
#: Channels of one dweight/dbias strip of the backward (csrc bwd_param_strip: a warp's lanes).
BWD_STRIP_CHANNELS = 32
#: Low bits of an arrival counter that count one launch's arrivals (csrc kGenerationBits): the high bits
#: number the launches, and a task launch has fewer blocks than 2**GENERATION_BITS (`make_task_plan`).
GENERATION_BITS = 16
#: Share of the device's L2 that a one launch asks to keep for the overflow chunks its apply re-reads
#: (GnArgs.l2_keep_bytes, csrc l2_hints). On the H200 (60 MB of L2; benchmarks/micro measurement 4, RESULTS.md
#: design measurements) a re-read of S MiB read with evict_last and re-read with evict_first ran x1.8-1.9 of
#: the first read's speed up to 32 MiB; with as many bytes written in between, x1.79 at 24 MiB but x1.15 at
#: 32: so 0.4, about 24 MiB there. (Plain loads kept nothing: x1.03 at 32 MiB.) Session 47: 24 and 32 MiB
#: within 2 % of each other on 32x128x256x256's one launch, 24 ahead staggered and in the backward.
L2_KEEP_SHARE = 0.4


def l2_keep_bytes(l2_cache_bytes: int) -> int:
    """GnArgs.l2_keep_bytes for a device with `l2_cache_bytes` of L2: L2_KEEP_SHARE of it (0 when unknown)."""
    return max(0, int(l2_cache_bytes * L2_KEEP_SHARE))


#: Whether the kernels' one launch carries the L2 hints by default (csrc GN_L2_HINTS; a CPU test checks they
#: agree). `ops` then gives `choose_task_schedule` the device's budget; builds without them (-DGN_L2_HINTS=0)
#: keep the old choice only if this is False too.
L2_HINTS = True
#: The share of a one-round forward team's overflow that L2 must keep for `auto` to take the one launch
#: (`l2_keeps_overflow`). Session 47, H200, fp16: 1x512x256x256 silu (4 x 64, 10 of 16 chunks a member
#: re-read, 6 of them kept) one launch 52.2 us with the hints against 56.1 us for the two launches.
L2_KEPT_OVERFLOW_SHARE = 0.5
#: Whether `auto` also takes the backward's one launch where the hints leave little of it to read twice
#: (`l2_backward_one_launch`), whatever its rounds. On since session 49 (H100: the GPU suite with it on, every
#: failure but one out of memory under 8 workers and passing when rerun; the one pinned the old choice), where
#: no backward row lost with it (time_shapes.py, alternating rounds).
L2_BACKWARD_ONE_LAUNCH = True
#: ... where at most this share of a member's chunk pairs (x and dy) comes from DRAM a second time: its
#: overflow pairs less those L2 keeps. Its traffic is then at most (2 x 1.5 + 1) / (2 x 2 + 1) = 0.8 of the
#: two launches' (x and dy read twice, dx written). Measured with the one launch forced (GN_ARCH=tasks+bwd1,
#: fp16, us, one launch against two; DRAM re-read pairs of a member's):
#:   32x128x256x256 (2 x 128 for 16 rounds, 5 of 8 pairs overflow): H200 2 of 8, 612-625 against 655;
#:     H100 3 of 8, 808-840 against 930 (staggered, `backward_pair_stagger`: 602-605 and 770-779);
#:   1x512x128x128 silu (1 of 4, kept): H200 37.8 against 39.3; H100 38.8 against 42.9;
#:   1x512x256x256 silu (13 of 16): H200 10 of 16, 93.1 against 94.4; H100 11 of 16, 119.9 against 114.7;
#:   1x256x512x512 silu (29 of 32): H200 26 of 32, 182.6 against 175.2; H100 bf16 241.4 against 235.9.
#: (Sessions 48-49. The old rule, L2 keeping half of the overflow, left 32x128x256x256 out on the H100,
#: whose 50 MB keep 2 of its 5 pairs.)
L2_BWD_DRAM_REREAD_SHARE = 0.5


def l2_kept_chunks(keep_bytes: int, blocks: int, chunk_bytes: int, reread: int) -> int:
    """How many of a one-launch member's `reread` overflow chunks its copies ask L2 to keep (csrc l2_hints,
    the same formula): `keep_bytes` over the launch's `blocks` chunks of `chunk_bytes` (x, and dy in the
    backward), the newest of them."""
    if keep_bytes <= 0 or blocks < 1 or chunk_bytes < 1:
        return 0
    return max(0, min(reread, keep_bytes // (blocks * chunk_bytes)))


def l2_keeps_overflow(t: TaskTiling, teams: TaskTeams, keep_bytes: int) -> bool:
    """Whether a one launch of these teams has at least L2_KEPT_OVERFLOW_SHARE of each member's overflow
    kept in L2 by the hints (`keep_bytes`: GnArgs.l2_keep_bytes; 0 without hints)."""
    if teams.overflow_chunks == 0:
        return False
    return member_kept_chunks(t, teams, keep_bytes) >= L2_KEPT_OVERFLOW_SHARE * teams.overflow_chunks


def member_kept_chunks(t: TaskTiling, teams: TaskTeams, keep_bytes: int) -> int:
    """How many of a one-launch member's overflow chunks (pairs, backward) the hints keep in L2
    (`l2_kept_chunks` over the launch's blocks)."""
    blocks = teams.teams * teams.team_size
    return l2_kept_chunks(keep_bytes, blocks, t.copy_bytes, teams.overflow_chunks)


def l2_backward_one_launch(t: TaskTiling, teams: TaskTeams, keep_bytes: int) -> bool:
    """Whether `auto` takes the backward's one launch of these teams for its traffic (L2_BACKWARD_ONE_LAUNCH):
    it re-reads some chunk pairs (with none, the small shapes' two launches win on latency), and at most
    L2_BWD_DRAM_REREAD_SHARE of a member's pairs come from DRAM again, those the hints (`keep_bytes`, 0
    without them: then this is never true) do not keep in L2. Not one team for several rounds: nobody reads
    while it waits and writes (session 44's forward rounds of one team of 256 lost 5-46 %)."""
    if t.direction != "bwd" or teams.overflow_chunks == 0 or keep_bytes <= 0:
        return False
    if teams.teams == 1 and teams.rounds > 1:
        return False
    from_dram = teams.overflow_chunks - member_kept_chunks(t, teams, keep_bytes)
    return from_dram <= L2_BWD_DRAM_REREAD_SHARE * teams.chunks_per_member


def max_tiles_per_task(channels: int, window: int, batch: int = 1, direction: str = "fwd") -> int:
    """Most tiles of one task: a sample's MAX_TILES_PER_SAMPLE shared by its C / window tasks (at least
    MIN_TILES_PER_TASK), and a launch's MAX_TILES_PER_LAUNCH[direction] shared by its batch x C / window
    tasks (at least 1)."""
    windows = channels // window
    per_sample = max(MIN_TILES_PER_TASK, MAX_TILES_PER_SAMPLE // windows)
    return max(1, min(per_sample, MAX_TILES_PER_LAUNCH[direction] // (batch * windows)))


def fast_divisor(d: int) -> tuple[int, int]:
    """(mul, shift) with ``n // d == (umulhi(n, mul) + n) >> shift`` for every 0 <= n < 2**31, where
    umulhi is the high 32 bits of the 64-bit product (csrc fast_div). The kernels divide by the task
    geometry's run-time constants this way: a division is a chain of some 25 dependent instructions, and
    a one-launch block had ten ahead of its first copy. Granlund and Montgomery's 33-bit multiplier
    2**32 + mul = floor(2**(32 + shift) / d) + 1 with shift = ceil(log2 d); n < 2**31 keeps the sum in
    32 bits."""
    if not 1 <= d < 2**31:
        raise ValueError(f"divisor must be in [1, 2**31), got {d}")
    shift = (d - 1).bit_length()
    return ((1 << 32) * ((1 << shift) - d)) // d + 1, shift


def task_window(channels: int, groups: int, itemsize: int) -> int:
    """Channels per task: the narrowest whole number of groups that divides C into rows of whole
    16-byte vectors of at least WINDOW_BYTES, or all of C when none does."""
    cpg = channels // groups
    for w in range(cpg, channels, cpg):
        if channels % w == 0 and (w * itemsize) % VEC_BYTES == 0 and w * itemsize >= WINDOW_BYTES:
            return w
    return channels


@dataclass(frozen=True)
class TaskTiling:
    """Tasks, tiles and chunks of one launch, and how a block's threads cover a chunk.

    Depends on the shape, dtype and alignment only (never on the device, schedule or cap).
    """

    direction: str
    channels: int
    groups: int
    rows: int  # S, rows per sample
    batch: int
    itemsize: int
    window: int  # channels per task
    vec: int  # channels per thread access
    cols_threads: int
    rows_threads: int
    rows_per_tile: int
    tiles_per_task: int
    chunk_rows: int  # rows per shared-memory chunk, a multiple of rows_threads
    #: Bytes per element of the forward's y / the backward's dy when they are wider than x (float32
    #: under autocast for a float16/bfloat16 x: the wide launches); 0 when they are x's dtype.
    wide_itemsize: int = 0

    @property
    def tasks(self) -> int:
        return self.batch * (self.channels // self.window)

    @property
    def tiles(self) -> int:
        return self.tasks * self.tiles_per_task

    @property
    def groups_per_window(self) -> int:
        return self.window // (self.channels // self.groups)

    @property
    def row_bytes(self) -> int:
        return self.window * self.itemsize

    @property
    def chunks_per_tile(self) -> int:
        return -(-self.rows_per_tile // self.chunk_rows)

    @property
    def chunk_bytes(self) -> int:
        """Shared memory of one chunk of x (16-byte aligned)."""
        return _round_up(self.chunk_rows * self.row_bytes, 16)

    @property
    def copy_bytes(self) -> int:
        """Bytes of global memory one chunk copy reads: x's chunk, and dy's in the backward (csrc l2_hints'
        `chunk_bytes`, which the L2 budget is counted in)."""
        dy_itemsize = 0 if self.direction == "fwd" else self.wide_itemsize or self.itemsize
        return self.chunk_rows * self.window * (self.itemsize + dy_itemsize)

    @property
    def slot_bytes(self) -> int:
        """Shared memory of one slot: a chunk of x, and in the backward one of dy (csrc TaskSmem)."""
        if self.direction == "fwd":
            return self.chunk_bytes
        dy_itemsize = self.wide_itemsize or self.itemsize
        return self.chunk_bytes + _round_up(self.chunk_rows * self.window * dy_itemsize, 16)


def chunk_rows_per_thread(vec: int, itemsize: int) -> int:
    """Rows of a chunk per thread: CHUNK_ROWS_PER_THREAD_VECTOR for 16-byte accesses, else _SCALAR."""
    return CHUNK_ROWS_PER_THREAD_VECTOR if vec * itemsize == VEC_BYTES else CHUNK_ROWS_PER_THREAD_SCALAR


def task_tiling(
    channels: int,
    groups: int,
    rows: int,
    itemsize: int,
    direction: str,
    *,
    batch: int = 1,
    aligned: bool = True,
    wide_itemsize: int = 0,
) -> TaskTiling | None:
    """The task tiling, or None when the task kernels do not cover the shape (a window wider than
    THREADS vectors, an empty tensor, or 2**31 tasks or rows per tile). `wide_itemsize`: see
    `TaskTiling.wide_itemsize` (the tiling is x's; a wide backward's slots hold float32 dy).
    A small forward may take another window and fewer, taller tiles (`small_forward_tiling`)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if channels < 1 or groups < 1 or channels % groups:
        raise ValueError(f"expected num_channels ({channels}) divisible by num_groups ({groups})")
    if rows < 1 or batch < 1:
        return None
    window = task_window(channels, groups, itemsize)
    most = max_tiles_per_task(channels, window, batch, direction)
    t = _tiling_at(channels, groups, rows, itemsize, direction, batch, aligned, wide_itemsize, window, most)
    if t is not None and direction == "fwd" and SMALL_FORWARD_GEOMETRY:
        return small_forward_tiling(t) or t
    return t


def _tiling_at(
    channels: int,
    groups: int,
    rows: int,
    itemsize: int,
    direction: str,
    batch: int,
    aligned: bool,
    wide_itemsize: int,
    window: int,
    most: int,
) -> TaskTiling | None:
    """`task_tiling` of a given window and at most `most` tiles per task (beyond that, taller tiles)."""
    full = VEC_BYTES // itemsize
    vec = full if (aligned and (window * itemsize) % VEC_BYTES == 0) else 1
    cols = window // vec
    if cols > THREADS:
        return None
    rows_threads = THREADS // cols
    # Chunks are whole rows-thread strides (a thread keeps its rows across chunks); tiles are
    # whole chunks, at least one chunk of the full height, and as many as keep a task within
    # `most` tiles.
    per_thread = chunk_rows_per_thread(vec, itemsize)
    full_rows = min(per_thread * rows_threads, _round_up(rows, rows_threads))
    if direction == "bwd" and wide_itemsize > itemsize:
        # a wide backward's slot also holds float32 dy (3x x's bytes in 16 bits): half the rows, so
        # that GPUs with 100 KB of shared memory per SM hold a slot (none held one of 4 rows per
        # thread: the plugin's residency model) and the H200 four instead of two. Its tiles keep the
        # full chunk height (two half chunks): half-height tiles doubled the tiles to combine, and
        # 2x320x64x64 bf16-autocast went from 39.7 to 47.4 us (H200, RESULTS.md session 12: 42.4 now)
        per_thread = max(1, per_thread // 2)
    chunk_rows = per_thread * rows_threads
    chunk_rows = min(chunk_rows, _round_up(rows, rows_threads))
    rows_per_tile = max(full_rows, _round_up(-(-rows // most), chunk_rows))
    rows_per_tile = min(rows_per_tile, rows)
    if batch * (channels // window) >= 2**31 or rows_per_tile >= 2**31:
        return None  # the kernels index tasks and a tile's rows in 32 bits
    return TaskTiling(
        direction=direction,
        channels=channels,
        groups=groups,
        rows=rows,
        batch=batch,
        itemsize=itemsize,
        window=window,
        vec=vec,
        cols_threads=cols,
        rows_threads=rows_threads,
        rows_per_tile=rows_per_tile,
        tiles_per_task=-(-rows // rows_per_tile),
        chunk_rows=chunk_rows,
        wide_itemsize=wide_itemsize if wide_itemsize != itemsize else 0,
    )


#: The small forward's geometry (`small_forward_tiling`; the sweeps turn it off to time the plain one).
#: Measured on an H100 (RESULTS.md session 55, scripts/geometry_sweep.py, fp16 SiLU, us, flushed L2):
#: 2x640x32x32 15.46 as 8 tasks of 22 one-chunk tiles (two launches) -> 12.75 as 16 tasks of 80 channels
#: in 6 tiles of 2 chunks (clusters of 6, 96 blocks); 2x320x64x64 17.60 as 4 teams of 66 -> 16.78 as 16
#: tasks of 40 channels in 6 tiles of 4 chunks (96 blocks). Every other geometry of those shapes was
#: slower, and those of 2x1280x16x16 (already 16 clusters of 6) and 1x512x128x128 (4 teams of 64) too.
SMALL_FORWARD_GEOMETRY = True
#: Blocks of a small forward's geometry (tasks x its most tiles per task): grids of 96 won all three shapes
#: above (as in the bare chains of scripts/chain_floor.py: 16 clusters of 6); smaller ones lost on
#: 2x320x64x64 (18.35 us at 80 blocks, 19.44 at 64, against 17.60), so none below 88. That bounds the
#: cap's grid, not the realized one: where the rows fill fewer tiles than the cap (8x128x28x28: 16 tasks
#: x 4 tiles, 64 blocks; 8x256x28x28: 80) the geometry still won, 6-10 % (H100, RESULTS.md session 56).
SMALL_FORWARD_GRID = 96
SMALL_FORWARD_MIN_GRID = 88
#: Most chunks of one of its tiles (a member keeps all of them on chip: 4 of 16 KB fit every profile).
SMALL_FORWARD_TILE_CHUNKS = 4
#: Narrowest row of its windows: 80 bytes (40 channels in 16 bits) won 2x320x64x64; 64-byte and narrower
#: rows lost everywhere (sessions 9 and 24).
SMALL_FORWARD_ROW_BYTES = 80


def _small_forward_candidates(t: TaskTiling) -> list[tuple[int, int]]:
    """(window, most tiles per task) of every small-forward geometry of the default tiling `t`'s shape:
    windows no wider than t's of whole groups, 16-byte rows of at least SMALL_FORWARD_ROW_BYTES, and teams
    of at most CLUSTER_MAX_TEAM whose blocks (batch x windows x most tiles: the shape's, whatever its rows)
    are SMALL_FORWARD_MIN_GRID to SMALL_FORWARD_GRID."""
    cpg = t.channels // t.groups
    found = []
    for w in range(cpg, t.window + 1, cpg):
        if t.channels % w or (w * t.itemsize) % VEC_BYTES or w * t.itemsize < SMALL_FORWARD_ROW_BYTES:
            continue
        tasks = t.batch * (t.channels // w)
        most = min(CLUSTER_MAX_TEAM, SMALL_FORWARD_GRID // tasks)
        if tasks * most >= SMALL_FORWARD_MIN_GRID:
            found.append((w, most))
    return found


def small_forward_tiling(t: TaskTiling) -> TaskTiling | None:
    """Another tiling for the default forward tiling `t` of a small tensor, or None: where `t`'s tasks
    have more tiles than a thread-block cluster holds (CLUSTER_MAX_TEAM), the geometry
    (`_small_forward_candidates`) whose tiles hold at most SMALL_FORWARD_TILE_CHUNKS chunks with the most
    blocks, the wider window among equals. Its teams fit clusters where the device holds them (the grid is
    the shape's, never the device's: the bits are the same on every GPU and cap). Only the 16-byte vector
    path; the plugin's inverse is `small_forward_rows`."""
    if t.direction != "fwd" or t.vec * t.itemsize != VEC_BYTES or t.tiles_per_task <= CLUSTER_MAX_TEAM:
        return None
    best: tuple[tuple[int, int], TaskTiling] | None = None
    for w, most in _small_forward_candidates(t):
        args = (t.channels, t.groups, t.rows, t.itemsize, "fwd", t.batch, True, t.wide_itemsize)
        c = _tiling_at(*args, w, most)
        if c is None or c.chunks_per_tile > SMALL_FORWARD_TILE_CHUNKS:
            continue
        key = (c.tasks * most, w)
        if best is None or key > best[0]:
            best = (key, c)
    return None if best is None else best[1]


def small_forward_rows(
    channels: int, groups: int, itemsize: int, batch: int = 1, aligned: bool = True
) -> range:
    """The rows per sample S whose forward takes `small_forward_tiling`, an interval: from where the default
    tasks have more than CLUSTER_MAX_TEAM tiles to the last S at which some geometry's tiles hold at most
    SMALL_FORWARD_TILE_CHUNKS chunks (a geometry of at most k tiles of chunk height h holds S <= 4 h k;
    below that bound, so does every shorter S)."""
    big = task_tiling(channels, groups, 1 << 30, itemsize, "fwd", aligned=aligned)
    if not SMALL_FORWARD_GEOMETRY or big is None or big.vec * itemsize != VEC_BYTES:
        return range(0)
    if max_tiles_per_task(channels, big.window, batch, "fwd") <= CLUSTER_MAX_TEAM:
        return range(0)
    # one-chunk tiles up to there, so at most 8 of them; beyond, more than 8 (tiles > most / 2 where tiles are
    # taller, and most >= 16 wherever a geometry exists: below, batch x windows > 128 tasks, more than 96)
    first = CLUSTER_MAX_TEAM * big.chunk_rows + 1
    probe = replace(big, batch=batch)
    last = 0
    for w, most in _small_forward_candidates(probe):
        c = _tiling_at(channels, groups, 1 << 30, itemsize, "fwd", batch, True, 0, w, most)
        if c is not None:
            last = max(last, SMALL_FORWARD_TILE_CHUNKS * c.chunk_rows * most)
    return range(first, last + 1) if last >= first else range(0)


def task_smem_bytes(t: TaskTiling, slots: int) -> int:
    """Dynamic shared memory of the task kernels (csrc TaskSmem): chunk slots (x, and dy in the
    backward), the column scratch (float2 per thread row and column), per-channel totals and
    (weight, bias), per-group (mean, rstd) and backward coefficients."""
    width = t.cols_threads * t.vec
    # fold_channels folds a warp's rows first when a warp holds whole rows (32 % columns == 0)
    scratch_pairs = (THREADS // 32 if 32 % t.cols_threads == 0 else t.rows_threads) * width
    if t.direction == "bwd":  # the apply launch folds its warps' dweight/dbias strips there (32 each)
        scratch_pairs = max(scratch_pairs, THREADS)
    scratch = scratch_pairs * 8
    return slots * t.slot_bytes + scratch + 2 * width * 8 + 2 * t.groups_per_window * 8


def task_slots(t: TaskTiling, smem_budget: int) -> int:
    """Chunk slots a block can hold within `smem_budget` bytes (1..MAX_SLOTS; 0 if not even one); a
    backward slot holds a chunk of x and one of dy."""
    fixed = task_smem_bytes(t, 0)
    return max(0, min(MAX_SLOTS, (smem_budget - fixed) // t.slot_bytes))


def task_smem_budget(limits: DeviceLimits, blocks_per_sm: int = TASK_BLOCKS_PER_SM) -> int:
    """Dynamic shared memory per block when `blocks_per_sm` blocks share an SM of `limits`."""
    return smem_budget(
        limits.smem_per_sm, limits.max_smem_per_block, limits.reserved_smem_per_block, blocks_per_sm
    )


def smem_budget(
    smem_per_sm: int,
    max_smem_per_block: int,
    reserved_per_block: int,
    blocks_per_sm: int = TASK_BLOCKS_PER_SM,
) -> int:
    """The same from raw device numbers (the launcher's local device): the SM's shared memory split
    `blocks_per_sm` ways, less the driver's reserve and the kernels' static 16 bytes (rounded up to 128)."""
    per_block = smem_per_sm // blocks_per_sm - reserved_per_block - 128
    return max(0, min(max_smem_per_block, per_block) // 128 * 128)


@dataclass(frozen=True)
class TaskTeams:
    """How a one-pass grid of `grid` blocks is split into teams that share tasks."""

    team_size: int
    teams: int
    rounds: int  # tasks per team, rounded up
    chunks_per_member: int  # the most chunks one member reduces per task
    overflow_chunks: int  # of those, the ones it cannot keep on chip (read again)


def member_tiles(tiles_per_task: int, team_size: int, member: int) -> tuple[int, int]:
    """The tiles [t0, t1) member `member` of a team reduces and applies (fwd_task_onepass uses the same
    formula): contiguous, balanced, every tile of the task exactly once."""
    return member * tiles_per_task // team_size, (member + 1) * tiles_per_task // team_size


def param_strips(t: TaskTiling) -> int:
    """The backward's dweight/dbias strips: BWD_STRIP_CHANNELS channels of one task each (csrc
    bwd_param_strips)."""
    return t.tasks * -(-t.window // BWD_STRIP_CHANNELS)


def strip_columns(t: TaskTiling) -> int:
    """The backward's strip columns: a sample's strips (csrc bwd_strip_column). A column's strips, one per
    sample, sum the same channels."""
    return (t.channels // t.window) * -(-t.window // BWD_STRIP_CHANNELS)


def column_totals(batch: int) -> bool:
    """Whether the two-launch backward's apply sums dweight/dbias by column (csrc bwd_param_sums): the last
    of a column's strips, counted on the column's sync word, sums its channels over the samples. A count
    stays below 2**GENERATION_BITS, so larger batches count the strips' blocks on one word, and the last
    block sums every channel. Same sums in the same order either way."""
    return batch < 1 << GENERATION_BITS


def busiest_block(teams: TaskTeams) -> int:
    """What `choose_teams` minimizes: the busiest block's traffic in chunks (read, write, re-read) plus a
    per-round overhead."""
    return teams.rounds * (2 * teams.chunks_per_member + teams.overflow_chunks + ROUND_OVERHEAD_CHUNKS)


#: Whether the backward's ties of `busiest_block` go to fewer rounds before the larger grid. On the H100's 264
#: resident blocks 8x256x56x56 fp16 ties 16 teams of 16 for one round (4 chunks, one re-read) with 8 teams of
#: 33 for two (2 chunks, none): the larger grid took the two rounds, no overflow, so `auto` two launches (40.7
#: us); taller tiles that give one round in one launch ran 35.2-37.6 us (RESULTS.md session 57). Teams change
#: no bits. With it (H100, session 58, three alternating rounds): 8x256x56x56 41.4 -> 38.1-39.8 us,
#: 4x512x64x64 45.6 -> 41.3, 16x128x56x56 36.9 -> 33.7-34.2, 32x256x28x28 -9 %, 8x512x64x64 even; fp32 -6
#: to -7 % where it changes the plan.
BACKWARD_FEWER_ROUNDS = True


def choose_teams(t: TaskTiling, blocks: int, slots: int) -> TaskTeams:
    """The team size that minimizes the busiest block's traffic (in chunks: read, write, re-read)
    plus a per-round overhead, for `blocks` resident blocks that hold `slots` chunks each; among
    equals, in the backward the one of fewer rounds (BACKWARD_FEWER_ROUNDS), then the one that launches the
    most blocks."""
    if blocks < 1 or slots < 1:
        raise ValueError(f"need blocks >= 1 and slots >= 1, got {blocks} and {slots}")
    best: tuple[float, TaskTeams] | None = None
    for m in range(1, min(t.tiles_per_task, blocks) + 1):
        teams = min(blocks // m, t.tasks)
        rounds = -(-t.tasks // teams)
        chunks = -(-t.tiles_per_task // m) * t.chunks_per_tile
        overflow = max(0, chunks - slots)
        candidate = TaskTeams(m, teams, rounds, chunks, overflow)
        # ties go to the larger grid: the same busiest block, but more SMs streaming; in the backward, first
        # to fewer rounds (BACKWARD_FEWER_ROUNDS)
        fewer = candidate.rounds if BACKWARD_FEWER_ROUNDS and t.direction == "bwd" else 0
        cost = (busiest_block(candidate), fewer, -m * teams)
        if best is None or cost < best[0]:
            best = (cost, candidate)
    assert best is not None
    return best[1]


#: The team stagger's automatic setting (the default since session 21; ops.team_stagger): the plans whose
#: one launch, staggered, beat the two launches in session 20's sweep (RESULTS.md: 32x128x256x256
#: 381-402 us against 418, 64x128x128x128 201-206 against 211, 32x256x128x128 192-198 against 204; not
#: where a plan had 2 teams or kept every chunk on chip, e.g. 16x128x256x256, 8x512x128x128), and a
#: stagger of a third of a round at copy speed (the sweep's best was 6-16 us, a quarter to a half of a
#: round).
STAGGER_MIN_TEAMS = 4
STAGGER_MIN_ROUNDS = 4
#: Teams x chunks each member re-reads, at least: 4 teams re-reading 2 chunks each (16x256x128x256,
#: 32x64x256x256 G16, 32x128x128x256) were as often slower as faster staggered (session 20, call 5).
STAGGER_MIN_TEAM_REREADS = 16
STAGGER_ROUND_FRACTION = 1 / 3
#: H200 copy bandwidth (read + write, bytes per ns): only the stagger's scale, where a slower GPU's
#: rounds take longer and its stagger stays shorter than a third of one.
STAGGER_COPY_BYTES_PER_NS = 4250


#: The backward's rounds must also be long: members of at least this many chunk pairs. Session 22, H200,
#: fp16 and bf16, two rounds each, auto stagger against the two launches: 7-8 pairs won 5-18 %
#: (128x128x128x128 8 teams 656 -> 586-593 us, 96x128x128x128 7 teams 537-542 -> 445-472,
#: 64x128x256x128 4 teams 655-658 -> 617-623); 4 pairs did not (16 teams of 16 for 8-16 rounds:
#: 64x256x64x64 +4 %, 256x128x64x64, 128x256x64x64, 64x512x64x64 -3 to +0.3 %).
STAGGER_MIN_BWD_CHUNKS = 7


#: A backward one launch of two teams (the L2 rule's 32x128x256x256) takes turns too, at half a round: the
#: one team reads while the other waits and writes. Session 48, H200, fp16, its one launch at 12 / 16 / 20 /
#: 24 us: 612 / 602 / 614 / 622 us, unstaggered 612-625 (16 us again: 602, 605); session 49, H100, 16 us:
#: 770, 779 against 808-840. Half of its round is 16.8 us.
STAGGER_PAIR_ROUND_FRACTION = 1 / 2


def backward_pair_stagger(teams: TaskTeams, direction: str) -> bool:
    """Whether a backward one launch of exactly two teams takes the automatic stagger (at
    STAGGER_PAIR_ROUND_FRACTION of a round): several rounds of long members that re-read. Unlike
    `stagger_fits` this does not make `auto` take the one launch; it staggers one taken for other reasons
    (`l2_backward_one_launch`)."""
    return (
        direction == "bwd"
        and teams.teams == 2
        and teams.rounds >= STAGGER_MIN_ROUNDS
        and teams.chunks_per_member >= STAGGER_MIN_BWD_CHUNKS
        and teams.overflow_chunks > 0
    )


def stagger_fits(teams: TaskTeams, direction: str = "fwd") -> bool:
    """Whether a one-launch plan of these teams takes the automatic team stagger: enough teams to take
    turns and enough rounds to settle, and members that read enough chunks again (the staggered plans
    that kept everything on chip lost to the two launches); in the backward, rounds long enough to
    carry their wait (STAGGER_MIN_BWD_CHUNKS)."""
    return (
        teams.teams >= STAGGER_MIN_TEAMS
        and teams.rounds >= STAGGER_MIN_ROUNDS
        and teams.teams * teams.overflow_chunks >= STAGGER_MIN_TEAM_REREADS
        and (direction == "fwd" or teams.chunks_per_member >= STAGGER_MIN_BWD_CHUNKS)
    )


def auto_stagger_ns(p: TaskPlan) -> int:
    """The automatic stagger of plan `p`: STAGGER_ROUND_FRACTION of a round's traffic (every member reads
    its chunks, re-reads its overflow and writes; the backward reads x and dy) at
    STAGGER_COPY_BYTES_PER_NS; STAGGER_PAIR_ROUND_FRACTION for two backward teams
    (`backward_pair_stagger`)."""
    tm = p.teams
    if tm is None:
        return 0
    if p.direction == "fwd":  # x read, y written, overflow x re-read
        chunk_traffic = 2 * tm.chunks_per_member + tm.overflow_chunks
    else:  # x and dy read, dx written, overflow x and dy re-read
        chunk_traffic = 3 * tm.chunks_per_member + 2 * tm.overflow_chunks
    round_bytes = tm.teams * tm.team_size * chunk_traffic * p.tiling.chunk_bytes
    share = STAGGER_PAIR_ROUND_FRACTION if backward_pair_stagger(tm, p.direction) else STAGGER_ROUND_FRACTION
    return max(1, round(share * round_bytes / STAGGER_COPY_BYTES_PER_NS))


def cluster_shape(t: TaskTiling, teams: TaskTeams) -> bool:
    """Whether one-launch forward teams of this shape may run as thread-block clusters: one round (one
    task per team, so the grid is tasks x team size, one cluster each) of teams of at most
    CLUSTER_MAX_TEAM blocks (csrc fwd_task_cluster; `cluster_teams_fit` for a plan)."""
    return (
        t.direction == "fwd"
        and teams.rounds == 1
        and teams.teams == t.tasks
        and 1 < teams.team_size <= CLUSTER_MAX_TEAM
    )


def flag_teams_lose(t: TaskTiling, teams: TaskTeams, clusters: bool) -> bool:
    """Whether a one-round forward of these teams loses to the two launches where the apply launch starts
    as a dependent launch (sm_90 builds): its members hold one chunk each, so the stats they stream are
    short, and they meet at a flag in global memory (not at a cluster's barrier: `clusters` says whether
    this build runs them as clusters). Session 22, H200, fp16 and bf16, two rounds each: one launch
    0.3-0.6 us slower on 1x640x32x32, 2x640x32x32, 2x960x32x32 (13.8-16.4 against 13.3-16.1 us) and on
    2x1280x16x16 without clusters (13.6 against 13.2); as fast where members hold 2-4 chunks (4x640x32x32,
    2x1280x32x32, 2x320x64x64, 1x512x128x128); 1.0-1.2 us faster as clusters (2x1280x16x16).
    Not modeled: the launcher runs a grid of clusters as flag teams where the device cannot hold all of
    them at once (csrc launch_clusters), which this rule cannot see; session 29 measured one such plan,
    16x512x16x16's 64 teams of 4, 0.3 us slower in one launch (15.14 against 14.82 us), and the
    clusters of 2 of 16x1280x8x8, 32x640x8x8, 64x320x8x8 (all resident) 2-2.6 us faster."""
    return (
        t.direction == "fwd"
        and teams.rounds == 1
        and teams.chunks_per_member == 1
        and teams.team_size > 1  # (a team of one waits for nobody)
        and not (clusters and cluster_shape(t, teams))
    )


def choose_task_schedule(
    t: TaskTiling,
    blocks: int,
    slots: int,
    backward_onepass: bool = False,
    staggered: bool = False,
    dependent_apply: bool = False,
    clusters: bool = False,
    l2_keep_bytes: int = 0,
) -> int:
    """passes="auto" for the task kernels with `blocks` resident one-pass blocks: one launch when the
    whole tensor fits on chip at once (one round per team, nothing read twice), else two launches.

    Measured on the H200 (RESULTS.md, commit 7c83c1b): one-pass is 5-20 % faster where it holds
    everything in one round (16 MiB and below), and 5-36 % slower once a team needs several rounds
    (their phases do not overlap: 32x128x256x256, 1x512x256x256) or overflows (1x128x1024x2048).
    The backward takes the same rule with `backward_onepass` (GN_ARCH=tasks+bwd1, opt-in), else two launches:
    its one-pass kernel passes the GPU suite, but with dependent launches the two launches are 1-2.7 us
    faster on the small shapes (RESULTS.md session 18: 2x1280x16x16 22.5 against 25.0 us); only
    1x512x128x128 is faster in one launch (39.5 against 40.7 us).
    `staggered` (GN_TEAM_STAGGER=auto, the default): also one launch where its teams take the automatic
    stagger (`stagger_fits`), in either direction. Forward: session 21, H200, 4-16 % faster on the 12
    shapes it takes. Backward: 5-18 % faster on the 3 shapes it takes (STAGGER_MIN_BWD_CHUNKS), where
    the two launches re-read all of x and dy and the one launch 4-5 of each member's 7-8 chunk pairs.
    `dependent_apply` (the two launches' apply launch is a dependent launch: sm_90 builds) and `clusters`
    (this build runs cluster teams): two launches where the one-round forward's teams lose to them
    (`flag_teams_lose`). `l2_keep_bytes` (the kernels' L2 hints: GnArgs.l2_keep_bytes where L2_HINTS, else
    0): also one launch for a one-round forward whose overflow L2 mostly keeps (`l2_keeps_overflow`), and
    with L2_BACKWARD_ONE_LAUNCH for a backward of any rounds that reads little twice from DRAM
    (`l2_backward_one_launch`).
    """
    if blocks < 1:
        return 2
    teams = choose_teams(t, blocks, slots)
    if staggered and stagger_fits(teams, t.direction):
        return 1
    if L2_BACKWARD_ONE_LAUNCH and l2_backward_one_launch(t, teams, l2_keep_bytes):
        return 1
    if t.direction == "bwd" and not backward_onepass:  # its one-pass kernel is opt-in
        return 2
    if dependent_apply and flag_teams_lose(t, teams, clusters):
        return 2
    if teams.rounds == 1 and t.direction == "fwd" and l2_keeps_overflow(t, teams, l2_keep_bytes):
        return 1
    return 1 if teams.rounds == 1 and teams.overflow_chunks == 0 else 2


@dataclass(frozen=True)
class TaskPlan:
    """One launch of the task kernels: what `ops` fills GnArgs from and the plugin reads."""

    tiling: TaskTiling
    schedule: int  # 1 = one launch (teams, chunks kept on chip), 2 = stats launch + apply launch
    slots: int
    residency: int  # co-resident one-pass blocks on the device (0: one-pass impossible)
    cap: int | None
    grid: int  # blocks launched: teams x team size
    teams: TaskTeams | None  # the persistent teams of both schedules
    workspace_floats: dict[str, int] = field(default_factory=dict)
    arch: int = 2

    @property
    def direction(self) -> str:
        return self.tiling.direction

    @property
    def batch(self) -> int:
        return self.tiling.batch

    @property
    def tiles(self) -> int:
        return self.tiling.tiles

    @property
    def overflow_tiles(self) -> int:
        """Tiles beyond one per launched block (as in the tile architecture's plans)."""
        return max(0, self.tiles - self.grid)

    @property
    def reread_tiles(self) -> int:
        """Tiles the one-pass kernel reads twice (a member's chunks beyond its slots: the task
        architecture's real overflow); the two-pass kernels read every tile twice by design, 0."""
        if self.schedule == 2 or self.teams is None:
            return 0
        t, m = self.tiling, self.teams.team_size
        per_task = 0
        for member in range(m):
            t0, t1 = member_tiles(t.tiles_per_task, m, member)
            over = max(0, (t1 - t0) * t.chunks_per_tile - self.slots)  # its first `over` chunks
            per_task += -(-over // t.chunks_per_tile)
        return per_task * t.tasks

    @property
    def waves(self) -> int:
        return -(-self.tiles // self.grid) if self.grid else 0

    @property
    def smem(self) -> int:
        return task_smem_bytes(self.tiling, self.slots)

    @property
    def sync_words(self) -> int:
        """Persistent synchronisation words: (arrivals, flag, column count) per task (csrc
        kSyncWordsPerTask), and for the two-launch backward's column totals (`column_totals`) as many
        column words as it has strip columns."""
        t = self.tiling
        words = t.tasks
        if self.direction == "bwd" and self.schedule == 2 and column_totals(t.batch):
            words = max(words, strip_columns(t))
        return SYNC_WORDS_PER_TASK * words

    @property
    def workspace_bytes(self) -> int:
        return 4 * sum(self.workspace_floats.values())

    @property
    def param_strips(self) -> int:
        """The backward's dweight/dbias strips (`param_strips`); 0 for the forward."""
        return param_strips(self.tiling) if self.direction == "bwd" else 0

    @property
    def strip_blocks(self) -> int:
        """Blocks the two-launch backward's apply launch adds after its grid for the dweight/dbias strips
        (GnArgs.strip_blocks, where ops.strip_blocks allows): one per strip, where they fit beside the
        grid in one wave of resident blocks, so that no dx block waits for a strip or for the totals.
        0 (every block sums its share behind its first dx copies) where they do not fit, for the
        forward and for the one launch. Which block sums a strip changes no bits."""
        if self.direction != "bwd" or self.schedule != 2:
            return 0
        resident = self.residency if self.cap is None else min(self.residency, self.cap)
        strips = self.param_strips
        return strips if self.grid + strips <= min(resident, (1 << GENERATION_BITS) - 1) else 0

    def describe(self) -> dict:
        out = asdict(self)
        out.update(
            smem=self.smem,
            workspace_bytes=self.workspace_bytes,
            tiles=self.tiles,
            reread_tiles=self.reread_tiles,
            strip_blocks=self.strip_blocks,
        )
        return out


def room_for_strips(t: TaskTiling, teams: TaskTeams, blocks: int) -> TaskTeams:
    """The two-launch backward's teams on fewer blocks where that leaves one wave's room for a strip block
    per dweight/dbias strip (`TaskPlan.strip_blocks`) at no cost to the busiest block (`busiest_block`):
    e.g. 2x320x64x64 on 264 blocks, 4 teams of 61 instead of 66, each member still 2 tiles, beside 20 strip
    blocks. Otherwise `teams`. Which block reduces which tile changes no bits."""
    strips = param_strips(t)
    if teams.teams * teams.team_size + strips <= blocks or strips >= blocks:
        return teams
    narrow = choose_teams(t, blocks - strips, TWO_PASS_NO_OVERFLOW)
    return narrow if busiest_block(narrow) <= busiest_block(teams) else teams


def make_task_plan(
    t: TaskTiling,
    schedule: int,
    slots: int,
    residency: int,
    cap: int | None = None,
    strip_room: bool = False,
) -> TaskPlan:
    """Grid, teams and workspace of the task kernels for `t`, with `slots` chunks per block and
    `residency` co-resident one-pass blocks on the device. `strip_room`: the two-launch backward's teams
    leave room for its strip blocks where that costs nothing (`room_for_strips`); the launcher asks for it
    unless ops.strip_room says otherwise (on by default). The plugin's cases run without it."""
    if schedule not in (1, 2):
        raise ValueError(f"schedule must be 1 (one-pass) or 2 (two-pass), got {schedule!r}")
    if cap is not None and cap < 1:
        raise ValueError(f"residency cap must be >= 1, got {cap}")
    if not 1 <= slots <= MAX_SLOTS:
        raise ValueError(f"slots must be in 1..{MAX_SLOTS}, got {slots}")
    if t.direction == "fwd":  # (sum, sum of squares) per (task, group of the window, tile)
        workspace = {"partials": 2 * t.tasks * t.groups_per_window * t.tiles_per_task}
    else:  # (sum dz, sum dz * xhat) per (task, tile, channel), per (sample, channel), per (sample, group);
        # (sum w dz, sum w dz xhat) per (task, tile, group)
        workspace = {
            "partials": 2 * t.tasks * t.tiles_per_task * t.window,
            "channel_sums": 2 * t.batch * t.channels,
            "group_sums": 2 * t.batch * t.groups,
            "group_partials": 2 * t.tasks * t.tiles_per_task * t.groups_per_window,
        }
    most = (1 << GENERATION_BITS) - 1  # blocks of one launch (no GPU holds as many)
    if schedule == 1:
        blocks = min(most, residency if cap is None else min(residency, cap))
        if blocks < 1:
            raise ValueError("the one-pass schedule needs at least one resident block")
        teams = choose_teams(t, blocks, slots)
    else:
        # the same persistent teams, one wave of blocks (or the cap's: nobody waits, so any grid
        # works, and a cap varies it in tests); nothing is kept on chip (every chunk is read twice
        # by design: no overflow to weigh)
        blocks = max(1, min(most, residency if cap is None else min(residency, cap)))
        teams = choose_teams(t, blocks, TWO_PASS_NO_OVERFLOW)
        if strip_room and t.direction == "bwd":
            teams = room_for_strips(t, teams, blocks)
    grid = teams.teams * teams.team_size
    return TaskPlan(
        tiling=t,
        schedule=schedule,
        slots=slots,
        residency=residency,
        cap=cap,
        grid=grid,
        teams=teams,
        workspace_floats=workspace,
    )


def cluster_teams_fit(p: TaskPlan) -> bool:
    """Whether the one-launch forward of plan `p` may run its teams as thread-block clusters: one round
    (one task per team, so the grid is tasks x team size, one cluster each) of teams of at most
    CLUSTER_MAX_TEAM blocks. The plan, and so the tiles, partials and bits, are the same either way."""
    return p.schedule == 1 and p.teams is not None and cluster_shape(p.tiling, p.teams)


def team_stagger(p: TaskPlan, ns: int | str, phases: int = 2) -> tuple[int, int]:
    """(stagger_ns, stagger_phases) of GnArgs for plan `p` when a team stagger of `ns` nanoseconds in `phases`
    phases is asked for (ops.team_stagger): team j of a one-launch plan starts its first task (j % phases)
    * ns late. ns="auto": `auto_stagger_ns` where the teams fit `stagger_fits` or `backward_pair_stagger`,
    else none. Only a plan of several teams that each run several rounds has teams that can take turns;
    any other plan gets (0, 0). The tiles, their order and so the bits are the same either way. (Session
    20, H200: 32x128x256x256 in 4 teams of 64 at 16 us in 2 phases, 381-386 us against 410-414 unstaggered
    and 418-420 us for the two launches; benchmarks/RESULTS.md. Staggering one-round plans lost, session
    44: 1x512x128x128 23.2 us unstaggered, 23.3-26.8 us at 1.5-5 us in 2 phases.)"""
    if ns == "auto":
        auto = p.teams is not None and (
            stagger_fits(p.teams, p.direction) or backward_pair_stagger(p.teams, p.direction)
        )
        ns = auto_stagger_ns(p) if auto else 0
    if not isinstance(ns, int) or not isinstance(phases, int) or ns < 0 or phases < 1:
        raise ValueError(f"a team stagger needs ns >= 0 or 'auto' and phases >= 1, got {ns!r} and {phases!r}")
    teams = p.teams
    staggered = (
        ns > 0
        and phases > 1
        and p.schedule == 1
        and teams is not None
        and teams.teams > 1
        and teams.rounds > 1
    )
    return (min(ns, 2**31 - 1), phases) if staggered else (0, 0)


def task_member_chunks(t: TaskTiling, team_size: int) -> tuple[int, ...]:
    """Chunks each member of a team of `team_size` reduces (and applies) of every task: its tiles
    (`member_tiles`) times chunks_per_tile. Chunks past the task's last row count, as in the kernels
    (member_stats and member_apply count them; they hold no rows)."""
    return tuple(
        (t1 - t0) * t.chunks_per_tile
        for t0, t1 in (member_tiles(t.tiles_per_task, team_size, m) for m in range(team_size))
    )


def task_reread_chunks(p: TaskPlan) -> int:
    """Chunks the launch reads from global memory a second time, summed over its blocks: what the
    launch record's ``chunks_reread`` counts. One-pass: each member's chunks of each of its tasks
    beyond its `slots` (it keeps the last min(slots, chunks) on chip); two-pass: every chunk (the
    apply launch keeps none)."""
    t = p.tiling
    if p.teams is None:
        return 0
    if p.schedule == 2:
        return t.tasks * t.tiles_per_task * t.chunks_per_tile
    return t.tasks * sum(max(0, c - p.slots) for c in task_member_chunks(t, p.teams.team_size))


def task_rows_for_tiles(
    channels: int,
    groups: int,
    itemsize: int,
    tiles_per_task: int,
    chunks_per_tile: int,
    *,
    aligned: bool = True,
    batch: int = 1,
    direction: str = "fwd",
) -> range:
    """Every S (rows per sample) whose `task_tiling` of `batch` samples in `direction` has exactly
    `tiles_per_task` tiles of `chunks_per_tile` chunks of the full chunk height (a large tensor's
    chunk_rows): the inverse of `task_tiling`, empty when there is none (or the task kernels do not
    cover the channels).

    `task_tiling` makes tiles of one chunk up to `max_tiles_per_task` (most) chunks per task, and beyond
    that tiles of ceil(S / most) rows rounded up to whole chunks; a slice shorter than a chunk gets a
    shorter chunk. The ends of the range are checked against `task_tiling` itself.
    """
    big = task_tiling(channels, groups, 1 << 30, itemsize, direction, aligned=aligned)
    if big is None:
        return range(0)
    tiles, q = tiles_per_task, chunks_per_tile
    cr, rt, most = (
        big.chunk_rows,
        big.rows_threads,
        max_tiles_per_task(channels, big.window, batch, direction),
    )
    if not 1 <= tiles <= most or q < 1:
        return range(0)
    lo, hi = (tiles - 1) * q * cr + 1, tiles * q * cr
    if q == 1:
        lo, hi = max(lo, cr - rt + 1), min(hi, most * cr)  # shorter slices get shorter chunks
    else:
        lo, hi = max(lo, most * (q - 1) * cr + 1), min(hi, most * q * cr)
    if direction == "fwd":  # (not the rows whose forward takes the small geometry)
        small = small_forward_rows(channels, groups, itemsize, batch, aligned)
        if small and lo in small:
            lo = max(lo, small.stop)
        if small and hi in small:
            return range(0)
    if lo > hi:
        return range(0)
    for rows in (lo, hi):
        t = task_tiling(channels, groups, rows, itemsize, direction, aligned=aligned, batch=batch)
        if t is None or (t.tiles_per_task, t.chunks_per_tile, t.chunk_rows) != (tiles, q, cr):
            raise RuntimeError(f"task_rows_for_tiles disagrees with task_tiling at S={rows}: {t}")
    return range(lo, hi + 1)


def task_model(limits: DeviceLimits, res: KernelResources, t: TaskTiling) -> tuple[int, int]:
    """(slots, co-resident one-pass blocks) of the task kernels for `t` on a described device (the arch
    sweep's emulation; ops asks the device at hand): the chunks a block keeps within
    `task_smem_budget(limits)`, and blocks per SM for that shared memory and `res` (fwd_task_onepass's
    registers) times the SM count. (0, 0) when not even one chunk fits."""
    slots = task_slots(t, task_smem_budget(limits))
    if slots < 1:
        return 0, 0
    return slots, blocks_per_sm(limits, res, THREADS, task_smem_bytes(t, slots)) * limits.sm_count
