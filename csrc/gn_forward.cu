// Forward GroupNorm kernels (one-pass cooperative and two-pass) and their launcher.
#include "gn_dispatch.cuh"
#include "gn_launch.h"

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
  return gn::visit_config(args->dtype, args->vec, [&](auto cfg) {
    return gn::launch_forward<decltype(cfg)>(*args, static_cast<cudaStream_t>(stream));
  });
}
