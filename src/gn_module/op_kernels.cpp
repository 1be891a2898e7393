// The custom ops' kernels in C++ (gn_module.op_kernels): gn_module::group_norm_fwd and group_norm_bwd, the
// calls a torch.compile graph makes.
//
// The Python kernels (ops.group_norm_fwd, ops._fwd_autograd, ...) cost a compiled graph two Python calls
// per op call, Autograd then CUDA, on top of the body: 4.7 ms a step for the examples UNet's 58 calls under
// cProfile (benchmarks/RESULTS.md, session 37). These do what the Python bodies do (ops._op_forward,
// ops._op_backward) in C++: allocate, put the data pointers in front of the cached GnArgs bytes, launch.
// Python still finds each call signature's launch once (ops._op_launch), and keeps whatever the C++ route
// does not take: launch records, poisoning and phase traces (`python_only`), calls without a wide launch,
// and calls that need a gradient in eager mode (the Autograd kernel hands those to ops._fwd_autograd).
// The kernels are registered over the Python ones, which stay registered beneath them.
#include "launches.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace gn_node {
namespace {

using Tensors = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using MaybeTensor = std::optional<at::Tensor>;

// Python's side, set once before the kernels are registered (never freed, as autograd_node.cpp's
// g_sync_pointer: a py::object destroyed after the interpreter would need the GIL).
struct Callbacks {
  py::object launch;            // ops._op_launch: a signature's launch, or None (the Python body takes it)
  py::object sync_buffer;       // ops._sync_buffer_of: a stream's synchronisation words (a tensor)
  py::object forward, backward;  // ops.group_norm_fwd / group_norm_bwd: the Python bodies
  py::object forward_autograd;  // ops._fwd_autograd: a call that needs a gradient
  std::vector<std::string> environment;  // the variables ops._launch reads (ops.LAUNCH_ENVIRONMENT)
};
Callbacks* g_callbacks = nullptr;

// What ops._launch keys a launch on, but for the settings: those clear the cache when they change
// (ops._settings_changed, and the environment compared on each call).
struct Key {
  bool backward;
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
  int param_dtype;  // -1: no weight or bias
  int device;
  bool aligned;
  int64_t groups;
  uint64_t eps_bits;  // (bitwise: a NaN eps finds its entry)
  int64_t act, passes;
  bool wide;
  bool operator==(const Key& o) const {
    return backward == o.backward && sizes == o.sizes && dtype == o.dtype && param_dtype == o.param_dtype &&
           device == o.device && aligned == o.aligned && groups == o.groups && eps_bits == o.eps_bits &&
           act == o.act && passes == o.passes && wide == o.wide;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<int64_t>()(k.groups) ^ (std::hash<uint64_t>()(k.eps_bits) << 1);
    for (int64_t s : k.sizes) h = h * 1000003u ^ std::hash<int64_t>()(s);
    h = h * 31u + static_cast<size_t>(k.dtype) * 7u + static_cast<size_t>(k.param_dtype + 1);
    h = h * 31u + static_cast<size_t>(k.act * 4 + k.passes) + (k.backward ? 17u : 0u) + (k.wide ? 29u : 0u);
    return h * 31u + static_cast<size_t>(k.device + 1) * 2u + (k.aligned ? 1u : 0u);
  }
};

// One signature's launch as ops._op_launch found it; `python`: the Python body takes these calls.
struct OpLaunch {
  bool python = false;
  Launch launch;
  ErrorString error = nullptr;
  int64_t workspace_floats = 0;
  bool typed = false;  // dweight/dbias stored in the parameters' dtype (task backward)
};

constexpr size_t kMaxLaunches = 4096;  // ops._MAX_LAUNCHES

struct State {
  std::mutex mutex;  // never held while taking the GIL
  std::unordered_map<Key, std::shared_ptr<const OpLaunch>, KeyHash> launches;
  std::map<std::pair<int, int64_t>, at::Tensor> sync;  // (device, stream): ops._sync_buffers' buffers
  std::vector<std::optional<std::string>> environment;  // as last seen
  uint64_t epoch = 0;                                    // bumped whenever the launches are cleared
  std::atomic<bool> python_only{false};                  // launch records, poisoning or traces are on
};
State& state() {
  static State* s = new State();  // (never destroyed: its tensors would outlive the CUDA context)
  return *s;
}

void clear(State& s) {
  s.launches.clear();
  s.sync.clear();
  ++s.epoch;
}

// Under s.mutex: the launches go when one of the variables ops._launch reads has changed.
void check_environment(State& s) {
  const auto& names = g_callbacks->environment;
  if (s.environment.size() != names.size()) s.environment.assign(names.size(), std::nullopt);
  bool changed = false;
  for (size_t i = 0; i < names.size(); ++i) {
    const char* value = std::getenv(names[i].c_str());
    auto& seen = s.environment[i];
    if (value == nullptr ? seen.has_value() : (!seen.has_value() || *seen != value)) {
      changed = true;
      seen = value == nullptr ? std::nullopt : std::optional<std::string>(value);
    }
  }
  if (changed) clear(s);
}

// The launch of this signature, or nullptr where the Python body takes the call.
std::shared_ptr<const OpLaunch> find(const Key& key, double eps, const at::Tensor& x, const at::Tensor& param) {
  State& s = state();
  if (s.python_only.load(std::memory_order_relaxed)) return nullptr;
  uint64_t epoch;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    check_environment(s);
    auto it = s.launches.find(key);
    if (it != s.launches.end()) return it->second->python ? nullptr : it->second;
    epoch = s.epoch;
  }
  auto made = std::make_shared<OpLaunch>();
  {
    py::gil_scoped_acquire gil;
    py::object found = g_callbacks->launch(key.backward ? "bwd" : "fwd", x,
                                           param.defined() ? py::cast(param) : py::none(), key.aligned,
                                           key.groups, eps, key.act,
                                           key.passes, key.wide);
    if (found.is_none()) {
      made->python = true;
    } else {
      auto parts = found.cast<py::tuple>();
      made->launch = parts[0].cast<Launch>();
      made->error = reinterpret_cast<ErrorString>(parts[1].cast<int64_t>());
      made->workspace_floats = parts[2].cast<int64_t>();
      made->typed = parts[3].cast<bool>();
    }
  }
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.epoch == epoch) {  // (settings that changed meanwhile make this launch stale: not kept)
      if (s.launches.size() >= kMaxLaunches) clear(s);
      s.launches.emplace(key, made);
    }
  }
  return made->python ? nullptr : made;
}

