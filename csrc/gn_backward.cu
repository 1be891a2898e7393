// Backward GroupNorm kernels (one-pass cooperative and two-pass) and their launcher.
#include "gn_dispatch.cuh"
#include "gn_launch.h"
#include "gn_tasks.cuh"

namespace gn {

template <typename T, int V>
__global__ void __launch_bounds__(kThreads, kMinBlocksBackward) bwd_tiles(GnArgs a) {
  bwd_tile<T, V, kBatchBackward>(a, blockIdx.x, nullptr, nullptr, scratch_region(0, 0));
  record(a, 1, 1);
  if (a.record != nullptr && blockIdx.x == 0 && threadIdx.x == 0) a.record[0] = gridDim.x;
}

__global__ void __launch_bounds__(kThreads, kMinBlocksBackward) bwd_combine(GnArgs a) {
  bwd_combine_items(a, (int64_t)blockIdx.x * kWarps + threadIdx.x / 32, (int64_t)gridDim.x * kWarps);
}

// Tiles in reverse order (L2 still holds the last ones read); the first warps also finish dgamma/dbeta.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads, kMinBlocksBackward) bwd_apply(GnArgs a) {
  const int64_t tiles = a.n * a.tiles_per_slice;
  bwd_param_items(a, (int64_t)blockIdx.x * kWarps + threadIdx.x / 32, (int64_t)gridDim.x * kWarps);
  bwd_apply_tile<T, V, kBatchBackward>(a, tiles - 1 - blockIdx.x, nullptr, nullptr);
  record(a, 2, 1);
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads, kMinBlocksOnepass) bwd_onepass(GnArgs a) {
  cg::grid_group grid = cg::this_grid();
  const int64_t tiles = a.n * a.tiles_per_slice;
  const int64_t tile_bytes = a.rows_per_tile * a.c * static_cast<int64_t>(sizeof(T));
  T* keep_x = keep_region<T>(0, a);
  T* keep_dy = keep_region<T>(1, a);
  float* scratch = scratch_region(2, tile_bytes);
  int64_t last = -1;
  int visited = 0;
  const int64_t stride = overflow_stride(tiles);
  for (int64_t t = blockIdx.x; t < tiles; t += stride) {
    const bool is_last = t + stride >= tiles;
    bwd_tile<T, V, kBatchOnepassBackward>(a, t, is_last ? keep_x : nullptr, is_last ? keep_dy : nullptr, scratch);
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
  const int64_t gwarp = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32;
  bwd_combine_items(a, gwarp, (int64_t)gridDim.x * kWarps);
  grid.sync();
  bwd_param_items(a, gwarp, (int64_t)gridDim.x * kWarps);
  int applied = 0;
  for (int64_t t = last; t >= 0; t -= stride) {
    const bool kept = t == last;
    bwd_apply_tile<T, V, kBatchOnepassBackward>(a, t, kept ? keep_x : nullptr, kept ? keep_dy : nullptr);
    ++applied;
  }
  record(a, 2, applied);
}

template <typename Cfg>
int launch_backward(const GnArgs& a, cudaStream_t stream) {
  using T = typename Cfg::type;
  constexpr int V = Cfg::vec;
  return launch_schedule(a, stream, bwd_onepass<T, V>, bwd_tiles<T, V>, bwd_combine, bwd_apply<T, V>);
}

// ---------------------------------------------------------------- task architecture (two-pass)
// Stats over persistent teams (as the forward's): each member reduces its tiles of its team's tasks;
// the last member of a task sums its group partials (bwd_combine_task). Then dx over the same teams,
// tasks and chunks in reverse, with dweight and dbias from the channel partials summed behind each
// block's first copies (bwd_param_sums).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads, 2) bwd_task_stats(GnArgs a) {
  const TaskSmem<T> sm(a, 2);
  const int team = blockIdx.x / a.team_size, member = blockIdx.x % a.team_size;
  int64_t tiles_done = 0;
  trace_point(a, 0);
  if (team < a.teams) {
    const int64_t t0 = member_tile(a, member), t1 = member_tile(a, member + 1);
    // trace points of the block's first task: 2 stats done (the parameters and statistics load
    // behind the first copies), 3 arrived, 4 combined (the task's last member only); 5 the block's
    // end (scripts/profile_tasks.py --trace-bwd)
    for (int64_t task = team; task < task_count(a); task += a.teams) {
      const bool first = task == team;
      member_bwd_stats<T, V>(a, task, t0, t1, sm);
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

template <typename T, int V>
__global__ void __launch_bounds__(kThreads, 2) bwd_task_apply(GnArgs a) {
  const TaskSmem<T> sm(a, 2);
  const int team = blockIdx.x / a.team_size, member = blockIdx.x % a.team_size;
  const int64_t tasks = task_count(a);
  int64_t tiles_done = 0, reread = 0;
  // trace points of the block's first task (its team's last): 8 start, 10 dx written (its dweight/dbias
  // strips included: they run behind the first copies); 15 the block's end (the stats launch's are 0-5)
  trace_point(a, 8);
  auto param_sums = [&] { bwd_param_sums(a, sm.scratch); };  // dweight and dbias: this block's strips
  if (team < a.teams && team < tasks) {
    const int64_t t0 = member_tile(a, member), t1 = member_tile(a, member + 1);
    const int64_t last = team + (tasks - 1 - team) / a.teams * a.teams;  // this team's last task
    for (int64_t task = last; task >= team; task -= a.teams) {
      const bool first = task == last;
      reread += with_act(a.act, [&](auto act) {  // (each ends with a barrier)
        return member_bwd_apply<T, V, decltype(act)::value>(a, task, t0, t1, sm, 0, [&] {
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

// One launch (GN_ARCH=tasks+bwd1, opt-in): the same teams, tiles and sums as the two launches above,
// so the same bits. Each member reduces its tiles keeping its last `slots` chunk pairs on chip; the
// task's last member sums the group partials and publishes them with the task's flag (the forward
// one-pass kernel's epochs); every member then sums its share of the task's dweight/dbias strips and
// writes dx, re-reading only the chunk pairs it could not keep. Needs every block resident (a
// cooperative launch, grid <= residency: schedule.make_task_plan).
template <typename T, int V>
__global__ void __launch_bounds__(kThreads, 2) bwd_task_onepass(GnArgs a) {
  const TaskSmem<T> sm(a, 2);
  const int team = blockIdx.x / a.team_size, member = blockIdx.x % a.team_size;
  // thread 0's epoch target and counts in shared memory: registers live across the stats and apply
  // loops spilled on sm_110 and sm_120. The target is read after the first stats phase (a load before
  // it would hold up the first copies).
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
    for (int task = team; task < tasks; task += a.teams) {
      const bool first = task == team;
      member_bwd_stats<T, V>(a, task, t0, t1, sm);
      if (first) trace_point(a, 2);
      if (first && threadIdx.x == 0) target = launch_target(a);
      const bool last = arrive(arrivals(a, task), static_cast<unsigned>(a.team_size));
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
        const int per_task = static_cast<int>((a.window + 31) / 32);  // (bwd_param_strip)
        for (int j = member; j < per_task; j += a.team_size) bwd_param_strip(a, task * per_task + j, sm.scratch);
      }
      if (first) trace_point(a, 6);
      const int r = with_act(a.act, [&](auto act) {  // (each ends with a barrier)
        const int kept = min((t1 - t0) * chunks_per_tile(a), a.slots);  // what member_bwd_stats left on chip
        return member_bwd_apply<T, V, decltype(act)::value>(a, task, t0, t1, sm, kept);
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
  finish_launch(a);
}

template <typename Cfg>
int launch_backward_tasks(const GnArgs& a, cudaStream_t stream) {
  using T = typename Cfg::type;
  constexpr int V = Cfg::vec;
  if (a.rows_threads < 1 || a.chunk_rows > kChunkRowsPerThread<T, V> * a.rows_threads) return cudaErrorInvalidValue;
  cudaError_t err;
  if (a.schedule == 1) {
    const void* kernel = reinterpret_cast<const void*>(bwd_task_onepass<T, V>);
    if ((err = allow_smem(kernel, a.smem)) != cudaSuccess) return err;
    GnArgs copy = a;
    void* params[] = {&copy};
    err = cudaLaunchCooperativeKernel(kernel, dim3(a.grid), dim3(kThreads), params, a.smem, stream);
    return err != cudaSuccess ? err : cudaGetLastError();
  }
  if ((err = allow_smem(reinterpret_cast<const void*>(bwd_task_stats<T, V>), a.smem)) != cudaSuccess) return err;
  if ((err = allow_smem(reinterpret_cast<const void*>(bwd_task_apply<T, V>), a.smem)) != cudaSuccess) return err;
  const unsigned blocks = static_cast<unsigned>(a.grid);
  bwd_task_stats<T, V><<<blocks, kThreads, a.smem, stream>>>(a);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  bwd_task_apply<T, V><<<blocks, kThreads, a.smem, stream>>>(a);
  return cudaGetLastError();
}

// Blocks per SM of the task backward: the fewer of its stats and one-pass kernels' (the teams are
// the same for both schedules).
int task_backward_occupancy(int dtype, int vec, int smem, int* blocks) {
  return visit_config(dtype, vec, [&](auto cfg) {
    using C = decltype(cfg);
    using T = typename C::type;
    int stats = 0, onepass = 0;
    cudaError_t err = occupancy_of(reinterpret_cast<const void*>(bwd_task_stats<T, C::vec>), smem, &stats);
    if (err == cudaSuccess) err = occupancy_of(reinterpret_cast<const void*>(bwd_task_onepass<T, C::vec>), smem, &onepass);
    *blocks = min(stats, onepass);
    return static_cast<int>(err);
  });
}

// ---------------------------------------------------------------- tiles + levels
int backward_occupancy(int dtype, int vec, int smem, int* blocks) {
  return visit_config(dtype, vec, [&](auto cfg) {
    using C = decltype(cfg);
    return static_cast<int>(
        occupancy_of(reinterpret_cast<const void*>(bwd_onepass<typename C::type, C::vec>), smem, blocks));
  });
}

int backward_attributes(int kind, int dtype, int vec, int* regs, int* smem, int* local) {
  if (kind == kBwdCombine) return attributes_of(reinterpret_cast<const void*>(bwd_combine), regs, smem, local);
  return visit_config(dtype, vec, [&](auto cfg) {
    using C = decltype(cfg);
    using T = typename C::type;
    const void* k = kind == kBwdTiles   ? reinterpret_cast<const void*>(bwd_tiles<T, C::vec>)
                    : kind == kBwdApply ? reinterpret_cast<const void*>(bwd_apply<T, C::vec>)
                                        : reinterpret_cast<const void*>(bwd_onepass<T, C::vec>);
    return attributes_of(k, regs, smem, local);
  });
}

}  // namespace gn

extern "C" int gn_backward(const GnArgs* args, void* stream) {
  if (args->fanin != gn::kFanin) return cudaErrorInvalidValue;  // schedule.FANIN disagrees
  const gn::DeviceGuard guard(args->device);
  if (guard.status() != cudaSuccess) return guard.status();
  return gn::visit_config(args->dtype, args->vec, [&](auto cfg) {
    return args->arch == 2 ? gn::launch_backward_tasks<decltype(cfg)>(*args, static_cast<cudaStream_t>(stream))
                           : gn::launch_backward<decltype(cfg)>(*args, static_cast<cudaStream_t>(stream));
  });
}
