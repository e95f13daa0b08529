// Emulated NeuronCores: how many there are, how much HBM each has, which one
// the calling thread uses, and whether this process may touch them at all.
//
// Initialisation belongs to torch.neuron (its `_lazy_init`, as torch.cuda's):
// the first C++ use of the device calls it through the registered callback,
// and it calls back `configure`. The flag here is the one truth for
// "initialised". Fork safety is PyTorch's own (torch/csrc/utils/
// device_lazy_init.h): once the device is initialised, a forked child is in a
// bad fork and every use raises.
//
// Under a process group the device follows TorchNeuron's per-rank model
// (its NeuronDevice.cpp): indices 0..local_world_size-1 exist on the node,
// this process attaches to exactly one of them, neuron:LOCAL_RANK, which is
// also the process-wide default device; touching any other index raises.
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
// -1: the process default (g_default_device, or 0), as TorchNeuron's worker threads inherit it.
thread_local int t_current_device = -1;
std::atomic<int> g_default_device{-1};
// The indices this process attaches to: [g_first_attached, g_first_attached + g_attached);
// g_attached == -1 means every configured index (no process group).
int g_first_attached = 0;
int g_attached = -1;
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

c10::DeviceIndex current_device() {
  if (t_current_device >= 0) return static_cast<c10::DeviceIndex>(t_current_device);
  const int fallback = g_default_device.load(std::memory_order_acquire);
  return static_cast<c10::DeviceIndex>(fallback >= 0 ? fallback : 0);
}

namespace {
[[noreturn]] void out_of_node_range(int64_t index, c10::DeviceIndex n) {
  TORCH_CHECK_VALUE(false, "Device index ", index, " is out of range. Valid range is 0 to ", static_cast<int>(n - 1),
                    " (under a process group a node's device indices are 0 to LOCAL_WORLD_SIZE - 1).");
}
}  // namespace

void check_index(int64_t index) {
  const auto n = runtime().device_count;
  if (g_attached < 0) {
    TORCH_CHECK_INDEX(index >= 0 && index < n, "Invalid device ordinal neuron:", index, ": this process sees ",
                      static_cast<int>(n), " NeuronCore", n == 1 ? "" : "s", " (neuron:0 to neuron:",
                      static_cast<int>(n - 1), ") of the emulated instance (", g_config.description,
                      "). Set TORCH_NEURONX_INSTANCE_TYPE or NEURON_RT_VISIBLE_CORES for more.");
    return;
  }
  if (index < 0 || index >= n) out_of_node_range(index, n);
  const int last = g_first_attached + g_attached - 1;
  TORCH_CHECK_VALUE(index >= g_first_attached && index <= last,
                    "Attempted to access device that doesn't attach to this process, received ", index,
                    index < g_first_attached ? " expected to be equal or greater than " : " expected to be at most ",
                    index < g_first_attached ? g_first_attached : last,
                    ". Under a process group each process owns one NeuronCore, neuron:LOCAL_RANK (neuron:",
                    g_first_attached, " here, torch.neuron.current_device()); put this process's tensors there.");
}

bool is_attached(int64_t index) {
  if (!is_initialized()) return false;
  if (g_attached < 0) return index >= 0 && index < g_config.device_count;
  return index >= g_first_attached && index < g_first_attached + g_attached;
}

void set_current_device(c10::DeviceIndex index) {
  if (index == current_device()) {
    t_current_device = index;
    return;
  }
  if (!g_initialized.load(std::memory_order_acquire) && !t_initializing) {
    // Before the device initialises, the device guard (torch.accelerator.set_device_index, Transformers'
    // _bind_local_device before init_process_group) only records the choice, as torch.neuron.set_device does:
    // starting the runtime here would make the process group refuse to start. The index is checked against the
    // visible cores when it is first used.
    TORCH_CHECK_INDEX(index >= 0 && index < kMaxDevices, "Invalid device ordinal neuron:", static_cast<int>(index));
    t_current_device = index;
    return;
  }
  if (g_attached >= 0) {
    // Under a process group only the range is checked here: PyTorch's autograd engine gives each device
    // index a worker thread that selects its index, attached or not; using an unattached index raises
    // (check_index), and torch.neuron.set_device refuses it outright.
    const auto n = runtime().device_count;
    if (index < 0 || index >= n) out_of_node_range(index, n);
  } else {
    check_index(index);
  }
  t_current_device = index;
}

void select_device(int64_t index) {
  if (!g_initialized.load(std::memory_order_acquire) && !t_initializing) {
    // Before the device initialises (torch.neuron.set_device(LOCAL_RANK) ahead of init_process_group): the
    // choice is remembered without initialising; torch.neuron has checked it against the visible cores.
    TORCH_CHECK_INDEX(index >= 0 && index < kMaxDevices, "Invalid device ordinal neuron:", index);
    t_current_device = static_cast<int>(index);
    return;
  }
  check_index(index);
  set_current_device(static_cast<c10::DeviceIndex>(index));
}

void set_local_devices(int64_t first, int64_t count) {
  TORCH_CHECK(!g_initialized.load() && t_initializing,
              "torch_neuronx: a process's devices are set while the device initialises, not after");
  const auto n = g_config.device_count;
  TORCH_CHECK_VALUE(count >= 1 && first >= 0 && first + count <= n, "torch_neuronx: devices ", first, " to ",
                    first + count - 1, " are not within the node's ", static_cast<int>(n), " device indices");
  g_first_attached = static_cast<int>(first);
  g_attached = static_cast<int>(count);
  t_current_device = static_cast<int>(first);
  g_default_device.store(static_cast<int>(first), std::memory_order_release);
}

}  // namespace torch_neuronx
