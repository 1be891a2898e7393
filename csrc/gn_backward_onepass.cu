// Backward GroupNorm, task architecture, one launch (GN_ARCH=tasks+bwd1, opt-in): bwd_task_onepass and
// its cooperative launch.
#include "gn_dispatch.cuh"
#include "gn_launch.h"
#include "gn_tasks.cuh"

namespace gn {

// One launch (GN_ARCH=tasks+bwd1, opt-in): the same teams, tiles and sums as the two launches above,
// so the same bits. Each member reduces its tiles keeping its last `slots` chunk pairs on chip; the
// task's last member sums the group partials and publishes them with the task's flag (its flag value
// from the task's arrival counter, gn_task_primitives.cuh); every member then sums its share of the task's dweight/dbias strips and
// writes dx, re-reading only the chunk pairs it could not keep. Needs every block resident (a
// cooperative launch, grid <= residency: schedule.make_task_plan).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads, 2) bwd_task_onepass(GnArgs a) {
  warm_params(a);
  const TaskSmem<T> sm(a, 2);
  const TeamPlace<true> place(a);
  const int team = place.team, member = place.member;
  // thread 0's flag value and counts in shared memory: registers live across the stats and apply
  // loops spilled on sm_110 and sm_120.
  __shared__ unsigned target;
  __shared__ int tasks_done, reread;
  if (threadIdx.x == 0) tasks_done = reread = 0;
  // trace points of the block's first task (scripts/profile_tasks.py --trace-bwd): 0 start, 2 x and dy
  // reduced, 3 arrived, 4 the task's statistics in (the last member: after its combine), 6 its
  // dweight/dbias strips summed, 10 dx written; 11-12 the dweight/dbias totals; 15 the block's end
  trace_point(a, 0);
  if (team < a.teams) {
    const int t0 = member_tile(a, member), t1 = member_tile(a, member + 1);  // (32-bit: schedule.task_tiling)
    const int tasks = static_cast<int>(task_count(a));  // (below 2**31: schedule.task_tiling)
    stagger_start(a, team);  // (schedule.team_stagger: teams of several rounds take turns at the DRAM)
    for (int task = team; task < tasks; task += a.teams) {
      const bool first = task == team;
      member_bwd_stats<T, V, T, false, true>(a, task, t0, t1, sm);
      if (first) trace_point(a, 2);
      const bool last = arrive(arrivals(a, task), static_cast<unsigned>(a.team_size), &target);
      if (first) trace_point(a, 3);
      if (last) {
        bwd_combine_task(a, task);
        __syncthreads();
        if (threadIdx.x == 0) store_release(flags(a, task), target);  // after the barrier: all threads' writes
      } else {
        if (threadIdx.x == 0) {
          while (load_acquire(flags(a, task)) != target) __nanosleep(32);
        }
        __syncthreads();
      }
      if (first) trace_point(a, 4);
      // every tile's partials of the task are written: this member's strips of its dweight/dbias
      if (a.dweight != nullptr || a.dbias != nullptr) {
        const int per_task = bwd_strips_per_task(a);
        for (int j = member; j < per_task; j += a.team_size) bwd_param_strip(a, task, j, sm.scratch);
      }
      if (first) trace_point(a, 6);
      const int r = with_act(a.act, [&](auto act) {  // (each ends with a barrier)
        const int kept = min((t1 - t0) * chunks_per_tile(a), a.slots);  // what member_bwd_stats left on chip
        // (two rows at once: bwd_row_unroll)
        return member_bwd_apply<T, V, decltype(act)::value, T, NoStep, false, true>(a, task, t0, t1, sm, kept);
      });
      if (first) trace_point(a, 10);
      if (threadIdx.x == 0) {
        reread += r;
        tasks_done += 1;
      }
    }
  }
  trace_point(a, 11);
  bwd_param_totals(a);  // every block: the last one to arrive writes dweight and dbias (barriers inside)
  trace_point(a, 12);
  __syncthreads();
  const int tiles = team < a.teams ? tasks_done * (member_tile(a, member + 1) - member_tile(a, member)) : 0;
  // (tasks_done and reread were last written by thread 0, before bwd_param_totals' barriers)
  record(a, 1, tiles);
  record(a, 2, tiles);
  record(a, 3, reread);
  if (a.record != nullptr && blockIdx.x == 0 && threadIdx.x == 0) a.record[0] = gridDim.x;
  trace_point(a, 15);
}

int launch_task_backward_onepass(const GnArgs& a, cudaStream_t stream) {
  return visit_config(a.dtype, a.vec, [&](auto cfg) {
    using T = typename decltype(cfg)::type;
    constexpr int V = decltype(cfg)::vec;
    if (!task_rows_fit<T, V>(a)) return static_cast<int>(cudaErrorInvalidValue);
    return launch_cooperative(a, stream, bwd_task_onepass<T, V>);
  });
}

int task_backward_onepass_occupancy(int dtype, int vec, int smem, int* blocks) {
  return visit_config(dtype, vec, [&](auto cfg) {
    using C = decltype(cfg);
    return static_cast<int>(occupancy_of(reinterpret_cast<const void*>(bwd_task_onepass<typename C::type, C::vec>), smem, blocks));
  });
}

}  // namespace gn
