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

// op_kernels.cpp's bindings, added to the extension's module by autograd_node.cpp.
void bind_op_kernels(pybind11::module_& m);

}  // namespace gn_node
