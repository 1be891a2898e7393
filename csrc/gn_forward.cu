// Forward GroupNorm kernels (one-pass cooperative and two-pass) and their launcher: the tile +
// level kernels (arch 1) and the task kernels (arch 2, gn_tasks.cuh).
#include "gn_dispatch.cuh"
#include "gn_launch.h"
#include "gn_tasks.cuh"

namespace gn {

// Two-pass phase 1: one block per tile.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads, kMinBlocksForward) fwd_tiles(GnArgs a) {
  fwd_tile<T, V, kBatchForward>(a, blockIdx.x, nullptr, scratch_region(0, 0));
  record(a, 1, 1);
  if (a.record != nullptr && blockIdx.x == 0 && threadIdx.x == 0) a.record[0] = gridDim.x;
}

template <typename T>
__global__ void __launch_bounds__(kThreads, kMinBlocksForward) fwd_combine(GnArgs a) {
  fwd_combine_items<T>(a, (int64_t)blockIdx.x * kWarps + threadIdx.x / 32, (int64_t)gridDim.x * kWarps);
}

// Two-pass phase 2: tiles in reverse order, so the tiles read last in phase 1 (still in L2) go first.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads, kMinBlocksForward) fwd_apply(GnArgs a) {
  const int64_t tiles = a.n * a.tiles_per_slice;
  fwd_apply_tile<T, V, kBatchForward>(a, tiles - 1 - blockIdx.x, nullptr);
  record(a, 2, 1);
}

// One launch, all phases. Each block keeps the last tile it reads on chip; overflow tiles (when
// the grid is smaller than the tile count) are read again in the apply phase, newest first.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads, kMinBlocksOnepass) fwd_onepass(GnArgs a) {
  cg::grid_group grid = cg::this_grid();
  const int64_t tiles = a.n * a.tiles_per_slice;
  const int64_t tile_bytes = a.rows_per_tile * a.c * static_cast<int64_t>(sizeof(T));
  T* keep = keep_region<T>(0, a);
  float* scratch = scratch_region(1, tile_bytes);
  int64_t last = -1;
  int visited = 0;
  const int64_t stride = overflow_stride(tiles);
  for (int64_t t = blockIdx.x; t < tiles; t += stride) {
    const bool is_last = t + stride >= tiles;
    fwd_tile<T, V, kBatchOnepassForward>(a, t, is_last ? keep : nullptr, scratch);
    if (is_last) last = t;
    ++visited;
  }
  record(a, 1, visited);
  if (a.record != nullptr && blockIdx.x == 0 && threadIdx.x == 0) a.record[0] = gridDim.x;
  grid.sync();
  const int64_t gthread = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  for (int level = 0; level < a.nlevels; ++level) {
    level_items(a, level, gthread, (int64_t)gridDim.x * kThreads);
    grid.sync();
  }
  fwd_combine_items<T>(a, (int64_t)blockIdx.x * kWarps + threadIdx.x / 32, (int64_t)gridDim.x * kWarps);
  grid.sync();
  int applied = 0;
  for (int64_t t = last; t >= 0; t -= stride) {
    fwd_apply_tile<T, V, kBatchOnepassForward>(a, t, t == last ? keep : nullptr);
    ++applied;
  }
  record(a, 2, applied);
}