// The synchronisation words of x's device and this stream (ops._sync_buffer), at least `words` of them.
uint64_t sync_pointer(const at::Tensor& x, void* stream, int64_t words) {
  if (words == 0) return 0;
  State& s = state();
  const std::pair<int, int64_t> where(x.get_device(), reinterpret_cast<int64_t>(stream));
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.sync.find(where);
    if (it != s.sync.end() && it->second.numel() >= words) return address(it->second);
  }
  at::Tensor buffer;
  {
    py::gil_scoped_acquire gil;
    buffer = g_callbacks->sync_buffer(where.first, where.second, words).cast<at::Tensor>();
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  s.sync[where] = buffer;  // (kept alive here as well as in Python)
  return address(buffer);
}

at::Tensor dense(const MaybeTensor& t) { return t.has_value() && t->defined() ? t->contiguous() : at::Tensor(); }

Key key_of(bool backward, const at::Tensor& x, const at::Tensor& param, bool aligned, int64_t groups, double eps,
           int64_t act, int64_t passes, bool wide) {
  uint64_t eps_bits;
  std::memcpy(&eps_bits, &eps, sizeof(eps));
  return Key{backward, x.sizes().vec(), x.scalar_type(), param.defined() ? static_cast<int>(param.scalar_type()) : -1,
             x.get_device(), aligned, groups, eps_bits, act, passes, wide};
}

Tensors python_forward(const at::Tensor& x, const MaybeTensor& weight, const MaybeTensor& bias, int64_t groups,
                       double eps, int64_t act, int64_t passes, bool wide) {
  py::gil_scoped_acquire gil;
  return g_callbacks->forward(x, weight, bias, groups, eps, act, passes, wide).cast<Tensors>();
}

