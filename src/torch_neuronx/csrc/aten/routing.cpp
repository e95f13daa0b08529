// Ops registered to the boxed fallback by name, rather than reaching it by
// default, because their PrivateUse1 path would otherwise be a composite.
#include "aten.h"

#include <torch/library.h>

namespace torch_neuronx {
namespace {

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Composite kernels that refuse devices other than CPU/CUDA/XPU by name (the
// only one in torch 2.13: "mode only supports CPU, CUDA and XPU device
// type"). On CPU aliases the same composite runs as it does on CPU.
constexpr const char* kDeviceCheckingComposites[] = {"mode.values"};

}  // namespace

// Structured functional ops resolve to a composite kernel that calls empty()
// and then the out= op: two trips through the fallback. Registering the
// fallback for them directly halves the per-op cost.
int route_structured_ops() {
  static int routed = [] {
    auto& dispatcher = c10::Dispatcher::singleton();
    auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                                   __LINE__);  // lives as long as the process, like the registrations
    const auto fallback = [] { return torch::CppFunction::makeFromBoxedFunction<&boxed_fallback>(); };
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
      lib->impl(qualified.c_str(), fallback());
      ++n;
    }
    for (const char* qualified : kDeviceCheckingComposites) {
      lib->impl(qualified, fallback());
      ++n;
    }
    return n;
  }();
  return routed;
}

}  // namespace torch_neuronx
