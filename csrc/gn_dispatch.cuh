// Maps the run-time (dtype, vec) of a launch to the kernel template arguments. Two vector widths
// per dtype: a 16-byte access when the channel count allows it, and scalar access otherwise.
#pragma once
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

#include "gn_kernels.cuh"
#include "gn_launch.h"

namespace gn {

// TW: the "wide" tensor's element type, the forward's y and the backward's dy: T, or float32 for a
// float16/bfloat16 x under autocast (GnArgs.wide_dtype; task kernels, 16-byte vectors only).
template <typename T, int V, typename TW = T>
struct Config {
  using type = T;
  using wide = TW;
  static constexpr int vec = V;
};

// Calls f(Config<T, V>{}) for the configuration; an unknown one is an invalid-value error.
template <typename F>
int visit_config(int dtype, int vec, F&& f) {
  switch (dtype) {
    case 0:
      return vec == 1 ? f(Config<float, 1>{}) : vec == 4 ? f(Config<float, 4>{}) : cudaErrorInvalidValue;
    case 1:
      return vec == 1 ? f(Config<__half, 1>{}) : vec == 8 ? f(Config<__half, 8>{}) : cudaErrorInvalidValue;
    case 2:
      return vec == 1   ? f(Config<__nv_bfloat16, 1>{})
             : vec == 8 ? f(Config<__nv_bfloat16, 8>{})
                        : cudaErrorInvalidValue;
    default:
      return cudaErrorInvalidValue;
  }
}

// visit_config, or for a launch whose wide tensor is float32 while x is float16/bfloat16 (16-byte
// vectors: the only wide configurations built) f(Config<T, 8, float>{}).
template <typename F>
int visit_wide_config(int dtype, int wide_dtype, int vec, F&& f) {
  if (wide_dtype == dtype) return visit_config(dtype, vec, f);
  if (wide_dtype != 0 || vec != 8) return cudaErrorInvalidValue;
  switch (dtype) {
    case 1:
      return f(Config<__half, 8, float>{});
    case 2:
      return f(Config<__nv_bfloat16, 8, float>{});
    default:
      return cudaErrorInvalidValue;
  }
}

inline int attributes_of(const void* kernel, int* regs, int* static_smem, int* local_bytes) {
  cudaFuncAttributes attr;
  const cudaError_t err = cudaFuncGetAttributes(&attr, kernel);
  if (err != cudaSuccess) return err;
  *regs = attr.numRegs;
  *static_smem = static_cast<int>(attr.sharedSizeBytes);
  *local_bytes = static_cast<int>(attr.localSizeBytes);
  return cudaSuccess;
}

// Dynamic shared memory above 48 KB needs an explicit opt-in per kernel.
// Lets `kernel` take `smem` bytes of dynamic shared memory on the current device. The driver call
// sits on every launch's host path, so the largest size already allowed per (kernel, device) is
// remembered and the call skipped when it covers `smem`.
inline cudaError_t allow_smem(const void* kernel, int smem) {
  if (smem <= 48 * 1024) return cudaSuccess;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> allowed;
  const std::pair<const void*, int> key(kernel, device);
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto it = allowed.find(key);
    if (it != allowed.end() && it->second >= smem) return cudaSuccess;
  }
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err == cudaSuccess) {
    const std::lock_guard<std::mutex> lock(mutex);
    int& most = allowed[key];
    most = most > smem ? most : smem;
  }
  return err;
}

inline cudaError_t occupancy_of(const void* kernel, int smem, int* blocks) {
  cudaError_t err = allow_smem(kernel, smem);
  if (err != cudaSuccess) return err;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, kThreads, smem);
}

inline unsigned blocks_for(int64_t items, int per_block) {
  const int64_t b = (items + per_block - 1) / per_block;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (1 << 20) ? (1 << 20) : b));
}

using Kernel = void (*)(GnArgs);

// The task kernels' launches over a.grid blocks: one cooperative launch (every block resident: the
// one-pass kernels wait for each other), or two plain ones on the same stream (stats, then apply).
inline int launch_cooperative(const GnArgs& a, cudaStream_t stream, Kernel kernel) {
  const void* k = reinterpret_cast<const void*>(kernel);
  cudaError_t err = allow_smem(k, a.smem);
  if (err != cudaSuccess) return err;
  GnArgs copy = a;
  void* params[] = {&copy};
  err = cudaLaunchCooperativeKernel(k, dim3(a.grid), dim3(kThreads), params, a.smem, stream);
  return err != cudaSuccess ? err : cudaGetLastError();
}

