// The zero-copy boxed fallback: every ATen op without a neuron kernel of its
// own runs here. Device tensors become CPU tensors over the same memory, the
// CPU kernel runs, and its results come back as device tensors: in-place and
// out= results are the original tensors, views are views of device storage,
// fresh results adopt the kernel's buffer without a copy.
#include "neuron.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace torch_neuronx {
namespace {

// What the fallback needs to know about an operator, computed once per op.
struct OpEntry {
  std::string name;
  std::atomic<int64_t> executed{0};
  std::atomic<int64_t> fallback{0};
  int generator_arg = -1;       // index of its Generator? argument, if any
  bool allows_cpu_tensors = false;  // takes CPU tensors beside device ones on CUDA too
  bool mutates = false;
  std::atomic<bool> warned{false};
};

std::mutex g_ops_mutex;
std::unordered_map<const void*, std::unique_ptr<OpEntry>> g_ops;
std::atomic<bool> g_fallback_allowed{true};

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

std::unique_ptr<OpEntry> make_entry(const c10::OperatorHandle& op) {
  auto e = std::make_unique<OpEntry>();
  const auto& schema = op.schema();
  e->name = schema.name();
  if (!schema.overload_name().empty()) e->name += "." + schema.overload_name();
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].type()->str().find("Generator") != std::string::npos) e->generator_arg = static_cast<int>(i);
  }
  // CUDA accepts CPU tensors here too: index tensors, copy sources, CTC
  // lengths, optimizer step counters, and the c10d ops (which see CPU and
  // device tensors by design).
  for (const char* p : {"aten::index", "aten::_index_put_impl_", "aten::_unsafe_index", "aten::copy_",
                        "aten::_ctc_loss", "aten::_fused_", "aten::_foreach_", "aten::lift", "c10d::"}) {
    if (starts_with(e->name, p)) e->allows_cpu_tensors = true;
  }
  e->mutates = schema.is_mutable();
  return e;
}

OpEntry& entry_for(const c10::OperatorHandle& op) {
  // Per-thread cache in front of the shared table: no lock on the hot path.
  thread_local ska::flat_hash_map<const void*, OpEntry*> cache;
  const void* key = &op.schema();
  auto hit = cache.find(key);
  if (C10_LIKELY(hit != cache.end())) return *hit->second;
  std::lock_guard<std::mutex> lock(g_ops_mutex);
  auto& slot = g_ops[key];
  if (!slot) slot = make_entry(op);
  cache.emplace(key, slot.get());
  return *slot;
}

at::Tensor make_device_tensor(c10::Storage storage, const at::Tensor& like) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                      like.dtype());
  auto* impl = out.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) impl->_set_conj(true);
  if (like.is_neg()) impl->_set_neg(true);
  return out;
}

[[noreturn]] void device_mismatch(const OpEntry& e, const std::string& a, const std::string& b) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", a, " and ",
              b, "! (when running ", e.name, " on neuron; move the tensors with .to(device) first)");
}

// Moves a CPU kernel's result buffer to the device. `holders` is how many of
// the call's own results hold it: any other holder (a CPU input, a cache)
// means the buffer is shared, and it is copied instead.
c10::Storage adopt_storage(const at::Tensor& out, c10::DeviceIndex device, size_t holders) {
  check_dtype(out.scalar_type());
  auto* impl = out.storage().unsafeGetStorageImpl();
  const size_t nbytes = impl->nbytes();
  c10::DataPtr data;
  if (out.storage().use_count() <= holders) {
    c10::DataPtr host = impl->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
    data = adopt(std::move(host), nbytes, device);
  } else {
    data = allocate_on(device, nbytes);
    if (nbytes) std::memcpy(data.get(), impl->data(), nbytes);
  }
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            std::move(data), device_allocator(), true));
}

void check_strided(const at::Tensor& out) {
  TORCH_CHECK_NOT_IMPLEMENTED(out.layout() == c10::kStrided, "neuron supports only strided (dense) tensors; this op "
                              "produced a ", out.layout(), " tensor. Keep sparse work on the CPU.");
}

bool is_low_precision(c10::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2;
}

