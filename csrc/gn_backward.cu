// Backward GroupNorm, tile architecture (GN_ARCH=tiles): one-pass cooperative and two-pass kernels and
// their launcher, and the C entry gn_backward, which hands the task architecture to
// gn_backward_tasks.cu (its kernels compile in their own translation units, in parallel).
#include "gn_dispatch.cuh"
#include "gn_launch.h"
#include "gn_kernels.cuh"

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
  if (args->arch == 2) return gn::launch_task_backward(*args, static_cast<cudaStream_t>(stream));
  // (wide launches and strip blocks: the task kernels only)
  if (args->wide_dtype != args->dtype || args->strip_blocks != 0) return cudaErrorInvalidValue;
  return gn::visit_config(args->dtype, args->vec, [&](auto cfg) {
    return gn::launch_backward<decltype(cfg)>(*args, static_cast<cudaStream_t>(stream));
  });
}
