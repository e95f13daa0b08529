// Nested tensors (torch.nested, strided layout) on the neuron device.
//
// A strided nested tensor is a buffer plus per-component sizes, strides and
// offsets; PyTorch implements its ops per backend (NestedTensorCPU,
// NestedTensorCUDA). Their CPU kernels only reshape that metadata and call
// ordinary ATen ops on the buffer, or read the buffer's memory directly, and
// a neuron buffer is host memory: so every nested op on neuron runs the CPU
// backend's nested kernel on the neuron tensor as it is, and the dense ops it
// calls on the buffer dispatch to the device as any other. Jagged nested
// tensors (layout=torch.jagged) are a Python subclass over dense tensors and
// use this for their strided-layout paths (SDPA among them).
//
// Without this, no kernel exists for NestedTensorPrivateUse1: metadata
// queries the autograd engine makes where it cannot throw (e.g.
// aten::_nested_tensor_size for an input that requires grad) abort the process.
#include "aten.h"

#include <torch/library.h>

namespace torch_neuronx {
namespace {

void nested_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  if (!op.hasComputedKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU)) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, op.schema().operator_name(),
                                " has no nested-tensor kernel (not on CPU either), so it cannot run on a nested "
                                "neuron tensor. Convert first: nt.to_padded_tensor(0.0) or nt.unbind() give dense "
                                "tensors; a jagged nested tensor's values() is dense too.");
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::NestedTensorCPU), stack);
}

void run_cpu_nested_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::NestedTensorCPU), stack);
}

// An op with both a composite kernel and a nested CPU kernel (matmul, linear, softmax, ...) would take the
// composite one for NestedTensorPrivateUse1 (it fills every backend without a kernel of its own, before any
// fallback), which cannot run on a nested tensor: give each such op the CPU nested kernel explicitly. Run
// once, when the library loads (a scan of the registered aten ops, about a millisecond).
const bool g_registered = [] {
  auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::NestedTensorPrivateUse1, __FILE__,
                                 __LINE__);  // leaked: registrations live as long as the process
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    const auto op = dispatcher.findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::NestedTensorPrivateUse1)) {
      continue;
    }
    const std::string qualified = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&run_cpu_nested_kernel>());
  }
  return true;
}();

// The ops that make a nested tensor out of dense ones dispatch on the dense buffer (PrivateUse1), with their
// size metadata on the CPU as always. Their CPU kernels build the nested tensor around the buffer they are
// given (or read it as host memory): run them on the neuron buffer itself, not on a CPU alias of it (whose
// nested tensor would be a CPU one), and without the fallback's one-device rule.
void run_cpu_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : {"_nested_view_from_buffer", "_nested_from_padded", "_nested_tensor_from_mask",
                           "_nested_from_padded_and_nested_example"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&run_cpu_kernel>());
  }
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&nested_fallback>());
}

}  // namespace torch_neuronx