// How many clusters of `config` the device holds at once (cudaOccupancyMaxActiveClusters), remembered per
// (kernel, device, cluster size, shared memory): the query sits on the launch's host path.
inline cudaError_t active_clusters(Kernel kernel, const cudaLaunchConfig_t& config, int* clusters) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  static std::mutex mutex;
  static std::map<std::pair<std::pair<const void*, int>, std::pair<unsigned, size_t>>, int> known;
  const auto key = std::make_pair(std::make_pair(reinterpret_cast<const void*>(kernel), device),
                                  std::make_pair(config.attrs[0].val.clusterDim.x, config.dynamicSmemBytes));
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto it = known.find(key);
    if (it != known.end()) {
      *clusters = it->second;
      return cudaSuccess;
    }
  }
  err = cudaOccupancyMaxActiveClusters(clusters, kernel, &config);
  if (err != cudaSuccess) return err;
  const std::lock_guard<std::mutex> lock(mutex);
  known[key] = *clusters;
  return cudaSuccess;
}

// The same grid as thread-block clusters of a.team_size blocks (fwd_task_cluster: a team per cluster,
// co-scheduled by the hardware; no cooperative launch). kNoClusterFits, launching nothing, unless this
// device holds every cluster of the grid at once (the caller launches the cooperative kernel instead, the
// same bits): clusters that run in waves lose to the teams. On the H200, 32 clusters of 8 (256 blocks)
// do not all fit and took 16x320x32x32's forward from 22.2 to 30.0 us, where 32 clusters of 6 (192
// blocks) fit and save 1.7-2.2 us (RESULTS.md session 28).
constexpr int kNoClusterFits = -1;
inline int launch_clusters(const GnArgs& a, cudaStream_t stream, Kernel kernel) {
  cudaError_t err = allow_smem(reinterpret_cast<const void*>(kernel), a.smem);
  if (err != cudaSuccess) return err;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = static_cast<unsigned>(a.team_size);
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(a.grid));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(a.smem);
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  int clusters = 0;
  if ((err = active_clusters(kernel, config, &clusters)) != cudaSuccess) return err;
  if (static_cast<int64_t>(clusters) * a.team_size < static_cast<int64_t>(a.grid)) return kNoClusterFits;
  err = cudaLaunchKernelEx(&config, kernel, a);
  return err != cudaSuccess ? err : cudaGetLastError();
}

inline int launch_pair(const GnArgs& a, cudaStream_t stream, Kernel stats, Kernel apply) {
  cudaError_t err;
  if ((err = allow_smem(reinterpret_cast<const void*>(stats), a.smem)) != cudaSuccess) return err;
  if ((err = allow_smem(reinterpret_cast<const void*>(apply), a.smem)) != cudaSuccess) return err;
  const unsigned blocks = static_cast<unsigned>(a.grid);
  stats<<<blocks, kThreads, a.smem, stream>>>(a);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  const unsigned apply_blocks = blocks + static_cast<unsigned>(a.strip_blocks);  // (the backward's strips)
  if (!a.dependent_launch) {
    apply<<<apply_blocks, kThreads, a.smem, stream>>>(a);
    return cudaGetLastError();
  }
  // the apply launch's blocks take the SMs the stats launch frees, and wait there for its writes
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(apply_blocks);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(a.smem);
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  err = cudaLaunchKernelEx(&config, apply, a);
  return err != cudaSuccess ? err : cudaGetLastError();
}

// Runs one direction's schedule: the one cooperative kernel, or the phase kernels in order
// (tiles, reduction levels, combine, apply) on the same stream.
inline int launch_schedule(const GnArgs& a, cudaStream_t stream, Kernel onepass, Kernel tiles, Kernel combine,
                           Kernel apply) {
  const int64_t n_tiles = a.n * a.tiles_per_slice;
  cudaError_t err;
  if (a.schedule == 1) {
    const void* kernel = reinterpret_cast<const void*>(onepass);
    if ((err = allow_smem(kernel, a.smem)) != cudaSuccess) return err;
    GnArgs copy = a;
    void* params[] = {&copy};
    err = cudaLaunchCooperativeKernel(kernel, dim3(a.grid), dim3(kThreads), params, a.smem, stream);
    return err != cudaSuccess ? err : cudaGetLastError();
  }
  tiles<<<static_cast<unsigned>(n_tiles), kThreads, a.smem, stream>>>(a);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  if ((err = static_cast<cudaError_t>(launch_levels(a, stream))) != cudaSuccess) return err;
  combine<<<blocks_for(a.n * a.g, kWarps), kThreads, 0, stream>>>(a);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  apply<<<static_cast<unsigned>(n_tiles), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace gn
