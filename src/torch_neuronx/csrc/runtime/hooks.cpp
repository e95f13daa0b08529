// The PrivateUse1 hooks: what ATen asks a backend it cannot see into.
#include "../neuron.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>

#include <cstring>

namespace torch_neuronx {
namespace {

struct Hooks final : at::PrivateUse1HooksInterface {
  void init() const override { runtime(); }
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return !in_bad_fork(); }  // emulated cores always exist
  // Only the cores this process attaches to have a context (autograd reads the current stream of each such
  // index when a backward pass starts; under a process group, other ranks' indices have none).
  bool hasPrimaryContext(c10::DeviceIndex index) const override { return is_attached(index); }
  c10::DeviceIndex deviceCount() const override { return device_count_or_zero(); }
  void setCurrentDevice(c10::DeviceIndex index) const override { set_current_device(index); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const auto old = current_device();
    set_current_device(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override { return exchangeDevice(index); }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override { return new_generator(index); }

  at::Device getDeviceFromPtr(void* data) const override {
    const auto index = device_of_ptr(data);
    TORCH_CHECK(index >= 0, "pointer ", data, " is not the start of a neuron device allocation");
    return {kNeuron, index};
  }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }

  // UntypedStorage.resize_() on the device: FSDP2 frees and re-materialises
  // unsharded parameters this way.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    TORCH_CHECK_VALUE(static_cast<int64_t>(newsize) >= 0, "a storage size must be a non-negative number of bytes, got ",
                      static_cast<int64_t>(newsize));
    const auto index = impl->device().index();
    c10::DataPtr fresh = allocate_on(index, newsize);
    const size_t keep = std::min(newsize, impl->nbytes());
    if (keep > 0) std::memcpy(fresh.get(), impl->data(), keep);
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

const bool g_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  return true;
}();

}  // namespace
}  // namespace torch_neuronx