// ---------------------------------------------------------------- task architecture
// One launch: a persistent grid of teams; team j runs tasks j, j + teams, ...; each member reduces
// its tiles and arrives; the last to arrive raises the task's flag, every member combines the
// task's partials itself, and applies from the chunks it kept. (One member combining and publishing
// mean/rstd was faster until the combine's loads were interleaved: with them, every member
// combining takes the publish's round trip off the wait, 2x320x64x64 18.3 -> 17.2 us, RESULTS.md
// session 41. The two-launch forward still combines once, in its stats launch: its apply blocks
// combining behind their copies was slower, 425.5 us against 416.3 on 1x128x1024x2048 G16.)
// A member of a one-launch team after its arrival at `task`: the last to arrive says with the task's
// flag that every partial is in; then each member sums them itself (group_stats' fixed order: the same
// bits in every member) into sm.grp, and the last also stores them for the backward. The task's
// parameters go to sm.param meanwhile. `flag`: thread 0's flag value from arrive. Ends at a barrier.
template <typename T>
__device__ __forceinline__ void team_statistics(const GnArgs& a, int64_t task, bool last, const unsigned& flag,
                                                const TaskSmem<T>& sm, int round, const FirstShift<T>& first) {
  if (last && threadIdx.x == 0) store_release(flags(a, task), flag);  // (its arrival acquired them all)
  if (last && round == 0) trace_point(a, 13);  // (round 0's last member: published, then 14 combined)
  load_task_params(a, task, sm.param);  // (needed only by the apply: off the stats' critical path)
  if (!last && threadIdx.x == 0) {
    while (load_acquire(flags(a, task)) != flag) __nanosleep(32);
  }
  __syncthreads();
  const int64_t ng0 = task_group0(a, task);
  group_stats<T>(
      a, task,
      [&](int gl, float mean, float rstd) {
        sm.grp[gl] = make_float2(mean, rstd);
        if (last) {
          a.mean[ng0 + gl] = mean;
          a.rstd[ng0 + gl] = rstd;
        }
      },
      first);
  if (last && round == 0) trace_point(a, 14);
  __syncthreads();
}

// The same with one combine per task (-DGN_EXP_STREAMED_PUBLISH=1, for member_rounds_streamed): the last to
// arrive sums the partials, stores mean/rstd and then raises the flag; the others load them after it.
// A team of 256 members that each read 256 tiles' partials per round moves 16 MB through L2 per round;
// this moves 64 KB, at the cost of the publish's round trip in the wait (which the stream may hide).
template <typename T>
__device__ __forceinline__ void team_statistics_published(const GnArgs& a, int64_t task, bool last,
                                                          const unsigned& flag, const TaskSmem<T>& sm,
                                                          const FirstShift<T>& first) {
  load_task_params(a, task, sm.param);
  const int64_t ng0 = task_group0(a, task);
  if (last) {
    group_stats<T>(
        a, task,
        [&](int gl, float mean, float rstd) {
          sm.grp[gl] = make_float2(mean, rstd);
          a.mean[ng0 + gl] = mean;
          a.rstd[ng0 + gl] = rstd;
        },
        first);
    __syncthreads();  // (every thread's stores, then thread 0's release)
    if (threadIdx.x == 0) store_release(flags(a, task), flag);
  } else {
    if (threadIdx.x == 0) {
      while (load_acquire(flags(a, task)) != flag) __nanosleep(32);
    }
    __syncthreads();
    load_group_stats(a, task, sm.grp);
  }
  __syncthreads();
}

// The experiment -DGN_EXP_STREAMED_ROUNDS=1 (off by default): a member of a several-round one launch whose
// chunks of a task fit its slots runs its rounds as one stream (member_rounds_streamed). H200, session 44:
// 10-22 % faster than the lockstep rounds, still 5-46 % slower than the two launches (RESULTS.md).
#ifndef GN_EXP_STREAMED_ROUNDS
#define GN_EXP_STREAMED_ROUNDS 0
#endif
#ifndef GN_EXP_STREAMED_PUBLISH
#define GN_EXP_STREAMED_PUBLISH 0
#endif