// Converts one call's arguments to CPU and maps its results back.
struct Call {
  const OpEntry& entry;
  c10::DeviceIndex device = -1;
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 4> aliases;  // (device tensor, CPU alias)
  c10::ScalarType low_precision = c10::ScalarType::Undefined;

  at::Tensor to_cpu(const at::Tensor& t) {
    if (!t.defined()) return t;
    const auto type = t.device().type();
    if (type == kNeuron) {
      const auto index = t.device().index();
      if (device < 0) {
        device = index;
      } else if (index != device) {
        device_mismatch(entry, "neuron:" + std::to_string(device), "neuron:" + std::to_string(index));
      }
      if (low_precision == c10::ScalarType::Undefined && is_low_precision(t.scalar_type())) {
        low_precision = t.scalar_type();
      }
      auto alias = cpu_alias(t);
      aliases.emplace_back(t, alias);
      return alias;
    }
    if (type == c10::DeviceType::CPU && t.dim() > 0 && !entry.allows_cpu_tensors) {
      // CUDA accepts CPU tensors only as 0-dim scalars.
      pending_cpu = true;
    }
    return t;
  }

  c10::IValue to_cpu(const c10::IValue& v) {
    if (v.isTensor()) return to_cpu(v.toTensor());
    // Lists are rebuilt, never edited: the caller may hold the same list.
    if (v.isTensorList()) {
      const auto list = v.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(to_cpu(t));
      return out;
    }
    if (v.isList()) {  // Tensor?[] and nested lists
      const auto list = v.toList();
      c10::impl::GenericList out(list.elementType());
      out.reserve(list.size());
      for (const c10::IValue& item : list) out.push_back(to_cpu(item));
      return out;
    }
    if (v.isDevice() && v.toDevice().type() == kNeuron) {
      if (device < 0 && v.toDevice().has_index()) device = v.toDevice().index();
      factory = true;
      return c10::IValue(c10::Device(c10::DeviceType::CPU));
    }
    return v;
  }

  bool pending_cpu = false;
  bool factory = false;

  at::Tensor to_device(const at::Tensor& out) {
    if (!out.defined() || out.device().type() != c10::DeviceType::CPU) return out;
    for (auto& [dev, alias] : aliases) {  // in-place and out=: the original tensor
      if (out.unsafeGetTensorImpl() == alias.unsafeGetTensorImpl()) return dev;
    }
    const auto* storage = out.storage().unsafeGetStorageImpl();
    for (auto& [dev, alias] : aliases) {  // a view of an input
      if (storage == alias.storage().unsafeGetStorageImpl()) return make_device_tensor(dev.storage(), out);
    }
    for (auto& [cpu, adopted] : fresh) {  // another view of a buffer adopted already
      if (storage == cpu) return make_device_tensor(adopted, out);
    }
    if (C10_UNLIKELY(out._is_zerotensor())) return torch_neuronx::to_device(out, device);
    c10::Storage adopted = adopt_storage(out, device, outputs_sharing(storage));
    fresh.emplace_back(storage, adopted);
    return make_device_tensor(std::move(adopted), out);
  }

  // How many of this call's results hold `impl` (set before mapping results).
  size_t outputs_sharing(const c10::StorageImpl* impl) const {
    size_t n = 0;
    for (const auto* s : result_storages) n += (s == impl);
    return n == 0 ? 1 : n;
  }

  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 2> fresh;
  c10::SmallVector<const c10::StorageImpl*, 2> result_storages;

  // out= and in-place kernels may resize or restride their CPU alias: carry
  // the change over to the device tensor.
  void sync_mutated() {
    for (auto& [dev, alias] : aliases) {
      auto* alias_storage = alias.storage().unsafeGetStorageImpl();
      auto* dev_impl = dev.unsafeGetTensorImpl();
      if (alias_storage->data() != dev.storage().unsafeGetStorageImpl()->data()) {
        auto* dev_storage = dev.storage().unsafeGetStorageImpl();
        const size_t nbytes = alias_storage->nbytes();
        c10::DataPtr host = alias_storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
        dev_storage->set_data_ptr_noswap(adopt(std::move(host), nbytes, dev.device().index()));
        dev_storage->set_nbytes(nbytes);
      }
      if (alias.sizes() != dev.sizes() || alias.strides() != dev.strides() ||
          alias.storage_offset() != dev.storage_offset()) {
        dev_impl->set_sizes_and_strides(alias.sizes(), alias.strides(), alias.storage_offset());
      }
    }
  }
};

