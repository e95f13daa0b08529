// Declarations shared by the files of aten/: the op table the fallback
// consults, the fallback itself, and the dtype policy's widened execution.
#pragma once

#include "../neuron.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <string>
#include <vector>

namespace torch_neuronx {

// ---- op_table.cpp: what the fallback knows of each operator, computed once ----
struct OpEntry {
  std::string name;  // "aten::add.Tensor"
  std::atomic<int64_t> executed{0};
  std::atomic<int64_t> fallback{0};
  std::atomic<int64_t> widened{0};  // calls run in float32 on the host (no host kernel for the dtype)
  int generator_arg = -1;  // index of its Generator? argument, if any
  bool mutates = false;
  // Per argument (bit i = argument i; schemas have fewer than 64):
  uint64_t written = 0;  // Tensor(a!): in-place targets and out= tensors
  uint64_t cpu_ok = 0;   // may be a CPU tensor of any size, as on CUDA (index lists, lengths, ...)
  bool any_cpu_ok = false;  // every tensor argument may be on the CPU (c10d ops, lift)
  bool host_only = false;   // TorchNeuron runs it on the CPU whatever the dtypes (its CPU-fallback table)
  std::atomic<bool> warned{false};
};
OpEntry& entry_for(const c10::OperatorHandle& op);
// The entry of an op run by one of the device's own kernels (counted by name).
OpEntry& entry_named(const std::string& name);
bool fallback_allowed();

// Why TorchNeuron would run an op on the CPU rather than a NeuronCore.
enum class HostReason { kNone, kTable, kFloat64, kComplex, kWidened };
// The reason a tensor of this dtype gives (float64, complex), or kNone.
inline HostReason dtype_reason(c10::ScalarType t) {
  if (t == at::kDouble || t == at::kComplexDouble) return HostReason::kFloat64;
  if (t == at::kComplexFloat || t == at::kComplexHalf) return HostReason::kComplex;
  return HostReason::kNone;
}
inline HostReason stronger(HostReason a, HostReason b) { return a == HostReason::kNone ? b : a; }
// Counts one CPU fallback of `e`: raises when fallbacks are forbidden, warns the first time for the op.
// kWidened is the emulator's own detour (Trainium computes the dtype on a core): counted apart, silently.
void note_fallback(OpEntry& e, HostReason why);

struct OpCount {
  std::string name;
  int64_t executed;
  int64_t fallback;
  int64_t widened;
};
std::vector<OpCount> op_counts();
void reset_op_counts();
void set_fallback_allowed(bool allowed);
void set_fallback_stacks(bool record);                    // TORCH_NEURONX_ENABLE_STACK_TRACE
std::vector<std::pair<std::string, std::string>> fallback_stacks();  // op -> stack of its first fallback

// ---- fallback.cpp ----
void boxed_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// ---- routing.cpp ----
int route_structured_ops();  // returns how many ops were routed

// ---- dtype_policy.cpp ----
bool is_low_precision(c10::ScalarType t);
// Runs a functional op whose CPU kernel lacks a reduced-precision dtype in
// float32 and casts each result back to the dtype PyTorch's rules give it.
// False (nothing run, nothing counted) when float32 fails too: the caller
// raises the original error.
bool run_widened(const c10::OperatorHandle& op, OpEntry& e, torch::jit::Stack* stack,
                 const std::vector<c10::IValue>& args, c10::ScalarType low, const c10::Error& original);

// ---- alias.cpp ----
at::Tensor make_device_tensor(c10::Storage storage, const at::Tensor& like);
// Moves a CPU kernel's result buffer to the device. `holders` is how many of
// the call's own results hold it: any other holder (a CPU input, a cache)
// means the buffer is shared, and it is copied instead.
c10::Storage adopt_storage(const at::Tensor& out, c10::DeviceIndex device, size_t holders);

}  // namespace torch_neuronx