// A member's rounds as one stream of chunks through its ring: chunk q of its round r is stream chunk
// g = r * c + q (c = its chunks of a task, at most `slots`), in slot g % slots. The prologue reads the
// first `slots` of them (the first round's and the next rounds' first slots - c); each chunk the apply
// has written y from is refilled at once with chunk g + slots. So the next round's reads are in flight
// while the team waits for this round's statistics and while it applies: the lockstep rounds streamed
// nothing across their wait (RESULTS.md sessions 13 and 40). Nothing is read twice. The tiles, their
// partials and y are those of the lockstep rounds: the same bits. Returns the tiles this member
// reduced and applied.
template <typename T, int V, typename TY>
__device__ int64_t member_rounds_streamed(const GnArgs& a, int team, int64_t t0, int64_t t1, const TaskSmem<T>& sm,
                                          unsigned& flag) {
  const TaskLane lane(a);
  const ThreadChunks<T> tc(a, lane.row, lane.col, V, t0, t1);
  const int cpt = chunks_per_tile(a);
  const int c = static_cast<int>(t1 - t0) * cpt;
  const int slots = a.slots;
  const int rt = a.rows_threads;
  const int sstep = rt * static_cast<int>(a.window);
  const int64_t gstep = static_cast<int64_t>(rt) * a.c;
  const T* x = static_cast<const T*>(a.x);
  T* mine = sm.slot0 + lane.row * static_cast<int>(a.window) + lane.col * V;  // this thread's place in slot 0
  auto task_x = [&](int64_t task) { return x + task_sample(a, task) * a.s * a.c + task_c0(a, task); };
  // The reader: the stream's next chunk to read is chunk read_q of task read_task.
  int64_t read_task = team;
  const T* read_base = task_x(team);
  int read_q = 0;
  auto issue = [&](int slot) {  // (the stream's next chunk always goes to `slot`: see the callers)
    if (read_task < task_count(a) && lane.active) {
      copy_rows<T, V>(read_base + tc.offset(read_q), gstep, mine + slot * sm.slot_elems, sstep, rt, tc.limit(read_q));
    }
    cp_async_commit();  // (empty past the last round: the waits count groups)
    if (++read_q == c) {
      read_q = 0;
      read_task += a.teams;
      if (read_task < task_count(a)) read_base = task_x(read_task);
    }
  };
  // A task's shifts (x[n, row 0, group's first channel]) of this thread's columns, as member_stats.
  T raw[V];
  auto load_shifts = [&](const T* base) {
    int g[V];
    column_groups<V>(a, lane.col, g);
    const int cpg = channels_per_group(a);
#pragma unroll
    for (int v = 0; v < V; ++v) raw[v] = lane.active && lane.col * V + v < a.window ? base[g[v] * cpg] : base[0];
  };
  load_shifts(read_base);  // (ahead of the copies, so they do not queue behind them)
  for (int i = 0; i < slots; ++i) issue(i);
  float shift[V];
#pragma unroll
  for (int v = 0; v < V; ++v) shift[v] = lane.active ? to_float(raw[v]) : 0.f;
  const StorePair pair(a);
  int slot = 0;  // the slot of the stream's next chunk to reduce
  int64_t tiles_done = 0;
  int round = 0;
  for (int64_t task = team; task < task_count(a); task += a.teams, ++round) {
    prefetch_task_params(a, task);
    FirstShift<T> first;
    first.load(a, task);
    float s1[V], s2[V];
#pragma unroll
    for (int v = 0; v < V; ++v) s1[v] = s2[v] = 0.f;
    float2* parts = const_cast<float2*>(task_partials(a, task));
    const int first_slot = slot;
    int in_tile = 0;
    int64_t tile = t0;
    for (int q = 0; q < c; ++q) {
      // `slots` + r * c groups are committed (the prologue's, then one per chunk applied) and chunk q of
      // round r is group r * c + q: at most slots - 1 - q may still be in flight
      cp_async_wait(slots - 1 - q);
      if (lane.active) accumulate_rows<T, V>(mine + slot * sm.slot_elems, sstep, rt, tc.limit(q), shift, s1, s2);
      if (++in_tile == cpt) {
        finish_tile<T, V>(a, lane, sm, s1, s2, parts + tile, a.tiles_per_task);
        in_tile = 0;
        ++tile;
      }
      slot = next_slot(slot, slots);
    }
    const int point = round < 3 ? 4 * round : kTracePoints;  // (the lockstep rounds' trace points)
    trace_point(a, 1 + point);
    const bool last = arrive(arrivals(a, task), static_cast<unsigned>(a.team_size), &flag);
    trace_point(a, 2 + point);
    // The next task's shifts, kept in sm.chan (free until the next round's first tile ends: its last
    // reader, finish_tile, is behind arrive's barrier) by the last row's threads, which are not thread 0
    // (it polls the flag) where there are several rows: their load's latency hides in the wait.
    const bool next = task + a.teams < task_count(a);
    if (next && lane.row == rt - 1) {
      load_shifts(task_x(task + a.teams));
#pragma unroll
      for (int v = 0; v < V; ++v) sm.chan[lane.col * V + v].x = to_float(raw[v]);
    }
#if GN_EXP_STREAMED_PUBLISH
    team_statistics_published<T>(a, task, last, flag, sm, first);
#else
    team_statistics<T>(a, task, last, flag, sm, round, first);
#endif
    trace_point(a, 3 + point);
    const ApplyCoefs<V, kFusedApply<T>> coefs(a, sm.grp, sm.param, lane.col);
    TY* out = reinterpret_cast<TY*>(a.out) + (task_x(task) - x);
    int s = first_slot;
    for (int q = 0; q < c; ++q) {
      if (lane.active) {
        const T* from = mine + s * sm.slot_elems;
        TY* y = out + tc.offset(q);
        const int limit = tc.limit(q);
        with_act(a.act, [&](auto act) {
          apply_rows<T, V, decltype(act)::value, TY>(from, sstep, y, gstep, rt, limit, coefs, pair);
        });
      }
      issue(s);  // this thread's elements of slot s are written out: the stream's chunk `slots` later
      s = next_slot(s, slots);
    }
    __syncthreads();  // sm.grp and sm.param are rewritten for the next task; sm.chan holds its shifts
#pragma unroll
    for (int v = 0; v < V; ++v) shift[v] = next && lane.active ? sm.chan[lane.col * V + v].x : 0.f;
    trace_point(a, 4 + point);
    tiles_done += t1 - t0;
  }
  return tiles_done;
}

