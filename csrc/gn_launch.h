// Host-side pieces shared by the forward, backward and API translation units.
#pragma once
#include <cuda_runtime.h>

#include "gn_api.h"

namespace gn {

// Kernel kinds for gn_kernel_attributes (the order is part of the ABI; see gn_module/_abi.py).
enum KernelKind {
  kFwdTiles = 0,
  kFwdApply = 1,
  kFwdOnepass = 2,
  kFwdCombine = 3,
  kLevelReduce = 4,
  kBwdTiles = 5,
  kBwdApply = 6,
  kBwdOnepass = 7,
  kBwdCombine = 8,
};

// Makes `device` current for the scope and restores the caller's device after, so a launch on
// cuda:1 does not change the current device that torch (sharing the driver context) sees.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    status_ = cudaGetDevice(&previous_);
    if (status_ == cudaSuccess && previous_ != device) status_ = cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  cudaError_t status() const { return status_; }

 private:
  int previous_ = 0;
  cudaError_t status_;
};

int launch_levels(const GnArgs& a, cudaStream_t stream);
int level_attributes(int* regs, int* smem, int* local);
int forward_occupancy(int dtype, int vec, int smem, int* blocks);
int task_forward_occupancy(int dtype, int wide_dtype, int vec, int smem, int* blocks);
int backward_occupancy(int dtype, int vec, int smem, int* blocks);
int task_backward_occupancy(int dtype, int vec, int smem, int* blocks);
int task_backward_wide_occupancy(int dtype, int wide_dtype, int vec, int smem, int* blocks);
// The task backward's launches (gn_backward_tasks.cu; the one-launch kernel's in gn_backward_onepass.cu).
int launch_task_backward(const GnArgs& a, cudaStream_t stream);
int launch_task_backward_onepass(const GnArgs& a, cudaStream_t stream);
int task_backward_onepass_occupancy(int dtype, int vec, int smem, int* blocks);
int forward_attributes(int kind, int dtype, int vec, int* regs, int* smem, int* local);
int backward_attributes(int kind, int dtype, int vec, int* regs, int* smem, int* local);

}  // namespace gn
