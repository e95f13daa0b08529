// Emulated NeuronCores: how many there are, how much HBM each has, which one
// the calling thread uses, and whether this process may touch them at all.
#include "neuron.h"

#include <pthread.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <mutex>

namespace py = pybind11;

namespace torch_neuronx {
namespace {

RuntimeConfig g_config;
std::atomic<bool> g_initialized{false};
std::atomic<bool> g_bad_fork{false};
std::mutex g_init_mutex;
py::object* g_init_callback = nullptr;  // leaked on purpose: outlives the interpreter's teardown
thread_local c10::DeviceIndex t_current_device = 0;
thread_local bool t_initializing = false;

void on_fork_child() {
  // The parent's emulated cores (and the Python state behind them) cannot be
  // shared with a forked child, exactly as with CUDA.
  if (g_initialized.load()) g_bad_fork.store(true);
}

const bool g_atfork_registered = [] {
  pthread_atfork(nullptr, nullptr, &on_fork_child);
  return true;
}();

}  // namespace

void set_init_callback(py::object fn) {
  std::lock_guard<std::mutex> lock(g_init_mutex);
  delete g_init_callback;
  g_init_callback = new py::object(std::move(fn));
}

void configure(int64_t device_count, int64_t capacity_bytes, const std::string& description) {
  TORCH_CHECK(device_count >= 1 && device_count <= 1024,
              "torch_neuronx: the emulated instance must have between 1 and 1024 NeuronCores, got ",
              device_count);
  TORCH_CHECK(capacity_bytes > 0, "torch_neuronx: HBM capacity per core must be positive");
  g_config.device_count = static_cast<c10::DeviceIndex>(device_count);
  g_config.capacity_bytes = capacity_bytes;
  g_config.description = description;
  for (c10::DeviceIndex i = 0; i < g_config.device_count; ++i) set_capacity(i, capacity_bytes);
}

const RuntimeConfig& runtime() {
  if (C10_LIKELY(g_initialized.load(std::memory_order_acquire))) {
    if (C10_UNLIKELY(g_bad_fork.load(std::memory_order_relaxed))) {
      TORCH_CHECK(false,
                  "Cannot re-initialize neuron in a forked subprocess. To use the neuron device with "
                  "multiprocessing, you must use the 'spawn' start method "
                  "(torch.multiprocessing.set_start_method('spawn')).");
    }
    return g_config;
  }
  if (t_initializing) return g_config;  // the callback itself asked: it is configuring
  std::unique_lock<std::mutex> lock(g_init_mutex, std::defer_lock);
  if (PyGILState_Check()) {
    // Waiting for the mutex with the GIL held would deadlock against an
    // initialising thread that waits for the GIL.
    py::gil_scoped_release release;
    lock.lock();
  } else {
    lock.lock();
  }
  if (!g_initialized.load()) {
    t_initializing = true;
    struct Reset { ~Reset() { t_initializing = false; } } reset;
    if (g_init_callback != nullptr) {
      py::gil_scoped_acquire gil;
      try {
        (*g_init_callback)();  // reads the environment and calls configure()
      } catch (py::error_already_set& e) {
        TORCH_CHECK(false, "torch_neuronx: failed to initialise the neuron device: ", e.what());
      }
    } else {
      configure(1, INT64_MAX, "unconfigured");
    }
    g_initialized.store(true, std::memory_order_release);
  }
  return g_config;
}

bool is_initialized() { return g_initialized.load(); }
bool in_bad_fork() { return g_bad_fork.load(); }

c10::DeviceIndex device_count_noinit() {
  // deviceCount() is noexcept in the guard interface: never throw from here.
  try {
    return runtime().device_count;
  } catch (...) {
    return g_config.device_count;
  }
}

c10::DeviceIndex current_device() { return t_current_device; }

void check_index(c10::DeviceIndex index) {
  const auto n = runtime().device_count;
  TORCH_CHECK_INDEX(index >= 0 && index < n, "Invalid device ordinal neuron:", static_cast<int>(index),
                    ": this emulated instance (", g_config.description, ") has ", static_cast<int>(n),
                    " NeuronCore", n == 1 ? "" : "s", " (valid: neuron:0 to neuron:", static_cast<int>(n - 1),
                    "). Set TORCH_NEURONX_INSTANCE_TYPE or NEURON_RT_VISIBLE_CORES for more.");
}

void set_current_device(c10::DeviceIndex index) {
  if (index == t_current_device) return;
  check_index(index);
  t_current_device = index;
}

}  // namespace torch_neuronx