template <typename T, int V, typename TY = T>
__global__ void __launch_bounds__(kThreads, 2) fwd_task_onepass(GnArgs a) {
  trace_point(a, 0);
  warm_params(a);
  const TaskSmem<T> sm(a);
  __shared__ unsigned flag;  // this launch's flag value of the current task (thread 0's: arrive)
  const TeamPlace<> place(a);
  const int team = place.team, member = place.member;
  int64_t tiles_done = 0, reread = 0;
  if (team < a.teams) {
    // schedule.member_tiles: contiguous, balanced, every tile of the task exactly once
    const int64_t t0 = member_tile(a, member), t1 = member_tile(a, member + 1);
    if (kTracePrologue && task_count(a) <= a.teams) trace_point(a, 9);
    stagger_start(a, team);
    int round = 0;
#if GN_EXP_STREAMED_ROUNDS
    // The whole team streams or none of it does (its largest member's chunks, schedule.member_tiles: ceil):
    // a lockstep last member raises the flag before it stores mean/rstd, which a published stream's
    // members would read at the flag (GN_EXP_STREAMED_PUBLISH).
    const int team_chunks =
        fast_div(static_cast<int>(a.tiles_per_task) + a.team_size - 1, a.team_size_mul, a.team_size_shift) *
        chunks_per_tile(a);
    if (team_chunks <= a.slots && team + a.teams < task_count(a)) {
      tiles_done = member_rounds_streamed<T, V, TY>(a, team, t0, t1, sm, flag);
    } else
#endif
    for (int64_t task = team; task < task_count(a); task += a.teams, ++round) {
      prefetch_task_params(a, task);
      FirstShift<T> first;  // (with the first copies: its round trip off the path after the arrival)
      first.load(a, task);
      // trace points per round (first 3 rounds): 1 + 4r stats done, 2 + 4r arrived,
      // 3 + 4r statistics in shared memory, 4 + 4r applied (round 3's would take 13-15)
      const int point = round < 3 ? 4 * round : kTracePoints;  // (kTracePoints and above: not traced)
      // a one-round launch also traces inside its stats phase (points 5-8, free without round 1)
      const int chunks = member_stats<T, V>(a, task, t0, t1, sm, task_count(a) <= a.teams ? 5 : -1);
      trace_point(a, 1 + point);
      const bool last = arrive(arrivals(a, task), static_cast<unsigned>(a.team_size), &flag);
      trace_point(a, 2 + point);
      team_statistics<T>(a, task, last, flag, sm, round, first);
      trace_point(a, 3 + point);
      reread += member_apply<T, V, TY>(a, task, t0, t1, sm, min(chunks, a.slots));
      trace_point(a, 4 + point);
      tiles_done += t1 - t0;
    }
  }
  trace_point(a, 15);
  record(a, 1, static_cast<int>(tiles_done));
  record(a, 2, static_cast<int>(tiles_done));
  record(a, 3, static_cast<int>(reread));
  if (a.record != nullptr && blockIdx.x == 0 && threadIdx.x == 0) a.record[0] = gridDim.x;
}

