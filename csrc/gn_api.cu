// The library's C entry points that are not a forward or backward launch, and the level kernel
// both directions share.
#include "gn_dispatch.cuh"
#include "gn_launch.h"

namespace gn {

__global__ void __launch_bounds__(kThreads, kMinBlocksForward) level_reduce(GnArgs a, int level) {
  level_items(a, level, (int64_t)blockIdx.x * kThreads + threadIdx.x, (int64_t)gridDim.x * kThreads);
}

int launch_levels(const GnArgs& a, cudaStream_t stream) {
  for (int level = 0; level < a.nlevels; ++level) {
    const int64_t items = a.n * a.level_tiles[level] * a.c;  // host side: plain indexing is fine
    level_reduce<<<blocks_for(items, kThreads), kThreads, 0, stream>>>(a, level);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

int level_attributes(int* regs, int* smem, int* local) {
  return attributes_of(reinterpret_cast<const void*>(level_reduce), regs, smem, local);
}

__global__ void report_arch(int* out) {
#ifdef __CUDA_ARCH__
  *out = __CUDA_ARCH__;
#endif
}

}  // namespace gn

extern "C" {

int gn_onepass_occupancy(int device, int direction, int dtype, int vec, int smem, int* blocks_per_sm) {
  const gn::DeviceGuard guard(device);
  if (guard.status() != cudaSuccess) return guard.status();
  return direction == 0 ? gn::forward_occupancy(dtype, vec, smem, blocks_per_sm)
                        : gn::backward_occupancy(dtype, vec, smem, blocks_per_sm);
}

int gn_task_occupancy(int device, int direction, int dtype, int vec, int smem, int* blocks_per_sm) {
  const gn::DeviceGuard guard(device);
  if (guard.status() != cudaSuccess) return guard.status();
  return direction == 0 ? gn::task_forward_occupancy(dtype, dtype, vec, smem, blocks_per_sm)
                        : gn::task_backward_occupancy(dtype, vec, smem, blocks_per_sm);
}

int gn_task_occupancy_wide(int device, int direction, int dtype, int wide_dtype, int vec, int smem,
                           int* blocks_per_sm) {
  const gn::DeviceGuard guard(device);
  if (guard.status() != cudaSuccess) return guard.status();
  return direction == 0 ? gn::task_forward_occupancy(dtype, wide_dtype, vec, smem, blocks_per_sm)
                        : gn::task_backward_wide_occupancy(dtype, wide_dtype, vec, smem, blocks_per_sm);
}

int gn_kernel_attributes(int device, int kind, int dtype, int vec, int* regs, int* static_smem,
                         int* local_bytes) {
  const gn::DeviceGuard guard(device);
  if (guard.status() != cudaSuccess) return guard.status();
  if (kind == gn::kLevelReduce) return gn::level_attributes(regs, static_smem, local_bytes);
  if (kind >= gn::kFwdTiles && kind <= gn::kFwdCombine)
    return gn::forward_attributes(kind, dtype, vec, regs, static_smem, local_bytes);
  if (kind >= gn::kBwdTiles && kind <= gn::kBwdCombine)
    return gn::backward_attributes(kind, dtype, vec, regs, static_smem, local_bytes);
  return cudaErrorInvalidValue;
}

int gn_runtime_arch(int device, int* arch) {
  const gn::DeviceGuard guard(device);
  if (guard.status() != cudaSuccess) return guard.status();
  int* d = nullptr;
  cudaError_t err = cudaMalloc(&d, sizeof(int));
  if (err != cudaSuccess) return err;
  gn::report_arch<<<1, 1>>>(d);
  err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaMemcpy(arch, d, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return err;
}

const char* gn_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int gn_abi_size(void) { return static_cast<int>(sizeof(GnArgs)); }

}  // extern "C"
