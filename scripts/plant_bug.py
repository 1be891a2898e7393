"""Copy csrc/ to a temporary folder with one named bug planted, print the folder's path.

    python scripts/plant_bug.py all-archs        # every overflow tile skips the backward reductions
    python scripts/plant_bug.py --list           # every planting: name, file, the bug, its catchers
    python scripts/plant_bug.py --check          # exit 1 if a planting site is gone (CPU test too)
    python scripts/plant_bug.py --select NAME    # the -k expression of the cases that exercise it

Point GN_CSRC_DIR at the printed folder to build and run the kernels with the bug (planted_bug.sh,
planted_sm80_sweep.sh, issue11_gpu.sh). Each planting names its file, the exact source text it
replaces (the *site*, which must occur exactly once) and what replaces it; when the kernels are
rewritten, move the sites here (tests/test_plugin_plant_bug.py fails while one is missing).
Exits 1 if the planting site is gone, 2 on a bad argument.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CSRC = Path(__file__).resolve().parents[1] / "csrc"


@dataclass(frozen=True)
class Planting:
    file: str  # under csrc/
    site: str  # source text that must occur exactly once
    replacement: str  # what the site becomes
    bug: str  # one line: what goes wrong
    select: str  # pytest -k expression: the local suite cases that exercise it (the demo runs these)
    blind_before: bool  # True when the suite before issue 11 had no case that could catch it


# Sites: the calls and lines the plantings hook into. Named once, so a kernel rewrite moves them here.
BWD_ONEPASS_TILE_CALL = (
    "    bwd_tile<T, V, kBatchOnepassBackward>(a, t, is_last ? keep_x : nullptr, "
    "is_last ? keep_dy : nullptr, scratch);"
)
FWD_ONEPASS_TILE_CALL = "    fwd_tile<T, V, kBatchOnepassForward>(a, t, is_last ? keep : nullptr, scratch);"
TILE_OFFSET = "  __device__ int64_t offset(const GnArgs& a) const { return (n * a.s + row0) * a.c; }"
TILE_SAMPLE = "    n = tile / a.tiles_per_slice;"
TASK_FINISH_TILE = "          finish_tile<T, V>(a, lane, sm, s1, s2, parts + tile, tiles);"
# fwd_task_onepass: a member's tiles, before its rounds
FWD_TASK_MEMBER_TILES = (
    "    // schedule.member_tiles: contiguous, balanced, every tile of the task exactly once"
)
# member_stats: a chunk's rows summed from its slot
TASK_STATS_ROWS = (
    "        if (lane.active) {\n"
    "          accumulate_rows<T, V, kFullRowsIn<kOneLaunch>>(mine + slot * sm.slot_elems, sstep, rt, "
    "tc.limit(q), shift, s1,\n"
    "                                                         s2);\n"
    "        }"
)
# member_bwd_stats: a tile's per-channel partial written to the workspace
TASK_BWD_TILE_PARTIAL = (
    "          write_tile_partials(a, sm.chan, sm.param, sm.grp, parts + tile * a.window,\n"
    "                              gparts + (kBwdGroupMajor ? tile : tile * gw), "
    "kBwdGroupMajor ? a.tiles_per_task : 1);"
)
GROUPS_OF_VECTOR = "  for (int v = 0; v < V; ++v) g[v] = first == last ? first : (c + v) / d;"

PLANTINGS = {
    "all-archs": Planting(
        "gn_backward.cu", BWD_ONEPASS_TILE_CALL,
        "    if (t >= gridDim.x) continue;  // PLANTED: overflow tiles skip the reductions\n"
        + BWD_ONEPASS_TILE_CALL,
        "one-pass backward: every overflow tile skips the reductions",
        "bwd and not x1-", False,
    ),
    "sm80": Planting(
        "gn_backward.cu", BWD_ONEPASS_TILE_CALL,
        "#if __CUDA_ARCH__ == 800\n"
        "    if (t == gridDim.x) continue;  // PLANTED: first overflow tile skips them\n"
        "#endif\n" + BWD_ONEPASS_TILE_CALL,
        "one-pass backward, sm_80 only: the first overflow tile skips the reductions",
        "A100 and bwd", False,
    ),
    "onepass-int32": Planting(
        "gn_kernels.cuh", TILE_OFFSET,
        "  __device__ int64_t offset(const GnArgs& a) const {\n"
        "    // PLANTED: 32-bit element offsets in overflow launches (wrapped into range: wrong, no crash)\n"
        "    const int64_t o = (n * a.s + row0) * a.c;\n"
        "    return gridDim.x < a.n * a.tiles_per_slice ? (o & 0x7fffffff) : o;\n"
        "  }",
        "one-pass launches with overflow tiles only: element offsets kept in 31 bits (two-pass untouched)",
        "2_31", True,
    ),
    "scalar-overflow-drop": Planting(
        "gn_backward.cu", BWD_ONEPASS_TILE_CALL,
        "    if (V == 1 && t >= gridDim.x) continue;  // PLANTED: scalar path drops overflow tiles\n"
        + BWD_ONEPASS_TILE_CALL,
        "one-pass backward, scalar path (C not a multiple of the vector width) only: overflow tiles "
        "skip the reductions",
        "bwd and (c100g20 or c30g10) and not x1-", True,
    ),
    "partial-tile-drop": Planting(
        "gn_forward.cu", FWD_ONEPASS_TILE_CALL,
        "    if (t >= gridDim.x && t % a.tiles_per_slice == a.tiles_per_slice - 1 && a.s % a.rows_per_tile)\n"
        "      continue;  // PLANTED: a partial last tile that is an overflow tile skips the reductions\n"
        + FWD_ONEPASS_TILE_CALL,
        "one-pass forward: the partial last tile of a slice, when it is an overflow tile, skips the "
        "reductions and is never applied",
        # not blind before: on the H200 the old suite's backward cases x2p1/x4p3 caught it (12 of
        # 96), through the forward they run first
        "fwd and partial and not x1-", False,
    ),
    "sample-boundary": Planting(
        "gn_kernels.cuh", TILE_SAMPLE,
        "    n = (tile >= gridDim.x ? blockIdx.x : tile) / a.tiles_per_slice;  // PLANTED: overflow tiles\n"
        "    // take the sample of the block's first tile",
        "one-pass with overflow: an overflow tile is read as part of its block's first sample",
        "batch and not x1-", False,
    ),
    "group-straddle": Planting(
        "gn_kernels.cuh", GROUPS_OF_VECTOR,
        "  for (int v = 0; v < V; ++v) g[v] = first;  // PLANTED: a vector takes its first channel's group",
        "a 16-byte vector whose channels span several groups uses its first channel's group for all "
        "(both schedules)",
        "c32g32 or (c100g20 and fp32)", True,
    ),
    "task-overflow-drop": Planting(
        "gn_task_forward.cuh", TASK_FINISH_TILE,
        "          // PLANTED: a member that cannot keep all its chunks loses its first tile\n"
        "          if (!(chunks > a.slots && tile == t0))\n"
        "            finish_tile<T, V>(a, lane, sm, s1, s2, parts + tile, tiles);",
        "task kernels (GN_ARCH=tasks): a block with more chunks than slots (overflow) never publishes its "
        "first tile's partial; caught by scripts/task_forward_check.py (caps 1-7)",
        "fwd and not x1-", True,
    ),
    "task-bwd-overflow-drop": Planting(
        "gn_task_backward.cuh", TASK_BWD_TILE_PARTIAL,
        "          // PLANTED: a member with several tiles of a task never writes its last tile's partials\n"
        "          if (!(t1 - t0 > 1 && tile == t1 - 1))\n"
        "  " + TASK_BWD_TILE_PARTIAL,
        "task backward (GN_ARCH=tasks+bwd): a member with more than one tile of a task never writes its last "
        "tile's partial, so the combine sums the workspace's poison (NaN) or a stale value",
        # every backward task case whose runs (its cap, then caps 1 and 2 below it) give a member two
        # tiles: all but the x1 cases of one tile per task (tests/test_plugin_tasks_bwd.py counts them)
        "bwd-tasks", True,
    ),
    "bwd-cold-rows-first-row": Planting(
        "gn_task_backward.cuh",
        "  for (int i = 0; i < R; ++i, r += rows_threads, sx += sstep, sd += sstep) {\n"
        "    if (r < limit) row(sx, sd);",
        "  for (int i = 0; i < R; ++i, r += rows_threads, sx += sstep, sd += sstep) {\n"
        "    if (kRowAtATime && i == 0) continue;  // PLANTED: the cold variant skips a thread's first row\n"
        "    if (r < limit) row(sx, sd);",
        "task backward stats, the cold variant only (bwd_task_stats<..., kColdRows>: plans whose busiest "
        "member reads fewer than 4 chunks per task, csrc cold_stats_rows): each thread's first row of a "
        "chunk is left out of the dweight/dbias and group sums; the warm variant (capped runs, larger "
        "shapes) is correct, so the bitwise comparisons across caps and the fp64 references of the small "
        "shapes go red",
        "bwd", False,
    ),
    "task-bwd1-reread-skip": Planting(
        "gn_task_backward.cuh", "    if (q < 0 || q >= fresh) return 0;",
        "    if (q < 0 || q >= fresh || kept > 0) return 0;  // PLANTED: no overflow read again",
        "task backward one-pass (GN_ARCH=tasks+bwd1): a member with more chunk pairs than slots never reads "
        "the ones it could not keep again, so their dx comes from whatever its slots still hold",
        # tests/gpu/test_task_backward_onepass.py: the capped runs and shapes whose members wrap their ring
        "onepass and (caps or 300x257 or 96x96)", False,
    ),
    "task-bwd1-param-clobbered": Planting(
        "gn_backward_onepass.cu", "      if (first) trace_point(a, 6);\n",
        "      if (first) trace_point(a, 6);\n"
        "      for (int i = threadIdx.x; i < a.window; i += kThreads) {  // PLANTED\n"
        "        sm.param[i] = make_float2(1.f, 0.f);\n"
        "      }\n"
        "      __syncthreads();\n",
        "task backward one-pass: the task's (weight, bias) in shared memory are overwritten between its "
        "stats and its apply, which reuses them (exp/bwd1-coefs-kept), so dx is that of weight 1",
        "onepass", False,
    ),
    "task-bwd-strips-count": Planting(
        "gn_task_backward.cuh",
        "    if (by_column && arrive(columns(a, bwd_strip_column(a, task, j, per_task)), "
        "static_cast<unsigned>(a.n))) {",
        "    if (by_column && arrive(columns(a, bwd_strip_column(a, task, j, per_task)), "
        "static_cast<unsigned>(a.n + 1))) {  // PLANTED: one strip too many",
        "task backward apply launch: each strip column's last strip is awaited as if the batch had one more "
        "sample, so nobody writes the column totals and dweight/dbias keep the workspace's poison (every "
        "two-launch backward with parameter gradients; from session 60 on, the totals go by column: "
        "schedule.column_totals)",
        "bwd-tasks", False,
    ),
    "task-bwd-column-word": Planting(
        "gn_task_backward.cuh",
        "  return (task - task_sample(a, task) * windows_per_sample(a)) * per_task + j;",
        "  return j;  // PLANTED: the window left out",
        "task backward apply launch: a strip's column word leaves out the strip's window, so the windows "
        "of a sample count on the same words; every n-th arrival sums whichever column arrived, some "
        "before all their samples' strips are written, and other columns are never summed: dweight/dbias "
        "wrong or poisoned wherever a sample has several windows",
        "bwd-tasks", False,
    ),
    "task-bwd-strip-blocks-late": Planting(
        "gn_task_backward.cuh",
        "  const int first = a.strip_blocks > 0 ? a.grid : 0;  // this launch's strip blocks",
        "  const int first = a.strip_blocks > 0 ? a.grid + 1 : 0;  // PLANTED: one block late",
        "task backward apply launch with strip blocks (schedule.TaskPlan.strip_blocks): the strips start one "
        "block late, so the last strip is never summed, its channels' sums stay poisoned and nobody writes "
        "the totals: dweight/dbias keep the workspace's poison where the strips fit beside the grid "
        "(tests/gpu/test_strip_blocks.py; the plugin's uncapped bwd-tasks cases of small shapes)",
        "bwd-tasks", False,
    ),
    "wide-pair-swap": Planting(
        "gn_task_forward.cuh", "  __stcs(odd ? p + 1 : p + 2, odd ? hi : got);",
        "  __stcs(odd ? p + 1 : p + 2, odd ? got : hi);  // PLANTED: wrong half",
        "wide forward under autocast (float32 y stored by lane pairs): each lane's second store takes the "
        "other half, so half of every lane pair's 64 bytes of y are wrong where a row has an even number "
        "of column threads (tests/gpu/test_autocast_wide.py, the plugin's fwd-tasksw cases)",
        "fwd-tasksw", False,
    ),
    "act-gelu-grad": Planting(
        "gn_kernels.cuh", "    return dy * fmaf(z, pdf, cdf);",
        "    return dy * cdf;  // PLANTED: the GELU derivative loses its z * pdf term",
        "fused GELU (erf) backward: dz = dy * Phi(z), the z * phi(z) term dropped; the forward is right, "
        "dx, dweight and dbias are wrong wherever z is not far from 0 (tests/gpu/test_acts.py)",
        "bwd and gelu and not gelu_tanh", False,
    ),
    "act-silu-exp": Planting(
        "gn_kernels.cuh", '"f"(z * -1.4426950408889634f));',
        '"f"(z * 1.4426950408889634f));  // PLANTED: exp(z) instead of exp(-z)',
        "fused SiLU (exp_neg, ex2.approx.ftz): exp(z) where exp(-z) belongs, so SiLU's forward and backward "
        "use 1 - sigmoid(z): y, dx, dweight and dbias are wrong wherever z is not 0 (tests/gpu/test_acts.py)",
        "silu", False,
    ),
    "act-relu-nan-lost": Planting(
        "gn_kernels.cuh", 'asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(z), "f"(0.f));',
        "r = fmaxf(z, 0.f);  // PLANTED: a NaN z becomes 0",
        "fused ReLU (relu): fmaxf(z, 0), as before session 45, turns a NaN group's y into 0 where torch "
        "keeps NaN (tests/gpu/test_acts.py: test_nan_stays_in_its_group_like_torch, extreme pre-activations)",
        "relu", True,
    ),
    "silu-pair-swapped": Planting(
        "gn_kernels.cuh", "  r0 = d0 > kCap ? 0.f : c1 * r;",
        "  r0 = d0 > kCap ? 0.f : c0 * r;  // PLANTED: the even element gets its partner's sigmoid",
        "the forward's paired SiLU (reciprocal_pair, the default since session 66) hands each even channel "
        "its odd partner's sigmoid: 16-bit SiLU outputs wrong against fp64 (tests/gpu/test_acts.py, "
        "test_kernels.py), the backward untouched",
        "silu", False,
    ),
    "combine-loads-serial": Planting(
        "gn_task_reduce.cuh",
        "#pragma unroll\n    for (int i = 0; i < kBatch; ++i) {\n      v[i] = t0 + i < hi",
        "#pragma unroll 1  // PLANTED: one partial load at a time\n    for (int i = 0; i < kBatch; ++i) {\n"
        "      v[i] = t0 + i < hi",
        "the combine (sum_partials) loads its batch of tile partials one at a time: the same bits, but one "
        "L2 round trip per partial in every combining kernel (CPU: tests/test_local_memory.py's "
        "test_combine_loads_leave_together reads it in the sm_90 SASS)",
        "combine", False,
    ),
    "cluster-barrier-skip": Planting(
        "gn_forward.cu", "  cluster_barrier();\n  trace_point(a, 2);",
        "  // PLANTED: the members never meet at the cluster barrier\n  trace_point(a, 2);",
        "cluster teams (the one-launch forward's teams of 2-8 as thread-block clusters, sm_90 builds): each "
        "member computes its task's statistics without waiting for the other members' tile partials, so "
        "it sums whatever the workspace held (poison, or an earlier launch's partials)",
        "cluster", False,
    ),
    "task-fwd1-shift-other-task": Planting(
        "gn_forward.cu", "      first.load(a, task);\n      // trace points per round",
        "      first.load(a, (task + 1) % task_count(a));  // PLANTED: another task's x as the shift\n"
        "      // trace points per round",
        "the one-launch forward's rounds (fwd_task_onepass, FirstShift since session 54): each group's "
        "combine shifts by the next task's first x instead of its own group's. Mean and rstd stay within "
        "the fp64 tolerances, but not the bits of the two launches, which shift by the group's own first x "
        "(the plugin's task cases compare one launch and two bitwise; only plans of several tasks can tell)",
        "fwd and not x1-", False,
    ),
    "cluster-shift-other-task": Planting(
        "gn_forward.cu",
        "  first.load(a, task);\n  const int chunks = member_stats<T, V>(a, task, t0, t1, sm, 5);",
        "  first.load(a, (task + 1) % task_count(a));  // PLANTED: another task's x as the shift\n"
        "  const int chunks = member_stats<T, V>(a, task, t0, t1, sm, 5);",
        "cluster teams (fwd_task_cluster, sm_90 builds): as task-fwd1-shift-other-task, in the cluster "
        "forward: within the tolerances, other bits than the cooperative teams' and the two launches' "
        "(tests/gpu/test_cluster_teams.py compares them bitwise)",
        "cluster", False,
    ),
    "streamed-reader-stuck": Planting(
        "gn_forward.cu", "    if (read_task < task_count(a) && lane.active) {",
        "    if (read_task == team && lane.active) {  // PLANTED: the stream never reads past its first task",
        "the one-launch forward's streamed rounds (a build with -DGN_EXP_STREAMED_ROUNDS=1 only, "
        "member_rounds_streamed): a member's reader stops at its first task, so every later round sums and "
        "applies whatever its slots still hold of earlier rounds; the default build (lockstep rounds) is "
        "unaffected. Its catcher: tests/gpu/test_onepass_rounds.py under that build (GN_NVCC_FLAGS)",
        # (the plugin's suite runs the default build: this -k is for that test file, GN_PLANTED_TESTS)
        "rounds_kept_on_chip", False,
    ),
    "onepass-flag-skip": Planting(
        "gn_forward.cu",
        "  if (!last && threadIdx.x == 0) {\n"
        "    while (load_acquire(flags(a, task)) != flag) __nanosleep(32);\n  }\n",
        "  // PLANTED: the members combine without waiting for the task's flag\n",
        "flag teams (the one-launch forward's cooperative teams): each member combines its task's tile "
        "partials as soon as it has arrived itself, without waiting for the last member's flag, so it "
        "sums whatever the workspace held for the members still reducing (poison, or an earlier launch's "
        "partials)",
        "bitwise_invariant or field_reproducer or current_stream or generation_boundary", False,
    ),
    # A timing experiment, not a bug to catch: the A/B of session 8 (RESULTS.md) asks whether the dx
    # phase of bwd_task_apply got 7 % slower on the large shapes because the kernel also sums dweight and
    # dbias (`bash scripts/ab_trees.sh OUT head=TREE nosums=TREE%timing-bwd-no-param-sums`).
    "timing-bwd-no-param-sums": Planting(
        "gn_backward_tasks.cu",
        "    if (a.strip_blocks == 0 || static_cast<int>(blockIdx.x) >= a.grid) "
        "bwd_param_sums(a, sm.scratch);",
        "    // PLANTED (timing only): dweight and dbias are never summed",
        "task backward apply launch without its dweight/dbias sums (for timing: dweight and dbias stay "
        "whatever the workspace held)",
        "bwd-tasks", False,
    ),
    # Timing only (results stay right): the cold stats variant (a row at a time) for members of fewer than
    # 2 chunks instead of 4. Session 31's premise check left 2x320x64x64 fp32 warm either way; whether
    # 2-3-chunk members gain from the unrolled loop is open (`bash scripts/ab_trees.sh OUT head=TREE
    # warm2=TREE%timing-bwd-warm-chunks-2`, the small and mid shapes, alternating rounds).
    "timing-bwd-warm-chunks-2": Planting(
        "gn_backward_tasks.cu", "constexpr int kWarmChunks = 4;",
        "constexpr int kWarmChunks = 2;  // PLANTED (timing only): cold rows below 2 chunks",
        "task backward stats: the cold variant only for members of 1 chunk (kWarmChunks 2, not 4)",
        "cold", False,
    ),
    # Timing experiments on the forward's stats phase (task kernels; results wrong): how much of the
    # stats launch's time is the per-element arithmetic, and how much the per-tile fold.
    "timing-fwd-less-math": Planting(
        "gn_task_reduce.cuh",
        "      const float e = pack_float(x, v) - shift[v];\n"
        "      s1[v] += e;\n"
        "      s2[v] = fmaf(e, e, s2[v]);",
        "      s1[v] += pack_float(x, v);  // PLANTED (timing only): no shift, no sum of squares",
        "task forward stats: only the conversion and one add per element (no shift, no sum of squares)",
        "fwd-tasks", False,
    ),
    "timing-fwd-no-fold": Planting(
        "gn_task_forward.cuh", TASK_FINISH_TILE,
        "          // PLANTED (timing only): no per-tile fold and partial (the sums stay live)\n"
        "          if (threadIdx.x == 0 && s1[0] == 1234.5f)\n"
        "            parts[tile] = make_float2(s1[V - 1], s2[V - 1]);",
        "task forward stats: no per-tile fold (two barriers, shuffles) and no tile partial",
        "fwd-tasks", False,
    ),
    # Do teams that run in lockstep (all reading, then all waiting with DRAM idle) cost the one-launch
    # forward's multi-team plans? Odd teams start GN_STAGGER_NS later (results stay right: timing only).
    "timing-fwd-copy-only": Planting(
        "gn_task_forward.cuh",
        TASK_STATS_ROWS,
        "        // PLANTED (timing only): the chunks are copied and waited for, never read",
        "task forward stats: the copy ring alone (no shared-memory reads, no arithmetic; the per-tile fold "
        "stays), the ceiling of the kernel's copy pipeline",
        "fwd-tasks", False,
    ),
}  # fmt: skip


def missing_sites(root: Path = CSRC) -> list[str]:
    """Plantings whose site does not occur exactly once in their file (empty when all are fine)."""
    problems = []
    for name, p in PLANTINGS.items():
        path = root / p.file
        count = path.read_text().count(p.site) if path.is_file() else 0
        if count != 1:
            problems.append(
                f"{name}: site occurs {count} times in {p.file} (expected once): {p.site.strip()!r}"
            )
    return problems


def plant(name: str, root: Path = CSRC) -> Path:
    """A copy of `root` with planting `name` applied; returns the copy's path."""
    p = PLANTINGS[name]
    bad = Path(tempfile.mkdtemp(prefix=f"gn-planted-{name}-")) / "csrc"
    shutil.copytree(root, bad)
    source = bad / p.file
    text = source.read_text()
    if text.count(p.site) != 1:
        raise LookupError(f"the planting site of {name!r} in {p.file} moved; update scripts/plant_bug.py")
    source.write_text(text.replace(p.site, p.replacement))
    return bad


def main(argv: list[str]) -> int:
    if argv == ["--list"]:
        for name, p in PLANTINGS.items():
            before = "blind before issue 11" if p.blind_before else "caught before too"
            print(f"{name}\t{p.file}\t{p.bug}\t-k {p.select!r}\t{before}")
        return 0
    if len(argv) == 2 and argv[0] == "--select" and argv[1] in PLANTINGS:
        print(PLANTINGS[argv[1]].select)
        return 0
    if argv == ["--check"]:
        problems = missing_sites()
        print("\n".join(problems) or f"all {len(PLANTINGS)} planting sites found", file=sys.stderr)
        return 1 if problems else 0
    if len(argv) != 1 or argv[0] not in PLANTINGS:
        print(
            f"usage: plant_bug.py {{{','.join(PLANTINGS)}}} | --list | --check | --select NAME",
            file=sys.stderr,
        )
        return 2
    try:
        print(plant(argv[0]))
    except LookupError as exc:
        print(f"plant_bug.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
