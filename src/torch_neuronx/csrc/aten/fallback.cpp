// The zero-copy boxed fallback: every ATen op without a neuron kernel of its
// own runs here. Device tensors become CPU tensors over the same memory, the
// CPU kernel runs, and its results come back as device tensors: in-place and
// out= results are the original tensors, views are views of device storage,
// fresh results adopt the kernel's buffer without a copy.
//
// Devices follow CUDA's rules: every tensor on one core; CPU tensors only as
// 0-dim scalars that are read, never written, or where CUDA takes them too
// (op_table.cpp). Views of one device storage share one CPU alias storage
// within a call, so ATen's overlap checks see what the device sees.
#include "aten.h"
#include "../runtime/profiler.h"

#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <optional>

namespace torch_neuronx {
namespace {

[[noreturn]] void device_mismatch(const OpEntry& e, const std::string& a, const std::string& b) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", a, " and ",
              b, "! (when running ", e.name, " on neuron; move the tensors with .to(device) first)");
}

void check_strided(const at::Tensor& out) {
  TORCH_CHECK_NOT_IMPLEMENTED(out.layout() == c10::kStrided, "neuron supports only strided (dense) tensors; this op "
                              "produced a ", out.layout(), " tensor. Keep sparse work on the CPU.");
}

// Converts one call's arguments to CPU and maps its results back.
class Call {
 public:
  explicit Call(const OpEntry& entry) : entry_(entry) {}

  c10::DeviceIndex device = -1;
  c10::ScalarType low_precision = c10::ScalarType::Undefined;
  HostReason host = HostReason::kNone;  // why TorchNeuron would run this call on the CPU

  c10::IValue to_cpu(const c10::IValue& v, size_t arg) {
    if (v.isTensor()) return to_cpu(v.toTensor(), arg);
    // Lists are rebuilt, never edited: the caller may hold the same list.
    if (v.isTensorList()) {
      const auto list = v.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back(to_cpu(t, arg));
      return out;
    }
    if (v.isList()) {  // Tensor?[] and nested lists
      const auto list = v.toList();
      c10::impl::GenericList out(list.elementType());
      out.reserve(list.size());
      for (const c10::IValue& item : list) out.push_back(to_cpu(item, arg));
      return out;
    }
    if (v.isDevice() && v.toDevice().type() == kNeuron) {
      if (device < 0 && v.toDevice().has_index()) {
        check_index(v.toDevice().index());
        device = v.toDevice().index();
      }
      return c10::IValue(c10::Device(c10::DeviceType::CPU));
    }
    return v;
  }

  // Raises the CUDA error if the call mixed CPU tensors in where CUDA refuses them.
  void check_devices() const {
    if (C10_UNLIKELY(cpu_error_ && !aliased_.empty())) {
      device_mismatch(entry_, "neuron:" + std::to_string(device < 0 ? 0 : device), "cpu");
    }
  }

  at::Tensor to_device(const at::Tensor& out) {
    if (!out.defined() || out.device().type() != c10::DeviceType::CPU) return out;
    for (auto& [dev, alias] : aliased_) {  // in-place and out=: the original tensor
      if (out.unsafeGetTensorImpl() == alias.unsafeGetTensorImpl()) return dev;
    }
    const auto* storage = out.storage().unsafeGetStorageImpl();
    for (auto& [dev, alias] : aliased_) {  // a view of an input
      if (storage == alias.storage().unsafeGetStorageImpl()) return make_device_tensor(dev.storage(), out);
    }
    for (auto& [cpu, adopted] : fresh_) {  // another view of a buffer adopted already
      if (storage == cpu) return make_device_tensor(adopted, out);
    }
    if (C10_UNLIKELY(out._is_zerotensor())) return torch_neuronx::to_device(out, device);
    // A CPU input's buffer is the user's: copied, never taken.
    const size_t holders = is_cpu_input(storage) ? 0 : outputs_sharing(storage);
    c10::Storage adopted = adopt_storage(out, device, holders);
    fresh_.emplace_back(storage, adopted);
    return make_device_tensor(std::move(adopted), out);
  }

  void note_result(const at::Tensor& t) { result_storages_.push_back(t.storage().unsafeGetStorageImpl()); }

  // out= and in-place kernels may resize or restride their CPU alias: carry
  // the change over to the device tensor. Aliases sharing a storage move its
  // buffer once.
  void sync_mutated() {
    for (auto& [dev, alias] : aliased_) {
      auto* alias_storage = alias.storage().unsafeGetStorageImpl();
      auto* dev_storage = dev.storage().unsafeGetStorageImpl();
      if (alias_storage->data() != dev_storage->data() && alias_storage->data_ptr().get() != nullptr) {
        const size_t nbytes = alias_storage->nbytes();
        c10::DataPtr host = alias_storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
        dev_storage->set_data_ptr_noswap(adopt(std::move(host), nbytes, dev.device().index()));
        dev_storage->set_nbytes(nbytes);
        // Other aliases of this storage now point at the device's new buffer.
        alias_storage->set_data_ptr_noswap(
            c10::DataPtr(dev_storage->mutable_data(), nullptr, nullptr, c10::Device(c10::DeviceType::CPU)));
        alias_storage->set_nbytes(nbytes);
      }
      auto* dev_impl = dev.unsafeGetTensorImpl();
      if (alias.sizes() != dev.sizes() || alias.strides() != dev.strides() ||
          alias.storage_offset() != dev.storage_offset()) {
        dev_impl->set_sizes_and_strides(alias.sizes(), alias.strides(), alias.storage_offset());
      }
    }
  }