// The one launch where each team is a thread-block cluster (GnArgs::cluster_teams, sm_90 builds;
// schedule.cluster_teams_fit: one task per team, teams of at most 8): cluster c runs task c, its block
// of rank m is member m. The members write their tile partials, meet at the cluster's hardware barrier
// (no arrival counter, no flag, no poll of global memory), and each computes the task's statistics from
// the partials itself (group_stats, as the last member of fwd_task_onepass does: the same bits); member 0
// also stores them for the backward. Nothing waits across clusters, so the launch is not cooperative.
template <typename T, int V, typename TY = T>
__global__ void __launch_bounds__(kThreads, 2) fwd_task_cluster(GnArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // (below sm_90 never launched: an empty body compiles at once)
  trace_point(a, 0);  // the trace points of fwd_task_onepass's one round
  warm_params(a);
  const TaskSmem<T> sm(a);
  const TeamPlace<> place(a);  // (one task per team: the team is the task)
  const int task = place.team, member = place.member;
  const int64_t t0 = member_tile(a, member), t1 = member_tile(a, member + 1);
  if (kTracePrologue) trace_point(a, 9);
  prefetch_task_params(a, task);
  // weight, bias and the combine's shifts load with the chunk copies: the barrier's release waits for every
  // earlier load, so loaded after the stats they sat on its critical path (H100: 1-4 % of the small shapes)
  EarlyParams early;
  early.load(a, task);
  FirstShift<T> first;
  first.load(a, task);
  const int chunks = member_stats<T, V>(a, task, t0, t1, sm, 5);
  trace_point(a, 1);
  cluster_barrier();
  trace_point(a, 2);
  early.store(a, task, sm.param);
  const int64_t ng0 = task_group0(a, task);
  auto emit = [&](int gl, float mean, float rstd) {
    sm.grp[gl] = make_float2(mean, rstd);
    if (member == 0) {
      a.mean[ng0 + gl] = mean;
      a.rstd[ng0 + gl] = rstd;
    }
  };
  group_stats<T>(a, task, emit, first);
  __syncthreads();
  trace_point(a, 3);
  const int reread = member_apply<T, V, TY>(a, task, t0, t1, sm, min(chunks, a.slots));
  trace_point(a, 4);
  trace_point(a, 15);
  record(a, 1, static_cast<int>(t1 - t0));
  record(a, 2, static_cast<int>(t1 - t0));
  record(a, 3, reread);
  if (a.record != nullptr && blockIdx.x == 0 && threadIdx.x == 0) a.record[0] = gridDim.x;
#endif
}

