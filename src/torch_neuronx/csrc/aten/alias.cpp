// The bridge between device tensors and CPU kernels: CPU tensors over device
// memory (aliases) on the way in, device tensors over a kernel's buffers on
// the way out. Device memory is host memory, so neither direction copies.
#include "aten.h"

#include <c10/core/CPUAllocator.h>

#include <cstring>

namespace torch_neuronx {
namespace {

void drop_storage(void* ctx) { delete static_cast<c10::Storage*>(ctx); }

c10::Storage alias_storage(const c10::Storage& storage, bool keep_alive) {
  // Resizable with the CPU allocator: an out= kernel may grow its output,
  // and the fallback then moves the grown buffer to the device.
  c10::DataPtr data = keep_alive ? c10::DataPtr(storage.mutable_data(), new c10::Storage(storage), &drop_storage,
                                                c10::Device(c10::DeviceType::CPU))
                                 : c10::DataPtr(storage.mutable_data(), nullptr, nullptr,
                                                c10::Device(c10::DeviceType::CPU));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), storage.nbytes(),
                                                            std::move(data), c10::GetCPUAllocator(), true));
}

at::Tensor view_over(c10::Storage storage, const at::Tensor& like, c10::DispatchKey key) {
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), like.dtype());
  auto* impl = out.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) impl->_set_conj(true);
  if (like.is_neg()) impl->_set_neg(true);
  return out;
}

void check_has_storage(const at::Tensor& t) {
  TORCH_CHECK_NOT_IMPLEMENTED(t.has_storage(), "neuron supports only strided (dense) tensors, got layout ",
                              t.layout());
}

}  // namespace

at::Tensor cpu_alias(const at::Tensor& t, bool keep_alive) {
  if (!t.defined() || t.device().type() != kNeuron) return t;
  check_has_storage(t);
  return view_over(alias_storage(t.storage(), keep_alive), t, c10::DispatchKey::CPU);
}

at::Tensor HostAliases::operator()(const at::Tensor& t) {
  check_has_storage(t);
  const auto* tensor = t.unsafeGetTensorImpl();
  for (const auto& [impl, alias] : tensors_) {
    if (impl == tensor) return alias;
  }
  const auto* device_storage = t.storage().unsafeGetStorageImpl();
  c10::Storage shared;
  for (const auto& [impl, storage] : storages_) {
    if (impl == device_storage) shared = storage;
  }
  if (!shared) {
    shared = alias_storage(t.storage(), false);
    storages_.emplace_back(device_storage, shared);
  }
  at::Tensor alias = view_over(std::move(shared), t, c10::DispatchKey::CPU);
  tensors_.emplace_back(tensor, alias);
  return alias;
}

at::Tensor make_device_tensor(c10::Storage storage, const at::Tensor& like) {
  return view_over(std::move(storage), like, c10::DispatchKey::PrivateUse1);
}

c10::Storage adopt_storage(const at::Tensor& out, c10::DeviceIndex device, size_t holders) {
  check_dtype(out.scalar_type());
  auto* impl = out.storage().unsafeGetStorageImpl();
  const size_t nbytes = impl->nbytes();
  c10::DataPtr data;
  if (out.storage().use_count() <= holders) {
    c10::DataPtr host = impl->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU)));
    try {
      data = adopt(std::move(host), nbytes, device);
    } catch (...) {
      // Over capacity: the buffer goes back to its CPU tensor, which frees it.
      impl->set_data_ptr_noswap(std::move(host));
      throw;
    }
  } else {
    data = allocate_on(device, nbytes);
    if (nbytes) std::memcpy(data.get(), impl->data(), nbytes);
  }
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes,
                                                            std::move(data), device_allocator(), true));
}

at::Tensor to_device(const at::Tensor& cpu, c10::DeviceIndex index) {
  if (!cpu.defined()) return cpu;
  if (cpu._is_zerotensor()) {
    return at::_efficientzerotensor(cpu.sizes(), cpu.options().device(c10::Device(kNeuron, index)));
  }
  return make_device_tensor(adopt_storage(cpu, index, 1), cpu);
}

}  // namespace torch_neuronx
