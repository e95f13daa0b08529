// Python bindings of the core: the few entry points torch_neuronx's Python
// layers call. Everything user-facing is in Python.
#include "neuron.h"

#include <torch/csrc/Generator.h>
#include <torch/extension.h>

namespace torch_neuronx {
void set_init_callback(pybind11::object fn);
void configure(int64_t device_count, int64_t capacity_bytes, const std::string& description);
void init_distributed(pybind11::module& m);
}  // namespace torch_neuronx

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace torch_neuronx;
  m.doc() = "torch_neuronx C++ core: allocator, guard, hooks, generator, zero-copy fallback";
  m.def("_set_init_callback", &set_init_callback);
  init_distributed(m);
  m.def("_configure", &configure);
  m.def("_is_initialized", &is_initialized);
  m.def("_in_bad_fork", &in_bad_fork);
  m.def("_lazy_init", [] { runtime(); });
  m.def("_device_count", [] { return static_cast<int>(runtime().device_count); });
  m.def("_current_device", [] { return static_cast<int>(current_device()); });
  m.def("_set_device", [](int index) { set_current_device(static_cast<c10::DeviceIndex>(index)); });
  m.def("_default_generator", [](int index) {
    return pybind11::reinterpret_steal<pybind11::object>(
        THPGenerator_initDefaultGenerator(default_generator(static_cast<c10::DeviceIndex>(index))));
  });
  m.def("_op_counts", [] {
    std::vector<std::tuple<std::string, int64_t, int64_t>> out;
    for (const auto& c : op_counts()) out.emplace_back(c.name, c.executed, c.fallback);
    return out;
  });
  m.def("_reset_op_counts", &reset_op_counts);
  m.def("_set_fallback_allowed", &set_fallback_allowed);
  m.def("_route_structured_ops", &route_structured_ops);
  m.def("_set_capacity", [](int index, int64_t bytes) {
    check_index(static_cast<c10::DeviceIndex>(index));
    set_capacity(static_cast<c10::DeviceIndex>(index), bytes);
  });
  m.def("_data_ptr_device", [](uint64_t ptr) {
    return static_cast<int>(device_of_ptr(reinterpret_cast<const void*>(ptr)));
  });
}