void cpu_tensor_error(const OpEntry& e, c10::DeviceIndex device) {
  device_mismatch(e, "neuron:" + std::to_string(device < 0 ? 0 : device), "cpu");
}

// Runs a functional op whose CPU kernel lacks a reduced-precision dtype in
// float32 and casts back: what an accelerator computes natively, the
// emulator computes wider. Counted and reported as a CPU fallback.
void run_widened(const c10::OperatorHandle& op, OpEntry& e, torch::jit::Stack* stack,
                 const std::vector<c10::IValue>& args, c10::ScalarType low, const c10::Error& original) {
  if (!g_fallback_allowed.load()) {
    TORCH_CHECK(false, original.what_without_backtrace(),
                "\n(torch_neuronx: running ", e.name, " in float32 on the host is a CPU fallback, which "
                "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION forbids)");
  }
  if (!e.warned.exchange(true)) {
    TORCH_WARN("torch_neuronx: ", e.name, " has no ", c10::toString(low),
               " kernel on the host; it runs in float32 and is cast back (reported as a CPU fallback "
               "by torch_neuronx.op_tracker)");
  }
  for (const auto& a : args) {
    if (a.isTensor() && a.toTensor().defined() && is_low_precision(a.toTensor().scalar_type())) {
      stack->emplace_back(a.toTensor().to(at::kFloat));
    } else {
      stack->push_back(a);
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  const size_t nret = op.schema().returns().size();
  for (size_t i = stack->size() - nret; i < stack->size(); ++i) {
    auto& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().scalar_type() == at::kFloat) {
      v = v.toTensor().to(low);
    }
  }
  e.fallback.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

at::Tensor to_device(const at::Tensor& cpu, c10::DeviceIndex index) {
  if (!cpu.defined()) return cpu;
  if (cpu._is_zerotensor()) {
    return at::_efficientzerotensor(cpu.sizes(), cpu.options().device(c10::Device(kNeuron, index)));
  }
  return make_device_tensor(adopt_storage(cpu, index, 1), cpu);
}

void check_dtype(c10::ScalarType dtype) {
  if (C10_UNLIKELY(dtype == at::kDouble || dtype == at::kComplexDouble)) {
    TORCH_CHECK_TYPE(false, "Trainium has no FP64 units, so neuron tensors cannot be ", c10::toString(dtype),
                     ". Use ", dtype == at::kDouble ? "torch.float32 (or torch.bfloat16)" : "torch.complex64",
                     " instead: convert with .to(torch.", dtype == at::kDouble ? "float32" : "complex64",
                     ") before moving the tensor to the device.");
  }
}

at::Tensor cpu_alias(const at::Tensor& t) {
  TORCH_CHECK(t.has_storage(), "neuron supports only strided (dense) tensors, got layout ", t.layout());
  const auto& storage = t.storage();
  // A non-owning view: the device tensor outlives the call, and the alias
  // never escapes it (results that share its storage are rewrapped).
  c10::DataPtr data(storage.mutable_data(), nullptr, nullptr, c10::Device(c10::DeviceType::CPU));
  c10::Storage alias_storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), storage.nbytes(), std::move(data), c10::GetCPUAllocator(), true));
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(alias_storage),
                                                      c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  auto* impl = out.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) impl->_set_conj(true);
  if (t.is_neg()) impl->_set_neg(true);
  return out;
}

void boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpEntry& e = entry_for(op);
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t begin = stack->size() - nargs;
  Call call{e};
  for (size_t i = begin; i < stack->size(); ++i) (*stack)[i] = call.to_cpu((*stack)[i]);
  if (call.device < 0) call.device = current_device();
  if (C10_UNLIKELY(call.pending_cpu && !call.aliases.empty())) cpu_tensor_error(e, call.device);

  std::optional<GeneratorLease> lease;
  if (e.generator_arg >= 0) {
    auto& slot = (*stack)[begin + e.generator_arg];
    at::Generator gen = slot.isNone() ? default_generator(call.device) : slot.toGenerator();
    TORCH_CHECK(gen.device().type() == kNeuron, "Expected a 'neuron' device type for generator but found '",
                gen.device().type(), "' (", e.name, ")");
    lease.emplace(gen);
    slot = c10::IValue(lease->engine());
  }

  std::vector<c10::IValue> saved;
  if (C10_UNLIKELY(call.low_precision != c10::ScalarType::Undefined && !e.mutates)) {
    saved.assign(stack->begin() + begin, stack->end());
  }
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  } catch (const c10::Error& err) {
    const std::string msg = err.what_without_backtrace();
    if (saved.empty() || msg.find("not implemented for '") == std::string::npos) throw;
    stack->resize(begin);
    run_widened(op, e, stack, saved, call.low_precision, err);
  }
  if (e.mutates) call.sync_mutated();

  const size_t nret = schema.returns().size();
  const size_t rbegin = stack->size() - nret;
  int64_t drawn = 0;
  for (size_t i = rbegin; i < stack->size(); ++i) {
    const auto& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined()) {
      check_strided(v.toTensor());
      call.result_storages.push_back(v.toTensor().storage().unsafeGetStorageImpl());
      drawn += v.toTensor().numel();
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        if (t.defined()) check_strided(t);
        if (t.defined()) call.result_storages.push_back(t.storage().unsafeGetStorageImpl());
      }
    }
  }
  for (size_t i = rbegin; i < stack->size(); ++i) {
    auto& v = (*stack)[i];
    if (v.isTensor()) {
      v = call.to_device(v.toTensor());
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t j = 0; j < list.size(); ++j) list.set(j, call.to_device(list.get(j)));
      v = list;
    }
  }
  if (lease) lease->consumed(drawn);
  e.executed.fetch_add(1, std::memory_order_relaxed);
}

std::vector<OpCount> op_counts() {
  std::lock_guard<std::mutex> lock(g_ops_mutex);
  std::vector<OpCount> out;
  for (const auto& [key, e] : g_ops) {
    const int64_t ex = e->executed.load(), fb = e->fallback.load();
    if (ex || fb) out.push_back({e->name, ex, fb});
  }
  return out;
}

void reset_op_counts() {
  std::lock_guard<std::mutex> lock(g_ops_mutex);
  for (auto& [key, e] : g_ops) {
    e->executed.store(0);
    e->fallback.store(0);
  }
}

void set_fallback_allowed(bool allowed) { g_fallback_allowed.store(allowed); }

// Structured functional ops resolve to a composite kernel that calls empty()
// and then the out= op: two trips through the fallback. Registering the
// fallback for them directly halves the per-op cost.
int route_structured_ops() {
  static int routed = [] {
    auto& dispatcher = c10::Dispatcher::singleton();
    auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                                   __LINE__);  // lives as long as the process, like the registrations
    int n = 0;
    for (const auto& name : dispatcher.getAllOpNames()) {
      if (!starts_with(name.name, "aten::") || name.name == "aten::copy_") continue;
      auto op = dispatcher.findOp(name);
      // Ops with a CPU kernel whose PrivateUse1 path is a composite: the
      // structured ops (CompositeExplicitAutogradNonFunctional), and the few
      // with a CompositeExplicitAutograd decomposition beside a CPU kernel
      // (native_layer_norm, native_group_norm, addr, ...), whose decomposition
      // would round differently from the CPU, the reference.
      if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
          !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
          !(op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
            op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd))) {
        continue;
      }
      std::string qualified = name.name.substr(6);
      if (!name.overload_name.empty()) qualified += "." + name.overload_name;
      lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&boxed_fallback>());
      ++n;
    }
    return n;
  }();
  return routed;
}

}  // namespace torch_neuronx

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&torch_neuronx::boxed_fallback>());
}
