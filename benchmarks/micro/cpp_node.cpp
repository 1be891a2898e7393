// A C++ autograd node around gn_module's launch entry points: a prototype for measuring the host time
// an eager training step would save against the Python autograd.Function (_EagerGroupNorm). Not a product
// path. benchmarks/micro/cpp_node_host.py builds it, checks its bits against the Python route and times
// both.
//
// The Python side computes each direction's launch once (gn_module.ops._launch: the plan and the
// pointer-free GnArgs bytes, a task plan's sync pointer included for one stream) and hands it over with
// `set_launch`. Then forward and backward do only what the Python route's lean paths do per call:
// allocate, pack the data pointers in front of the cached bytes, call the library's entry point.
#include <torch/extension.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Entry = int (*)(const void* args, void* stream);
using ErrorString = const char* (*)(int code);
constexpr int kPointers = 11;  // gn_module._abi.POINTER_FIELDS

struct Launches {
  Entry fwd = nullptr, bwd = nullptr;
  ErrorString error = nullptr;
  std::string fwd_tail, bwd_tail;  // the GnArgs bytes after the data pointers
  int64_t stats_floats = 0, workspace_floats = 0, rstd_offset = 0, scratch_floats = 0;
  at::ScalarType grad_dtype = at::kFloat;  // dweight/dbias as the task backward stores them
};

Launches g_launches;  // one call signature: what the prototype times

void set_launch(int64_t fwd, int64_t bwd, int64_t error, py::bytes fwd_tail, py::bytes bwd_tail,
                int64_t stats_floats, int64_t workspace_floats, int64_t rstd_offset, int64_t scratch_floats,
                const std::string& grad_dtype) {
  Launches l;
  l.fwd = reinterpret_cast<Entry>(fwd);
  l.bwd = reinterpret_cast<Entry>(bwd);
  l.error = reinterpret_cast<ErrorString>(error);
  l.fwd_tail = fwd_tail;
  l.bwd_tail = bwd_tail;
  l.stats_floats = stats_floats;
  l.workspace_floats = workspace_floats;
  l.rstd_offset = rstd_offset;
  l.scratch_floats = scratch_floats;
  l.grad_dtype = grad_dtype == "float32" ? at::kFloat : grad_dtype == "bfloat16" ? at::kBFloat16 : at::kHalf;
  g_launches = std::move(l);
}

void* current_stream(const at::Tensor& x) {
  if (!x.is_cuda()) return nullptr;  // (the CPU stub library ignores it)
  c10::impl::VirtualGuardImpl guard(x.device().type());
  return guard.getStream(x.device()).native_handle();
}

uint64_t address(const at::Tensor& t) { return t.defined() ? reinterpret_cast<uint64_t>(t.data_ptr()) : 0; }

void send(Entry entry, const uint64_t (&pointers)[kPointers], const std::string& tail, void* stream,
          const char* what) {
  std::vector<char> args(sizeof(pointers) + tail.size());
  std::memcpy(args.data(), pointers, sizeof(pointers));
  std::memcpy(args.data() + sizeof(pointers), tail.data(), tail.size());
  const int code = entry(args.data(), stream);
  TORCH_CHECK(code == 0, what, " failed: ", g_launches.error ? g_launches.error(code) : "?");
}

struct GroupNormNode : public torch::autograd::Function<GroupNormNode> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const at::Tensor& b) {
    const Launches& l = g_launches;
    at::Tensor y = at::empty_like(x);
    const auto floats = x.options().dtype(at::kFloat);
    at::Tensor stats = at::empty({l.stats_floats}, floats);
    at::Tensor ws = at::empty({l.workspace_floats}, floats);
    const uint64_t mean = address(stats);
    const uint64_t pointers[kPointers] = {address(x), 0, address(y), address(w), address(b), mean,
                                          mean + l.rstd_offset, address(ws), 0, 0, 0};
    send(l.fwd, pointers, l.fwd_tail, current_stream(x), "GroupNorm fwd launch");
    ctx->save_for_backward({x, w, b, stats});
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const Launches& l = g_launches;
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &b = saved[2];
    at::Tensor dy = grads[0];
    if (dy.strides() != x.strides()) dy = at::empty_like(x).copy_(dy);  // the kernels read x's layout
    at::Tensor dx = at::empty_like(x);
    const auto floats = x.options().dtype(at::kFloat);
    at::Tensor scratch = at::empty({l.scratch_floats}, floats);
    const auto grad_options = x.options().dtype(l.grad_dtype);
    at::Tensor dw = at::empty({x.size(1)}, grad_options), db = at::empty({x.size(1)}, grad_options);
    const uint64_t mean = address(saved[3]);
    const uint64_t pointers[kPointers] = {address(x), address(dy), address(dx), address(w), address(b), mean,
                                          mean + l.rstd_offset, address(scratch), address(dw), address(db), 0};
    send(l.bwd, pointers, l.bwd_tail, current_stream(x), "GroupNorm bwd launch");
    return {dx, dw, db};
  }
};

at::Tensor group_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  return GroupNormNode::apply(x, w, b);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("set_launch", &set_launch);
  m.def("group_norm", &group_norm);
}
