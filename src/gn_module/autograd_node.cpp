// The eager training path's autograd node in C++ (gn_module.autograd_node; on by default, GN_CPP_NODE=0 turns it off).
//
// The Python route (ops._EagerGroupNorm, a torch.autograd.Function) pays Python's Function machinery on
// every forward and a Python call from the autograd engine on every backward: on a host-bound model that is
// most of a layer's host time (benchmarks/micro/cpp_node_host.py). Here forward and backward do in C++ what
// the lean Python paths do per call (ops._forward_lean, ops._backward_lean): allocate, put the data pointers
// in front of the launch's cached GnArgs bytes, call the kernel library's entry point. Python still finds
// the launches (ops._launch: plan, GnArgs bytes) once per call signature and hands them over as a
// `Launches`; everything per call after that is here. No kernel code: torch headers stay out of csrc/.
// The same extension holds the custom ops' C++ kernels (op_kernels.cpp), which compiled graphs call.
#include "launches.h"

#include <optional>
#include <utility>

namespace {

using namespace gn_node;

// A forward call signature's launches, as Python found them: the forward's, the backward's for a dy aligned
// as x is (bwd_aligned), and for a 16-byte aligned x the backward's for a dy that is not (bwd_unaligned).
struct Launches : torch::CustomClassHolder {
  Launch fwd, bwd_aligned, bwd_unaligned;
  bool has_unaligned = false;
  ErrorString error = nullptr;
  int64_t stats_floats = 0, workspace_floats = 0, rstd_offset = 0;
  bool typed = false;                      // dweight/dbias stored in the parameters' dtype (task backward)
  std::optional<at::ScalarType> wide;      // float32 y and dy for a float16/bfloat16 x (autocast)
};

// Python's ops._node_sync_pointer(device index, stream, words): the sync buffer of a stream the forward
// did not run on (the autograd engine runs a node's backward on its forward's stream, so: rarely). Never
// freed: a py::object destroyed at unload, after the interpreter, would need the GIL it can no longer take.
py::object* g_sync_pointer = nullptr;

Launch make_launch(int64_t entry, py::bytes before, py::bytes after, int64_t sync_words, int64_t scratch_floats,
                   int64_t dweight_at, int64_t dbias_at) {
  Launch l;
  l.entry = reinterpret_cast<Entry>(entry);
  l.before_sync = before;
  l.after_sync = after;
  l.sync_words = sync_words;
  l.scratch_floats = scratch_floats;
  l.dweight_at = dweight_at;
  l.dbias_at = dbias_at;
  return l;
}

struct GroupNormNode : public torch::autograd::Function<GroupNormNode> {
  // weight and bias as optionals: Function::apply takes undefined tensors only that way
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const std::optional<at::Tensor>& weight_or_none,
                            const std::optional<at::Tensor>& bias_or_none, const c10::intrusive_ptr<Launches>& ls,
                            int64_t stream, int64_t sync) {
    const at::Tensor weight = weight_or_none.value_or(at::Tensor()), bias = bias_or_none.value_or(at::Tensor());
    at::Tensor y = ls->wide ? at::empty_like(x, x.options().dtype(*ls->wide)) : at::empty_like(x);
    const auto floats = x.options().dtype(at::kFloat);
    at::Tensor stats = at::empty({ls->stats_floats}, floats);
    at::Tensor ws = at::empty({ls->workspace_floats}, floats);
    const at::Tensor w = weight.defined() ? weight.contiguous() : weight;
    const at::Tensor b = bias.defined() ? bias.contiguous() : bias;
    const uint64_t mean = address(stats);
    const uint64_t pointers[kPointers] = {address(x), 0, address(y), address(w), address(b), mean,
                                          mean + ls->rstd_offset, address(ws), 0, 0, 0};
    send(ls->error, ls->fwd, pointers, static_cast<uint64_t>(sync), reinterpret_cast<void*>(stream),
         "GroupNorm fwd launch");
    ctx->save_for_backward({x, weight, bias, stats});
    ctx->saved_data["launches"] = c10::IValue::make_capsule(ls);
    ctx->saved_data["stream"] = stream;
    ctx->saved_data["sync"] = sync;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto ls = c10::static_intrusive_pointer_cast<Launches>(ctx->saved_data["launches"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor w = saved[1].defined() ? saved[1].contiguous() : saved[1];
    const at::Tensor b = saved[2].defined() ? saved[2].contiguous() : saved[2];
    const at::Tensor& param = saved[1].defined() ? saved[1] : saved[2];
    // (needs_input_grad counts the inputs that are tensors: x, then weight and bias where given)
    const bool want_w = saved[1].defined() && ctx->needs_input_grad(1);
    const bool want_b = saved[2].defined() && ctx->needs_input_grad(saved[1].defined() ? 2 : 1);
    at::Tensor dy = grads[0];
    if (ls->wide && dy.scalar_type() != *ls->wide) dy = dy.to(*ls->wide);
    dy = dy_as_x(dy, x, ls->wide.has_value());
    // bwd_aligned is the launch for x's alignment; an aligned x with a dy that is not takes bwd_unaligned
    const bool dy_only_unaligned = address(x) % kVecBytes == 0 && address(dy) % kVecBytes != 0;
    TORCH_CHECK(!dy_only_unaligned || ls->has_unaligned, "gn_module: no backward launch for this dy's alignment");
    const Launch& l = dy_only_unaligned ? ls->bwd_unaligned : ls->bwd_aligned;
    at::Tensor dx = at::empty_like(x);
    const auto floats = x.options().dtype(at::kFloat);
    at::Tensor scratch = at::empty({l.scratch_floats}, floats);
    const uint64_t ws = address(scratch);
    ParamGrads grads_wb(x, param, ls->typed, want_w, want_b);
    const uint64_t mean = address(saved[3]);
    const uint64_t pointers[kPointers] = {
        address(x), address(dy), address(dx), address(w), address(b), mean, mean + ls->rstd_offset, ws,
        grads_wb.dweight_at(l, ws), grads_wb.dbias_at(l, ws), 0};
    void* stream = current_stream(x);
    uint64_t sync = static_cast<uint64_t>(ctx->saved_data["sync"].toInt());
    if (l.sync_words && reinterpret_cast<int64_t>(stream) != ctx->saved_data["stream"].toInt()) {
      py::gil_scoped_acquire gil;
      TORCH_CHECK(g_sync_pointer, "gn_module: the C++ node has no sync-buffer callback");
      sync = (*g_sync_pointer)(x.get_device(), reinterpret_cast<int64_t>(stream), l.sync_words).cast<uint64_t>();
    }
    send(ls->error, l, pointers, sync, stream, "GroupNorm bwd launch");
    grads_wb.convert(l, scratch, param, want_w, want_b);
    return {ctx->needs_input_grad(0) ? dx : at::Tensor(), grads_wb.dweight, grads_wb.dbias,
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor group_norm(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias, const c10::intrusive_ptr<Launches>& ls, int64_t stream,
                      int64_t sync) {
  return GroupNormNode::apply(x, weight, bias, ls, stream, sync);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Launch>(m, "Launch").def(py::init(&make_launch));
  py::class_<Launches, c10::intrusive_ptr<Launches>>(m, "Launches")
      .def(py::init([](Launch fwd, Launch bwd_aligned, std::optional<Launch> bwd_unaligned, int64_t error,
                       int64_t stats_floats, int64_t workspace_floats, int64_t rstd_offset, bool typed,
                       std::optional<at::ScalarType> wide) {
        auto ls = c10::make_intrusive<Launches>();
        ls->fwd = std::move(fwd);
        ls->bwd_aligned = std::move(bwd_aligned);
        ls->has_unaligned = bwd_unaligned.has_value();
        if (bwd_unaligned) ls->bwd_unaligned = std::move(*bwd_unaligned);
        ls->error = reinterpret_cast<ErrorString>(error);
        ls->stats_floats = stats_floats;
        ls->workspace_floats = workspace_floats;
        ls->rstd_offset = rstd_offset;
        ls->typed = typed;
        ls->wide = wide;
        return ls;
      }));
  m.def("group_norm", &group_norm);
  gn_node::bind_op_kernels(m);
  m.def("set_sync_pointer", [](py::object fn) {
    if (g_sync_pointer == nullptr) g_sync_pointer = new py::object();
    *g_sync_pointer = std::move(fn);
  });
}
