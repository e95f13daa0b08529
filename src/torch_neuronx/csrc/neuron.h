// Shared declarations of the torch-neuronx C++ core.
//
// The device is emulated on the host: device memory is host memory owned by
// the allocator below, and ATen's CPU kernels run on it through aliasing CPU
// views (fallback.cpp). Python owns policy (instance type, capacities, dtype
// advice); this core owns what must be fast or is reachable only from C++.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torch_neuronx {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

// ---- runtime.cpp: emulated cores, lazy initialisation, fork safety ----
struct RuntimeConfig {
  c10::DeviceIndex device_count = 1;
  int64_t capacity_bytes = INT64_MAX;  // HBM per logical NeuronCore
  std::string description;             // e.g. "trn2.48xlarge, LNC=2"
};
// Configures the cores on first use (through the Python callback) and
// raises if the process is a fork of an initialised parent.
const RuntimeConfig& runtime();
bool is_initialized();
bool in_bad_fork();
c10::DeviceIndex device_count_noinit();
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);
void check_index(c10::DeviceIndex index);

// ---- allocator.cpp ----
c10::DeviceAllocator* device_allocator();
c10::DataPtr allocate_on(c10::DeviceIndex index, size_t nbytes);
// Takes ownership of a host buffer produced by a CPU kernel: the bytes are
// charged to `index` (raising OutOfMemoryError over capacity), no copy.
c10::DataPtr adopt(c10::DataPtr&& host, size_t nbytes, c10::DeviceIndex index);
c10::Allocator* pinned_allocator();
bool is_pinned(const void* ptr);
c10::DeviceIndex device_of_ptr(const void* ptr);  // -1 if not device memory
void set_capacity(c10::DeviceIndex index, int64_t bytes);

// ---- generator.cpp ----
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

// ---- fallback.cpp ----
at::Tensor cpu_alias(const at::Tensor& t);  // CPU view of device memory
// A CPU kernel's fresh result as a device tensor on core `index`: its buffer
// is adopted without a copy when nothing else holds it.
at::Tensor to_device(const at::Tensor& cpu, c10::DeviceIndex index);
void boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);
void check_dtype(c10::ScalarType dtype);  // the hardware's dtype policy

struct OpCount {
  std::string name;
  int64_t executed;
  int64_t fallback;
};
std::vector<OpCount> op_counts();
void reset_op_counts();
void set_fallback_allowed(bool allowed);
int route_structured_ops();  // returns how many ops were routed

}  // namespace torch_neuronx