// The stats launch only reads, so its ring uses 3 of the a.slots slots (2 chunks in flight beside the
// one being summed; the apply launch, same layout, uses all). Deeper rings queued more reads than
// DRAM needs: H200, 6 -> 3 slots, 1x128x1024x2048 G16 414 -> 411 us, the 256 MiB SiLU rows 1 %
// faster, 1x512x256x256 within noise (RESULTS.md session 40). -DGN_STATS_RING=0 uses every slot.
#ifndef GN_STATS_RING
#define GN_STATS_RING 3
#endif
constexpr int kStatsRing = GN_STATS_RING;

// Two launches over the same persistent teams as the one-pass kernel (no block waits for another,
// so any grid works): each member reduces its tiles of its team's tasks and the last member of a
// task to arrive combines; then each member writes y for the same tiles, its tasks in reverse
// order and each range's chunks in reverse, so the data the stats launch read last (still in L2)
// goes first.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads, 2) fwd_task_stats(GnArgs a) {
  let_dependents_in();
  trace_point(a, 0);
  warm_params(a);
  const TaskSmem<T> sm(a);
  const TeamPlace<> place(a);
  const int team = place.team, member = place.member;
  int64_t tiles_done = 0;
  if (team < a.teams) {
    const int64_t t0 = member_tile(a, member), t1 = member_tile(a, member + 1);
    for (int64_t task = team; task < task_count(a); task += a.teams) {
      // (timeline builds: points 5-8 inside the first task's stats, 12 arrived, 13 combined)
      member_stats<T, V, false>(a, task, t0, t1, sm, kTimeline && task == team ? 5 : -1, kStatsRing);
      const bool last = arrive(arrivals(a, task), static_cast<unsigned>(a.team_size));
      if (kTimeline) trace_point(a, 12);
      if (last) {
        combine_task<T>(a, task);
        if (kTimeline) trace_point(a, 13);
      }
      tiles_done += t1 - t0;
    }
  }
  trace_point(a, 15);
  record(a, 1, static_cast<int>(tiles_done));
  if (a.record != nullptr && blockIdx.x == 0 && threadIdx.x == 0) a.record[0] = gridDim.x;
}

// (Measured, a2351f3: applying from registers instead of the shared-memory ring, with one chunk in
// flight per thread, was 4-11 % slower on the 64-256 MiB shapes.)
template <typename T, int V, typename TY = T>
__global__ void __launch_bounds__(kThreads, 2) fwd_task_apply(GnArgs a) {
  if (kTimeline) trace_point(a, 9);  // (timeline builds: 9 start, 10 statistics in, 11 end; rows shared
                                     // with the stats launch's points 0, 5-8 and 12-15)
  warm_params(a);
  const TaskSmem<T> sm(a);
  const TeamPlace<> place(a);
  const int team = place.team, member = place.member;
  const int64_t tasks = task_count(a);
  int64_t tiles_done = 0, reread = 0;
  if (team < a.teams && team < tasks) {
    const int64_t t0 = member_tile(a, member), t1 = member_tile(a, member + 1);
    const int64_t last = team + (tasks - 1 - team) / a.teams * a.teams;  // this team's last task
    for (int64_t task = last; task >= team; task -= a.teams) {
      const bool first = task == last;
      load_task_params(a, task, sm.param);
      // behind the first copies (x is the stats launch's input, never its output): mean and rstd
      reread += member_apply<T, V, TY, false>(a, task, t0, t1, sm, 0, [&] {
        if (first) wait_for_prerequisites();  // (uniform in the block)
        load_group_stats(a, task, sm.grp);
        __syncthreads();
        if (kTimeline && first) trace_point(a, 10);
      });
      tiles_done += t1 - t0;
    }
  }
  if (kTimeline) trace_point(a, 11);
  record(a, 2, static_cast<int>(tiles_done));
  record(a, 3, static_cast<int>(reread));
}