// gn_module::group_norm_fwd's CUDA kernel: ops._op_forward (with ops._forward_float32's wide launch).
Tensors forward_kernel(const at::Tensor& x, const MaybeTensor& weight, const MaybeTensor& bias, c10::SymInt groups_,
                       double eps, c10::SymInt act_, c10::SymInt passes_, bool wide) {
  const int64_t groups = groups_.expect_int(), act = act_.expect_int(), passes = passes_.expect_int();
  const at::Tensor w = dense(weight), b = dense(bias);
  const at::Tensor& param = w.defined() ? w : b;
  const bool aligned = address(x) % kVecBytes == 0;
  const auto found = find(key_of(false, x, param, aligned, groups, eps, act, passes, wide), eps, x, param);
  if (!found) return python_forward(x, weight, bias, groups, eps, act, passes, wide);
  at::Tensor y = wide ? at::empty_like(x, x.options().dtype(at::kFloat)) : at::empty_like(x);
  const auto floats = x.options().dtype(at::kFloat);
  at::Tensor mean = at::empty({x.size(0), groups}, floats);
  at::Tensor rstd = at::empty_like(mean);
  at::Tensor ws = at::empty({found->workspace_floats}, floats);
  const uint64_t pointers[kPointers] = {address(x),    0, address(y), address(w), address(b), address(mean),
                                        address(rstd), address(ws), 0,          0,          0};
  void* stream = current_stream(x);
  send(found->error, found->launch, pointers, sync_pointer(x, stream, found->launch.sync_words), stream,
       "GroupNorm fwd launch");
  return {y, mean, rstd};
}

Tensors python_backward(const at::Tensor& dy, const at::Tensor& x, const MaybeTensor& weight,
                        const MaybeTensor& bias, const at::Tensor& mean, const at::Tensor& rstd, int64_t groups,
                        double eps, int64_t act, int64_t passes, bool wide) {
  py::gil_scoped_acquire gil;
  return g_callbacks->backward(dy, x, weight, bias, mean, rstd, groups, eps, act, passes, wide).cast<Tensors>();
}

// gn_module::group_norm_bwd's CUDA kernel: ops._op_backward (with ops._backward_float32's float32 dy).
Tensors backward_kernel(const at::Tensor& dy_given, const at::Tensor& x, const MaybeTensor& weight,
                        const MaybeTensor& bias, const at::Tensor& mean_given, const at::Tensor& rstd_given,
                        c10::SymInt groups_, double eps, c10::SymInt act_, c10::SymInt passes_, bool wide) {
  const int64_t groups = groups_.expect_int(), act = act_.expect_int(), passes = passes_.expect_int();
  if (state().python_only.load(std::memory_order_relaxed)) {
    return python_backward(dy_given, x, weight, bias, mean_given, rstd_given, groups, eps, act, passes, wide);
  }
  const at::Tensor w = dense(weight), b = dense(bias);
  const at::Tensor& param = w.defined() ? w : b;
  const at::Tensor dy =
      dy_as_x(wide && dy_given.scalar_type() != at::kFloat ? dy_given.to(at::kFloat) : dy_given, x, wide);
  const bool aligned = address(x) % kVecBytes == 0 && address(dy) % kVecBytes == 0;
  const auto found = find(key_of(true, x, param, aligned, groups, eps, act, passes, wide), eps, x, param);
  if (!found) return python_backward(dy_given, x, weight, bias, mean_given, rstd_given, groups, eps, act, passes, wide);
  const at::Tensor mean = mean_given.contiguous(), rstd = rstd_given.contiguous();
  const Launch& l = found->launch;
  at::Tensor dx = at::empty_like(x);
  at::Tensor scratch = at::empty({l.scratch_floats}, x.options().dtype(at::kFloat));
  const uint64_t ws = address(scratch);
  ParamGrads grads(x, param, found->typed, true, true);  // (the op's schema returns both)
  const uint64_t pointers[kPointers] = {
      address(x), address(dy), address(dx), address(w), address(b), address(mean), address(rstd), ws,
      grads.dweight_at(l, ws), grads.dbias_at(l, ws), 0};
  void* stream = current_stream(x);
  send(found->error, l, pointers, sync_pointer(x, stream, l.sync_words), stream, "GroupNorm bwd launch");
  grads.convert(l, scratch, param, true, true);
  return {dx, grads.dweight, grads.dbias};
}

bool wants_grad(const MaybeTensor& t) { return t.has_value() && t->defined() && t->requires_grad(); }

using ForwardSignature = Tensors(const at::Tensor&, const MaybeTensor&, const MaybeTensor&, c10::SymInt, double,
                                 c10::SymInt, c10::SymInt, bool);
