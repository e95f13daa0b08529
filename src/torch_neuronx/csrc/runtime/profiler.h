// Device events for torch.profiler (profiler.cpp): what the fallback, the
// device's kernels and the process group call around the work they time.
#pragma once

#include "../neuron.h"

#include <atomic>
#include <string>

namespace torch_neuronx {

extern std::atomic<bool> g_device_profiling;

// Whether a torch.profiler session records device activity (one relaxed load: the hot path's only cost).
inline bool device_profiling() { return g_device_profiling.load(std::memory_order_relaxed); }
int64_t profiler_now_ns();
// A device event on core `device` from `start_ns` to `end_ns` (`bytes` >= 0 for collectives).
void record_device_event(const std::string& name, c10::DeviceIndex device, int64_t start_ns, int64_t end_ns,
                         int64_t bytes = -1);

// Times one piece of device work while a session records.
class DeviceEventScope {
 public:
  DeviceEventScope(const std::string& name, c10::DeviceIndex device)
      : name_(device_profiling() ? &name : nullptr), device_(device), start_(name_ ? profiler_now_ns() : 0) {}
  ~DeviceEventScope() {
    if (name_ != nullptr) record_device_event(*name_, device_, start_, profiler_now_ns());
  }

 private:
  const std::string* name_;
  c10::DeviceIndex device_;
  int64_t start_;
};

// One execution of a compiled graph on core `device`, while a session records: one device event, linked to
// the CPU op that runs it; the host kernels it calls meanwhile record none of their own.
class GraphEventScope {
 public:
  GraphEventScope(std::string name, c10::DeviceIndex device);
  ~GraphEventScope();
  GraphEventScope(const GraphEventScope&) = delete;
  GraphEventScope& operator=(const GraphEventScope&) = delete;

 private:
  bool active_;
  std::string name_;
  c10::DeviceIndex device_;
  int64_t start_;
};

}  // namespace torch_neuronx