// (A wide launch, float32 y: the stats kernel reads x only, so it is x's own.)
template <typename Cfg>
int launch_forward_tasks(const GnArgs& a, cudaStream_t stream) {
  using T = typename Cfg::type;
  using TY = typename Cfg::wide;
  constexpr int V = Cfg::vec;
  if (!task_rows_fit<T, V>(a)) return cudaErrorInvalidValue;
  if (a.schedule == 1 && a.cluster_teams) {
    const int err = launch_clusters(a, stream, fwd_task_cluster<T, V, TY>);
    if (err != kNoClusterFits) return err;  // (else the teams as a cooperative grid)
  }
  if (a.schedule == 1) return launch_cooperative(a, stream, fwd_task_onepass<T, V, TY>);
  return launch_pair(a, stream, fwd_task_stats<T, V>, fwd_task_apply<T, V, TY>);
}

int task_forward_occupancy(int dtype, int wide_dtype, int vec, int smem, int* blocks) {
  return visit_wide_config(dtype, wide_dtype, vec, [&](auto cfg) {
    using C = decltype(cfg);
    return static_cast<int>(occupancy_of(
        reinterpret_cast<const void*>(fwd_task_onepass<typename C::type, C::vec, typename C::wide>), smem, blocks));
  });
}

// ---------------------------------------------------------------- tiles + levels
template <typename Cfg>
int launch_forward(const GnArgs& a, cudaStream_t stream) {
  using T = typename Cfg::type;
  constexpr int V = Cfg::vec;
  return launch_schedule(a, stream, fwd_onepass<T, V>, fwd_tiles<T, V>, fwd_combine<T>, fwd_apply<T, V>);
}

int forward_occupancy(int dtype, int vec, int smem, int* blocks) {
  return visit_config(dtype, vec, [&](auto cfg) {
    using C = decltype(cfg);
    return static_cast<int>(
        occupancy_of(reinterpret_cast<const void*>(fwd_onepass<typename C::type, C::vec>), smem, blocks));
  });
}

int forward_attributes(int kind, int dtype, int vec, int* regs, int* smem, int* local) {
  return visit_config(dtype, vec, [&](auto cfg) {
    using C = decltype(cfg);
    using T = typename C::type;
    const void* k = kind == kFwdTiles     ? reinterpret_cast<const void*>(fwd_tiles<T, C::vec>)
                    : kind == kFwdApply   ? reinterpret_cast<const void*>(fwd_apply<T, C::vec>)
                    : kind == kFwdCombine ? reinterpret_cast<const void*>(fwd_combine<T>)
                                          : reinterpret_cast<const void*>(fwd_onepass<T, C::vec>);
    return attributes_of(k, regs, smem, local);
  });
}

}  // namespace gn

extern "C" int gn_forward(const GnArgs* args, void* stream) {
  if (args->fanin != gn::kFanin) return cudaErrorInvalidValue;  // schedule.FANIN disagrees
  const gn::DeviceGuard guard(args->device);
  if (guard.status() != cudaSuccess) return guard.status();
  if (args->strip_blocks != 0) return cudaErrorInvalidValue;  // (the backward's apply launch only)
  if (args->arch == 2) {
    return gn::visit_wide_config(args->dtype, args->wide_dtype, args->vec, [&](auto cfg) {
      return gn::launch_forward_tasks<decltype(cfg)>(*args, static_cast<cudaStream_t>(stream));
    });
  }
  if (args->wide_dtype != args->dtype) return cudaErrorInvalidValue;  // (task kernels only)
  return gn::visit_config(args->dtype, args->vec, [&](auto cfg) {
    return gn::launch_forward<decltype(cfg)>(*args, static_cast<cudaStream_t>(stream));
  });
}