 private:
  at::Tensor to_cpu(const at::Tensor& t, size_t arg) {
    if (!t.defined()) return t;
    const auto type = t.device().type();
    if (type == kNeuron) {
      const auto index = t.device().index();
      if (device < 0) {
        device = index;
      } else if (index != device) {
        device_mismatch(entry_, "neuron:" + std::to_string(device), "neuron:" + std::to_string(index));
      }
      if (low_precision == c10::ScalarType::Undefined && is_low_precision(t.scalar_type())) {
        low_precision = t.scalar_type();
      }
      host = stronger(host, dtype_reason(t.scalar_type()));
      auto alias = aliases_(t);
      aliased_.emplace_back(t, alias);
      return alias;
    }
    if (type == c10::DeviceType::CPU && !entry_.any_cpu_ok) {
      const uint64_t bit = uint64_t{1} << arg;
      if (entry_.written & bit) {
        // A CPU tensor as out= or in-place target of a neuron op: CUDA refuses
        // it, and the result would otherwise take over the user's buffer.
        device_mismatch(entry_, "neuron:" + std::to_string(device < 0 ? current_device() : device), "cpu");
      }
      if (t.dim() > 0 && !(entry_.cpu_ok & bit)) cpu_error_ = true;
      if (t.has_storage()) cpu_inputs_.push_back(t.storage().unsafeGetStorageImpl());
    }
    return t;
  }

  bool is_cpu_input(const c10::StorageImpl* impl) const {
    for (const auto* s : cpu_inputs_) {
      if (s == impl) return true;
    }
    return false;
  }

  // How many of this call's results hold `impl` (noted before mapping results).
  size_t outputs_sharing(const c10::StorageImpl* impl) const {
    size_t n = 0;
    for (const auto* s : result_storages_) n += (s == impl);
    return n == 0 ? 1 : n;
  }

  const OpEntry& entry_;
  HostAliases aliases_;
  bool cpu_error_ = false;
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 4> aliased_;  // (device tensor, CPU alias)
  c10::SmallVector<const c10::StorageImpl*, 2> cpu_inputs_;
  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 2> fresh_;
  c10::SmallVector<const c10::StorageImpl*, 2> result_storages_;
};

}  // namespace

void boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpEntry& e = entry_for(op);
  const auto& schema = op.schema();
  const size_t nargs = schema.arguments().size();
  const size_t begin = stack->size() - nargs;
  Call call{e};
  if (C10_UNLIKELY(e.host_only)) call.host = HostReason::kTable;
  for (size_t i = begin; i < stack->size(); ++i) (*stack)[i] = call.to_cpu((*stack)[i], i - begin);
  if (call.device < 0) call.device = current_device();
  call.check_devices();
  if (C10_UNLIKELY(call.host != HostReason::kNone)) note_fallback(e, call.host);  // raises if forbidden

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
  KernelAllocationScope scope(call.device);  // the kernel's results are allocated as device memory
  DeviceEventScope event(e.name, call.device);  // torch.profiler's device track, while it records
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  } catch (const c10::Error& err) {
    const std::string msg = err.what_without_backtrace();
    bool widened = false;
    if (!saved.empty() && msg.find("not implemented for '") != std::string::npos) {
      stack->resize(begin);
      widened = run_widened(op, e, stack, saved, call.low_precision, err);
    }
    if (!widened) {
      // A kernel may resize its out= tensor before it fails (a later check
      // raises): the device tensor keeps what the CPU tensor would keep.
      if (e.mutates) call.sync_mutated();
      throw;
    }
  } catch (...) {
    if (e.mutates) call.sync_mutated();
    throw;
  }
  if (e.mutates) call.sync_mutated();

  const size_t nret = schema.returns().size();
  const size_t rbegin = stack->size() - nret;
  int64_t drawn = 0;
  HostReason produced = HostReason::kNone;  // float64 or complex results of other inputs
  for (size_t i = rbegin; i < stack->size(); ++i) {
    const auto& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined()) {
      check_strided(v.toTensor());
      call.note_result(v.toTensor());
      drawn += v.toTensor().numel();
      produced = stronger(produced, dtype_reason(v.toTensor().scalar_type()));
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        if (!t.defined()) continue;
        check_strided(t);
        call.note_result(t);
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
  if (C10_UNLIKELY(produced != HostReason::kNone && call.host == HostReason::kNone)) note_fallback(e, produced);
}

}  // namespace torch_neuronx

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&torch_neuronx::boxed_fallback>());
}
