// Shared declarations of the torch-neuronx C++ core.
//
// The device is emulated on the host: device memory is host memory owned by
// the allocator (runtime/), and ATen's CPU kernels run on it through CPU
// tensors that alias it (aten/). Python owns policy (instance type,
// capacities, dtype advice); this core owns what must be fast or is reachable
// only from C++. Layout, as PyTorch's OpenReg backend:
//   runtime/      init (cores, lazy initialisation), allocator, guard, hooks, generator
//   aten/         kernels, the zero-copy fallback and what it needs, attention, autocast
//   distributed/  ProcessGroupNeuron
//   bindings.cpp  the Python bindings, all in one place
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <mutex>
#include <string>

namespace torch_neuronx {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;
// c10::DeviceIndex is an int8_t and device counts are DeviceIndex too: one
// process addresses at most 127 devices, neuron:0 to neuron:126.
constexpr c10::DeviceIndex kMaxDevices = 127;

// "1.50 GiB": the one byte formatter of the core (Python has its own).
std::string format_bytes(int64_t n);

// ---- runtime/init.cpp: emulated cores, lazy initialisation, fork safety ----
struct RuntimeConfig {
  c10::DeviceIndex device_count = 1;
  int64_t capacity_bytes = INT64_MAX;  // HBM per logical NeuronCore
  std::string description;             // e.g. "trn2.48xlarge, LNC=2"
};
// The configured cores; the first call initialises the device (through
// torch.neuron's Python initialiser) and every call raises in a bad fork.
const RuntimeConfig& runtime();
bool is_initialized();
bool in_bad_fork();
// The core count without raising (for noexcept interfaces): 0 in a bad fork
// or when initialisation fails.
c10::DeviceIndex device_count_or_zero();
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);
// torch.neuron.set_device: before the device initialises the choice is only remembered (no initialisation).
void select_device(int64_t index);
// Under a process group (called while the device initialises): this process attaches to device indices
// [first, first + count) of the node's device_count, and `first` becomes the process's default device.
void set_local_devices(int64_t first, int64_t count);
// Whether the device is initialised and `index` is one this process may use (no process group: any configured).
bool is_attached(int64_t index);
// Raises IndexError unless 0 <= index < device_count() (under a process group, ValueError unless the index
// is one this process attaches to); takes a wide integer
// so that out-of-range Python ints are caught before they are narrowed.
void check_index(int64_t index);
// runtime/guard.cpp: the calling thread's current stream on a (valid) core.
c10::StreamId current_stream_id(c10::DeviceIndex index);

// ---- runtime/allocator.cpp: the caching device allocator ----
c10::DeviceAllocator* device_allocator();
c10::DataPtr allocate_on(c10::DeviceIndex index, size_t nbytes);
// Takes ownership of a host buffer a CPU kernel produced, as device memory of
// core `index` (raising OutOfMemoryError over capacity), without a copy; on
// failure the buffer stays with the caller.
c10::DataPtr adopt(c10::DataPtr&& host, size_t nbytes, c10::DeviceIndex index);
void empty_cache();
// While alive, the calling thread's CPU allocations come from core `index`'s
// pools (host kernels run by the fallback: their results become device memory
// without a copy or a page fault). Nests.
class KernelAllocationScope {
 public:
  explicit KernelAllocationScope(c10::DeviceIndex index);
  ~KernelAllocationScope();

 private:
  c10::DeviceIndex previous_;
};
void install_kernel_allocator();  // once, when the device initialises
c10::Allocator* pinned_allocator();
bool is_pinned(const void* ptr);
c10::DeviceIndex device_of_ptr(const void* ptr);  // -1 if not device memory
void set_capacity(c10::DeviceIndex index, int64_t bytes);
int64_t capacity(c10::DeviceIndex index);

// ---- runtime/generator.cpp ----
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
// While held, `engine()` is the CPU generator a kernel may draw from; on
// release the generator's offset advances by `numel` draws.
class GeneratorLease {
 public:
  explicit GeneratorLease(const at::Generator& gen);
  ~GeneratorLease();
  at::Generator engine() const;
  void consumed(int64_t numel) { numel_ += numel; }

 private:
  at::Generator gen_;
  std::unique_lock<std::mutex> lock_;
  int64_t numel_ = 0;
};

// ---- aten/alias.cpp: the bridge between device tensors and CPU kernels ----
// A CPU tensor over the memory of device tensor `t` (no copy). With
// `keep_alive`, the alias holds a reference to the device storage (for work
// that outlives the call, e.g. a collective finishing on another thread).
at::Tensor cpu_alias(const at::Tensor& t, bool keep_alive = false);
// CPU aliases for the tensors of one call: views of one device storage share
// one alias storage, and a tensor passed twice gets one alias, so that ATen's
// overlap checks and is_alias_of guards see what the device tensors share.
class HostAliases {
 public:
  at::Tensor operator()(const at::Tensor& t);

 private:
  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 4> storages_;
  c10::SmallVector<std::pair<const c10::TensorImpl*, at::Tensor>, 4> tensors_;
};
// A CPU kernel's fresh result as a device tensor on core `index`: its buffer
// is adopted without a copy when nothing else holds it.
at::Tensor to_device(const at::Tensor& cpu, c10::DeviceIndex index);

// ---- runtime/memory_history.cpp ----
std::string python_stack_text();  // the calling thread's Python stack, innermost frame first

// ---- aten/dtype_policy.cpp ----
void check_dtype(c10::ScalarType dtype);  // the device's dtype policy: no quantized tensors

}  // namespace torch_neuronx
