// What the C++ autograd node (autograd_node.cpp) and the custom ops' C++ kernels (op_kernels.cpp) share: a
// launch as Python's ops._launch found it (the kernel library's entry point and the GnArgs bytes after the
// data pointers), and how one is sent. No kernel code: torch headers stay out of csrc/.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace gn_node {

using Entry = int (*)(const void* args, void* stream);
using ErrorString = const char* (*)(int code);
constexpr int kPointers = 11;      // gn_module._abi.POINTER_FIELDS, in this order:
enum Pointer { kX, kDy, kOut, kWeight, kBias, kMean, kRstd, kWorkspace, kDweight, kDbias, kRecord };
constexpr int64_t kVecBytes = 16;  // schedule.VEC_BYTES: the vector launches' alignment

// One launch: the library entry point and the GnArgs bytes after the data pointers, around the sync pointer.
struct Launch {
  Entry entry = nullptr;
  std::string before_sync, after_sync;  // `tail` when sync_words == 0 (after_sync empty)
  int64_t sync_words = 0;
  int64_t scratch_floats = 0;  // backward: workspace + dweight/dbias scratch (ops._Launch)
  int64_t dweight_at = 0, dbias_at = 0;  // backward: their byte offsets in the scratch
};

inline uint64_t address(const at::Tensor& t) {
  return t.defined() ? reinterpret_cast<uint64_t>(t.data_ptr()) : 0;
}

// The raw stream the launch goes to: x's device's current stream, as ops._raw_stream gives it.
inline void* current_stream(const at::Tensor& x) {
  if (!x.is_cuda()) return nullptr;  // (CPU tensors reach here only with the CPU tests' stub library)
  c10::impl::VirtualGuardImpl guard(x.device().type());
  return guard.getStream(x.device()).native_handle();
}

// The launch with these data pointers: the pointers, the GnArgs bytes and the sync pointer between them
// (ops._send); a failed launch raises with the library's message.
inline void send(ErrorString error, const Launch& l, const uint64_t (&pointers)[kPointers], uint64_t sync,
                 void* stream, const char* what) {
  const size_t head = sizeof(pointers), mid = l.before_sync.size(), tail = l.after_sync.size();
  const size_t sync_bytes = l.sync_words ? sizeof(sync) : 0;
  char stack[1024];
  std::vector<char> heap;
  char* args = stack;
  if (head + mid + sync_bytes + tail > sizeof(stack)) {
    heap.resize(head + mid + sync_bytes + tail);
    args = heap.data();
  }
  std::memcpy(args, pointers, head);
  std::memcpy(args + head, l.before_sync.data(), mid);
  if (sync_bytes) std::memcpy(args + head + mid, &sync, sync_bytes);
  std::memcpy(args + head + mid + sync_bytes, l.after_sync.data(), tail);
  const int code = l.entry(args, stream);
  TORCH_CHECK(code == 0, "gn_module: ", what, " failed: CUDA error ", code, " (", error ? error(code) : "?", ")");
}

// dy in x's layout (ops._dy_as_x): gradients arrive in any layout and the kernels read x's; a wide launch
// takes 16-byte vectors only, so its float32 dy is copied where it is not aligned too.
inline at::Tensor dy_as_x(const at::Tensor& dy, const at::Tensor& x, bool wide) {
  if (dy.strides() != x.strides() || (wide && address(dy) % kVecBytes)) {
    return at::empty_like(x, x.options().dtype(dy.scalar_type())).copy_(dy);
  }
  return dy;
}

// A backward launch's dweight and dbias, those wanted (ops._backward_lean): tensors of their own where the
// kernels write them as returned (float32 parameters, none, or `typed`: the task backward stores the
// parameters' dtype), else float32 sums in the launch's scratch, converted after it.
struct ParamGrads {
  bool as_written;
  at::Tensor dweight, dbias;
  ParamGrads(const at::Tensor& x, const at::Tensor& param, bool typed, bool want_w, bool want_b)
      : as_written(!param.defined() || param.scalar_type() == at::kFloat || typed) {
    const auto grad_type = typed && param.defined() ? param.scalar_type() : at::kFloat;
    if (as_written && want_w) dweight = at::empty({x.size(1)}, x.options().dtype(grad_type));
    if (as_written && want_b) dbias = at::empty({x.size(1)}, x.options().dtype(grad_type));
  }
  // GnArgs' dweight and dbias pointers for a launch whose scratch is at `ws`
  uint64_t dweight_at(const Launch& l, uint64_t ws) const {
    return dweight.defined() ? address(dweight) : ws + l.dweight_at;
  }
  uint64_t dbias_at(const Launch& l, uint64_t ws) const { return dbias.defined() ? address(dbias) : ws + l.dbias_at; }
  // after the launch: the scratch's float32 sums in the parameters' dtype, where those were wanted
  void convert(const Launch& l, const at::Tensor& scratch, const at::Tensor& param, bool want_w, bool want_b) {
    if (as_written) return;
    const int64_t c = param.size(0);  // (defined here: without parameters the sums are as written)
    if (want_w) dweight = scratch.slice(0, l.dweight_at / 4, l.dweight_at / 4 + c).to(param.scalar_type());
    if (want_b) dbias = scratch.slice(0, l.dbias_at / 4, l.dbias_at / 4 + c).to(param.scalar_type());
  }
};

// op_kernels.cpp's bindings, added to the extension's module by autograd_node.cpp.
void bind_op_kernels(pybind11::module_& m);

}  // namespace gn_node