using BackwardSignature = Tensors(const at::Tensor&, const at::Tensor&, const MaybeTensor&, const MaybeTensor&,
                                  const at::Tensor&, const at::Tensor&, c10::SymInt, double, c10::SymInt,
                                  c10::SymInt, bool);

// gn_module::group_norm_fwd's Autograd kernel (ops._fwd_autograd): compiled graphs call the op with
// gradients off, straight below autograd; a call that needs a gradient takes the Python route.
Tensors forward_autograd(const at::Tensor& x, const MaybeTensor& weight, const MaybeTensor& bias, c10::SymInt groups,
                         double eps, c10::SymInt act, c10::SymInt passes, bool wide) {
  if (at::GradMode::is_enabled() && (x.requires_grad() || wants_grad(weight) || wants_grad(bias))) {
    py::gil_scoped_acquire gil;
    return g_callbacks->forward_autograd(x, weight, bias, groups.expect_int(), eps, act.expect_int(),
                                         passes.expect_int(), wide)
        .cast<Tensors>();
  }
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("gn_module::group_norm_fwd", "")
                             .typed<ForwardSignature>();
  at::AutoDispatchBelowAutograd below;
  return op.call(x, weight, bias, std::move(groups), eps, std::move(act), std::move(passes), wide);
}

// gn_module::group_norm_bwd's Autograd kernel (ops._bwd_autograd): no double backward.
Tensors backward_autograd(const at::Tensor& dy, const at::Tensor& x, const MaybeTensor& weight,
                          const MaybeTensor& bias, const at::Tensor& mean, const at::Tensor& rstd, c10::SymInt groups,
                          double eps, c10::SymInt act, c10::SymInt passes, bool wide) {
  TORCH_CHECK(!(at::GradMode::is_enabled() &&
                (dy.requires_grad() || x.requires_grad() || wants_grad(weight) || wants_grad(bias) ||
                 mean.requires_grad() || rstd.requires_grad())),
              "gn_module::group_norm_bwd has no derivative (double backward is not supported)");
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("gn_module::group_norm_bwd", "")
                             .typed<BackwardSignature>();
  at::AutoDispatchBelowAutograd below;
  return op.call(dy, x, weight, bias, mean, rstd, std::move(groups), eps, std::move(act), std::move(passes), wide);
}

// Registering over the Python kernels makes the dispatcher warn that a kernel is overridden: on purpose here.
struct Quiet : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

// The libraries that hold the kernels; destroying this takes them off again (the Python kernels return).
struct Registration {
  std::vector<std::unique_ptr<torch::Library>> libraries;
};

std::unique_ptr<Registration> register_kernels(const std::string& backend, bool autograd) {
  TORCH_CHECK(g_callbacks, "gn_module: set_op_callbacks first");
  static Quiet quiet;
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  auto made = std::make_unique<Registration>();
  auto add = [&](c10::DispatchKey key) {
    made->libraries.push_back(
        std::make_unique<torch::Library>(torch::Library::IMPL, "gn_module", key, __FILE__, __LINE__));
    return made->libraries.back().get();
  };
  torch::Library* kernels = add(c10::parseDispatchKey(backend));
  kernels->impl("group_norm_fwd", TORCH_FN(forward_kernel));
  kernels->impl("group_norm_bwd", TORCH_FN(backward_kernel));
  if (autograd) {
    torch::Library* grads = add(c10::DispatchKey::Autograd);
    grads->impl("group_norm_fwd", TORCH_FN(forward_autograd));
    grads->impl("group_norm_bwd", TORCH_FN(backward_autograd));
  }
  return made;
}

}  // namespace

void bind_op_kernels(pybind11::module_& m) {
  py::class_<Registration>(m, "OpKernels");
  m.def("set_op_callbacks", [](py::object launch, py::object sync_buffer, py::object forward, py::object backward,
                               py::object forward_autograd, std::vector<std::string> environment) {
    TORCH_CHECK(!g_callbacks, "gn_module: the op callbacks are set once");
    g_callbacks = new Callbacks{std::move(launch),   std::move(sync_buffer),      std::move(forward),
                                std::move(backward), std::move(forward_autograd), std::move(environment)};
  });
  m.def("register_op_kernels", &register_kernels, py::arg("backend"), py::arg("autograd"));
  m.def("op_settings_changed", [](bool python_only) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    clear(s);
    s.python_only.store(python_only);
  });
  m.def("op_cache_size", [] {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    return s.launches.size();
  });
}

}  // namespace gn_node
