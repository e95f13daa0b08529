// Python bindings of the core: the few entry points torch_neuronx's Python
// layers call, all in one place. Everything user-facing is in Python.
#include "aten/aten.h"
#include "runtime/allocator.h"
#include "runtime/profiler.h"

#include <torch/csrc/Generator.h>
#include <torch/extension.h>

namespace torch_neuronx {
pybind11::dict memory_snapshot(bool include_traces);
void record_memory_history(std::optional<std::string> enabled, std::optional<std::string> context,
                           const std::string& stacks, size_t max_entries, bool clear_history,
                           const std::vector<std::string>& skip_actions);
void set_init_callback(pybind11::object fn);
void configure(int64_t device_count, int64_t capacity_bytes, const std::string& description);
void init_distributed(pybind11::module& m);
}  // namespace torch_neuronx

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace torch_neuronx;
  m.doc() = "torch_neuronx C++ core: allocator, guard, hooks, generator, zero-copy fallback";
  m.attr("_MAX_DEVICES") = static_cast<int>(kMaxDevices);

  // runtime
  m.def("_set_init_callback", &set_init_callback);
  m.def("_configure", &configure);
  m.def("_is_initialized", &is_initialized);
  m.def("_in_bad_fork", &in_bad_fork);
  m.def("_lazy_init", [] { runtime(); });
  m.def("_device_count", [] { return static_cast<int>(runtime().device_count); });
  m.def("_current_device", [] { return static_cast<int>(current_device()); });
  m.def("_set_device", [](int64_t index) {
    check_index(index);
    set_current_device(static_cast<c10::DeviceIndex>(index));
  });
  m.def("_check_index", [](int64_t index) { check_index(index); });
  m.def("_select_device", &select_device);          // set_device, without initialising before first use
  m.def("_set_local_devices", &set_local_devices);  // the process group's per-rank device model
  m.def("_default_generator", [](int64_t index) {
    check_index(index);
    return pybind11::reinterpret_steal<pybind11::object>(
        THPGenerator_initDefaultGenerator(default_generator(static_cast<c10::DeviceIndex>(index))));
  });
  m.def("_set_capacity", [](int64_t index, int64_t bytes) {
    check_index(index);
    TORCH_CHECK_VALUE(bytes > 0, "HBM capacity must be a positive number of bytes, got ", bytes);
    set_capacity(static_cast<c10::DeviceIndex>(index), bytes);
  });
  m.def("_capacity", [](int64_t index) {
    check_index(index);
    return capacity(static_cast<c10::DeviceIndex>(index));
  });

  m.def("_empty_cache", &empty_cache);
  m.def("_record_memory_history", &record_memory_history);
  m.def("_memory_snapshot", &memory_snapshot, pybind11::arg("include_traces") = true);
  m.def("_memory_stat", [](int64_t index, int which) {
    check_index(index);
    return memory_stat(static_cast<c10::DeviceIndex>(index), static_cast<MemoryStat>(which));
  });
  m.def("_size_class", [](size_t nbytes) {
    alloc_settings();  // a bad PYTORCH_ALLOC_CONF raises here as at an allocation
    return size_class(nbytes);
  });

  // profiler: a compiled graph's execution as one device event (compile/backend.py)
  m.def("_device_profiling", &device_profiling);
  m.def("_run_graph", [](const std::string& name, int64_t device, const pybind11::object& fn,
                         const pybind11::object& inputs) {
    GraphEventScope event(name, static_cast<c10::DeviceIndex>(device));
    return fn(inputs);
  });

  // aten
  m.def("_op_counts", [] {
    std::vector<std::tuple<std::string, int64_t, int64_t, int64_t>> out;
    for (const auto& c : op_counts()) out.emplace_back(c.name, c.executed, c.fallback, c.widened);
    return out;
  });
  m.def("_reset_op_counts", &reset_op_counts);
  m.def("_set_fallback_allowed", &set_fallback_allowed);
  m.def("_set_fallback_stacks", &set_fallback_stacks);
  m.def("_fallback_stacks", &fallback_stacks);
  m.def("_route_structured_ops", &route_structured_ops);

  // distributed
  init_distributed(m);
}
