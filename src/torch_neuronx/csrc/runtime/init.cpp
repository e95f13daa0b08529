// Emulated NeuronCores: how many there are, how much HBM each has, which one
// the calling thread uses, and whether this process may touch them at all.
//
// Initialisation belongs to torch.neuron (its `_lazy_init`, as torch.cuda's):
// the first C++ use of the device calls it through the registered callback,
// and it calls back `configure`. The flag here is the one truth for
// "initialised". Fork safety is PyTorch's own (torch/csrc/utils/
// device_lazy_init.h): once the device is initialised, a forked child is in a
// bad fork and every use raises.
#include "../neuron.h"

#include <pybind11/pybind11.h>
#include <torch/csrc/utils/device_lazy_init.h>

#include <atomic>
#include <mutex>

namespace py = pybind11;

namespace torch_neuronx {
namespace {

RuntimeConfig g_config;
std::atomic<bool> g_initialized{false};
std::mutex g_init_mutex;
py::object* g_init_callback = nullptr;  // leaked on purpose: outlives the interpreter's teardown
thread_local c10::DeviceIndex t_current_device = 0;
thread_local bool t_initializing = false;

[[noreturn]] void bad_fork() {
  TORCH_CHECK(false,
              "Cannot re-initialize neuron in a forked subprocess. To use the neuron device with "
              "multiprocessing, you must use the 'spawn' start method "
              "(torch.multiprocessing.set_start_method('spawn')).");
}

}  // namespace

void set_init_callback(py::object fn) {
  std::lock_guard<std::mutex> lock(g_init_mutex);
  delete g_init_callback;
  g_init_callback = new py::object(std::move(fn));
}

// Called by torch.neuron's initialiser, with the machine it read from the environment.
void configure(int64_t device_count, int64_t capacity_bytes, const std::string& description) {
  TORCH_CHECK(!g_initialized.load(), "torch_neuronx: the device is already initialised");
  TORCH_CHECK(device_count >= 1 && device_count <= kMaxDevices,
              "torch_neuronx: a process can address between 1 and ", static_cast<int>(kMaxDevices),
              " NeuronCores, got ", device_count);
  TORCH_CHECK(capacity_bytes > 0, "torch_neuronx: HBM capacity per core must be positive, got ", capacity_bytes);
  g_config.device_count = static_cast<c10::DeviceIndex>(device_count);
  g_config.capacity_bytes = capacity_bytes;
  g_config.description = description;
  for (c10::DeviceIndex i = 0; i < g_config.device_count; ++i) set_capacity(i, capacity_bytes);
  install_kernel_allocator();
  torch::utils::register_fork_handler_for_device_init(kNeuron);
}

bool in_bad_fork() { return torch::utils::is_device_in_bad_fork(kNeuron); }

const RuntimeConfig& runtime() {
  if (C10_LIKELY(g_initialized.load(std::memory_order_acquire))) {
    if (C10_UNLIKELY(in_bad_fork())) bad_fork();
    return g_config;
  }
  if (t_initializing) return g_config;  // the initialiser itself asked: it is configuring
  if (in_bad_fork()) bad_fork();
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
    struct Reset {
      ~Reset() { t_initializing = false; }
    } reset;
    TORCH_CHECK(g_init_callback != nullptr, "torch_neuronx: the device module is not loaded: import torch_neuronx");
    {
      py::gil_scoped_acquire gil;
      try {
        (*g_init_callback)();  // torch.neuron's initialiser: reads the environment, calls configure()
      } catch (py::error_already_set& e) {
        TORCH_CHECK(false, "torch_neuronx: failed to initialise the neuron device: ", e.what());
      }
    }
    g_initialized.store(true, std::memory_order_release);
  }
  return g_config;
}

bool is_initialized() { return g_initialized.load() && !in_bad_fork(); }

c10::DeviceIndex device_count_or_zero() {
  try {
    return runtime().device_count;
  } catch (...) {
    return 0;
  }
}

c10::DeviceIndex current_device() { return t_current_device; }

void check_index(int64_t index) {
  const auto n = runtime().device_count;
  TORCH_CHECK_INDEX(index >= 0 && index < n, "Invalid device ordinal neuron:", index, ": this process sees ",
                    static_cast<int>(n), " NeuronCore", n == 1 ? "" : "s", " (neuron:0 to neuron:",
                    static_cast<int>(n - 1), ") of the emulated instance (", g_config.description,
                    "). Set TORCH_NEURONX_INSTANCE_TYPE or NEURON_RT_VISIBLE_CORES for more.");
}

void set_current_device(c10::DeviceIndex index) {
  if (index == t_current_device) return;
  check_index(index);
  t_current_device = index;
}

}  // namespace torch_neuronx
