// Backward GroupNorm, task architecture (GN_ARCH=tasks+bwd): the stats and apply launches and the
// launcher of both task schedules (the one-launch kernel is in gn_backward_onepass.cu).
#include "gn_dispatch.cuh"
#include "gn_launch.h"
#include "gn_tasks.cuh"

namespace gn {

// ---------------------------------------------------------------- task architecture (two-pass)
// Stats over persistent teams (as the forward's): each member reduces its tiles of its team's tasks;
// the last member of a task sums its group partials (bwd_combine_task). Then dx over the same teams,
// tasks and chunks in reverse, with dweight and dbias from the channel partials summed behind each
// block's first copies (bwd_param_sums).
// The stats kernel's cold variant (kColdRows) runs its row loop a row at a time (cold_stats_rows). The
// launcher picks it by the plan: one kernel per choice, because one kernel holding both loops was slower on
// the small shapes than either (2x1280x16x16 SiLU 21.5 us against 19.1 and 18.3; RESULTS.md session 31).
// sm_120/121 build the unrolled loop for both: a row at a time spilled 4 B there.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200
constexpr bool kColdRowsBuilt = false;
#else
constexpr bool kColdRowsBuilt = true;
#endif

template <typename T, int V, typename TW = T, bool kColdRows = false>
__global__ void __launch_bounds__(kThreads, 2) bwd_task_stats(GnArgs a) {
  let_dependents_in();
  warm_params(a);
  const TaskSmem<T, TW> sm(a, 2);
  const TeamPlace<true> place(a);
  const int team = place.team, member = place.member;
  int64_t tiles_done = 0;
  trace_point(a, 0);
  if (team < a.teams) {
    const int64_t t0 = member_tile(a, member), t1 = member_tile(a, member + 1);
    // trace points of the block's first task: 2 stats done (the parameters and statistics load
    // behind the first copies), 3 arrived, 4 combined (the task's last member only); 5 the block's
    // end (scripts/profile_tasks.py --trace-bwd)
    for (int64_t task = team; task < task_count(a); task += a.teams) {
      const bool first = task == team;
      member_bwd_stats<T, V, TW, kColdRows && kColdRowsBuilt>(a, task, t0, t1, sm);
      if (first) trace_point(a, 2);
      const bool last = arrive(arrivals(a, task), static_cast<unsigned>(a.team_size));
      if (first) trace_point(a, 3);
      if (last) {
        bwd_combine_task(a, task);
        if (first) trace_point(a, 4);
      }
      tiles_done += t1 - t0;
      __syncthreads();  // sm.param, sm.grp and sm.chan are rewritten for the next task
    }
  }
  trace_point(a, 5);
  record(a, 1, static_cast<int>(tiles_done));
  if (a.record != nullptr && blockIdx.x == 0 && threadIdx.x == 0) a.record[0] = gridDim.x;
}

template <typename T, int V, typename TW = T>
__global__ void __launch_bounds__(kThreads, 2) bwd_task_apply(GnArgs a) {
  warm_params(a);
  const TaskSmem<T, TW> sm(a, 2);
  const TeamPlace<true> place(a);
  const int team = place.team, member = place.member;
  const int64_t tasks = task_count(a);
  int64_t tiles_done = 0, reread = 0;
  // trace points of the block's first task (its team's last): 8 start, 10 dx written (its dweight/dbias
  // strips included: they run behind the first copies); 15 the block's end (the stats launch's are 0-5)
  trace_point(a, 8);
  // dweight and dbias: this block's strips (none for a dx block where strip blocks of their own take them:
  // GnArgs::strip_blocks). Before them, and before the coefficients, the stats launch's writes (a
  // dependent launch waits here, behind its first copies: x and dy are that launch's inputs)
  auto param_sums = [&] {
    wait_for_prerequisites();
    if (a.strip_blocks == 0 || static_cast<int>(blockIdx.x) >= a.grid) bwd_param_sums(a, sm.scratch);
  };
  if (team < a.teams && team < tasks) {
    const int64_t t0 = member_tile(a, member), t1 = member_tile(a, member + 1);
    const int64_t last = team + (tasks - 1 - team) / a.teams * a.teams;  // this team's last task
    for (int64_t task = last; task >= team; task -= a.teams) {
      const bool first = task == last;
      reread += with_act(a.act, [&](auto act) {  // (each ends with a barrier)
        return member_bwd_apply<T, V, decltype(act)::value, TW>(a, task, t0, t1, sm, 0, [&] {
          if (first) param_sums();  // (uniform in the block)
        });
      });
      if (first) trace_point(a, 10);
      tiles_done += t1 - t0;
    }
  } else {
    param_sums();  // a block without a task may still have strips
  }
  trace_point(a, 15);
  record(a, 2, static_cast<int>(tiles_done));
  record(a, 3, static_cast<int>(reread));
}

// Members with fewer than this many chunks per task run the stats kernel's cold variant. Its loop runs a
// few times per launch and waits on instruction fetch more than on memory: a row at a time the small
// backwards were 4-6 % faster, and 1x128x1024x1024 SiLU fp16 (members of one tile, 64 chunks) 1.4 % slower
// (H200, RESULTS.md session 31, call A).
constexpr int kWarmChunks = 4;

// Whether the plan's busiest member (ceil(tiles_per_task / team_size) tiles: schedule.TaskTeams.chunks_per_member)
// reads fewer than kWarmChunks chunks per task (packs only: scalar rows keep their unroll either way).
inline bool cold_stats_rows(const GnArgs& a) {
  const int64_t tiles = (a.tiles_per_task + a.team_size - 1) / a.team_size;
  return a.vec > 1 && tiles * a.chunks_per_tile < kWarmChunks;
}

template <typename Cfg>
int launch_two(const GnArgs& a, cudaStream_t stream) {
  using T = typename Cfg::type;
  using TW = typename Cfg::wide;
  constexpr int V = Cfg::vec;
  if (!task_rows_fit<T, V>(a)) return cudaErrorInvalidValue;
  if constexpr (V > 1) {
    if (cold_stats_rows(a)) return launch_pair(a, stream, bwd_task_stats<T, V, TW, true>, bwd_task_apply<T, V, TW>);
  }
  return launch_pair(a, stream, bwd_task_stats<T, V, TW>, bwd_task_apply<T, V, TW>);
}

// (A wide launch, float32 dy, has the two launches only.)
int launch_task_backward(const GnArgs& a, cudaStream_t stream) {
  // strip blocks (schedule.TaskPlan.strip_blocks): the two-launch apply only, and with the grid fewer
  // blocks than a counter's generation counts
  const int64_t apply_blocks = int64_t{a.grid} + a.strip_blocks;
  if (a.strip_blocks < 0 || (a.strip_blocks > 0 && a.schedule != 2) || apply_blocks >= kGeneration) {
    return cudaErrorInvalidValue;
  }
  if (a.schedule == 1) {
    if (a.wide_dtype != a.dtype) return cudaErrorInvalidValue;
    return launch_task_backward_onepass(a, stream);
  }
  return visit_wide_config(a.dtype, a.wide_dtype, a.vec, [&](auto cfg) { return launch_two<decltype(cfg)>(a, stream); });
}

// Blocks per SM of the stats kernel a plan may launch: the fewer of its two variants' (launch_two picks
// the cold one per plan, after the grid was capped at this residency).
template <typename Cfg>
cudaError_t stats_occupancy(int smem, int* blocks) {
  using T = typename Cfg::type;
  using TW = typename Cfg::wide;
  constexpr int V = Cfg::vec;
  cudaError_t e = occupancy_of(reinterpret_cast<const void*>(bwd_task_stats<T, V, TW>), smem, blocks);
  if constexpr (V > 1) {
    int cold = 0;
    if (e == cudaSuccess) e = occupancy_of(reinterpret_cast<const void*>(bwd_task_stats<T, V, TW, true>), smem, &cold);
    *blocks = min(*blocks, cold);
  }
  return e;
}

// Blocks per SM of the wide backward's stats kernel (its only schedule is the two launches).
int task_backward_wide_occupancy(int dtype, int wide_dtype, int vec, int smem, int* blocks) {
  return visit_wide_config(dtype, wide_dtype, vec,
                           [&](auto cfg) { return static_cast<int>(stats_occupancy<decltype(cfg)>(smem, blocks)); });
}

// Blocks per SM of the task backward: the fewer of its stats and one-pass kernels' (the teams are
// the same for both schedules).
int task_backward_occupancy(int dtype, int vec, int smem, int* blocks) {
  int onepass = 0;
  const int err = task_backward_onepass_occupancy(dtype, vec, smem, &onepass);
  if (err != cudaSuccess) return err;
  return visit_config(dtype, vec, [&](auto cfg) {
    int stats = 0;
    const cudaError_t e = stats_occupancy<decltype(cfg)>(smem, &stats);
    *blocks = min(stats, onepass);
    return static_cast<int>(e);
  });
}

}  // namespace gn
