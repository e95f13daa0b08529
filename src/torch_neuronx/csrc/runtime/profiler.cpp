// Device activity in torch.profiler.
//
// profile(activities=[CPU, PrivateUse1]) asks Kineto for the device's
// activities; this file is the PrivateUse1 activity profiler Kineto asks
// (PyTorch's REGISTER_PRIVATEUSE1_PROFILER). While a session records, every
// op a NeuronCore runs (the fallback, the device's own kernels) and every
// collective becomes a device event: its name, its core, its duration, and
// the correlation id of the CPU op that launched it, so key_averages() shows
// device time and the Chrome trace has one track per core. The alternative,
// ProfilerStubs, serves only the legacy profiler and gives no device track.
// When nothing records, an op pays one relaxed atomic load.
#include "profiler.h"

#include <IActivityProfiler.h>
#include <libkineto.h>  // CpuTraceBuffer, complete
#include <output_base.h>
#include <time_since_epoch.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <chrono>
#include <deque>
#include <mutex>
#include <set>

namespace torch_neuronx {

std::atomic<bool> g_device_profiling{false};

namespace {

struct DeviceEvent {
  std::string name;
  c10::DeviceIndex device;
  int64_t start_ns;
  int64_t end_ns;
  uint64_t correlation;
  int64_t bytes;  // collectives: bytes moved; -1 otherwise
};

std::mutex g_mutex;
std::vector<DeviceEvent> g_events;
thread_local std::vector<uint64_t> t_correlation;

constexpr int64_t kDeviceId = 0;  // the trace's process for the device

class Session final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_events.clear();
    }
    g_device_profiling.store(true);
    status_ = libkineto::TraceStatus::RECORDING;
  }
  void stop() override {
    g_device_profiling.store(false);
    status_ = libkineto::TraceStatus::PROCESSING;
  }
  std::vector<std::string> errors() override { return {}; }
  void processTrace(libkineto::ActivityLogger& logger) override { processTrace(logger, nullptr, 0, 0); }
  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t,
                    int64_t) override {
    std::vector<DeviceEvent> events;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      events.swap(g_events);
    }
    for (const auto& e : events) {
      cores_.insert(e.device);
      activities_.emplace_back(span_, libkineto::ActivityType::CONCURRENT_KERNEL, e.name);
      auto& a = activities_.back();
      a.startTime = e.start_ns;
      a.endTime = e.end_ns;
      a.device = static_cast<int32_t>(kDeviceId);
      a.resource = e.device;
      a.id = static_cast<int32_t>(e.correlation);
      if (linked && e.correlation) a.linked = linked(static_cast<int32_t>(e.correlation));
      a.addMetadataQuoted("device", "neuron:" + std::to_string(e.device));
      if (e.bytes >= 0) a.addMetadataQuoted("bytes", std::to_string(e.bytes));
      a.log(logger);
    }
  }
  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(
        libkineto::DeviceInfo{kDeviceId, kDeviceId, "neuron", "NeuronCores (emulated " + runtime().description + ")"});
  }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto core : cores_) {
      out.push_back(libkineto::ResourceInfo{core, core, kDeviceId, "neuron:" + std::to_string(core)});
    }
    return out;
  }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }
  void pushCorrelationId(uint64_t id) override { t_correlation.push_back(id); }
  void popCorrelationId() override {
    if (!t_correlation.empty()) t_correlation.pop_back();
  }

 private:
  libkineto::TraceSpan span_{0, 0, "neuron"};
  std::deque<libkineto::GenericTraceActivity> activities_;
  std::set<int32_t> cores_;
};

class ActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return types_; }
  // A session only for profiles that ask for device activity: Kineto configures every registered child
  // profiler for every later session, CPU-only ones included, and skips a child that returns none. Device
  // kernels (CONCURRENT_KERNEL) are what PrivateUse1 adds; the runtime types come with ProfilerActivity.CPU too.
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config&) override {
    if (!types.count(libkineto::ActivityType::CONCURRENT_KERNEL)) return nullptr;
    return std::make_unique<Session>();
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t, int64_t,
                                                                 const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"neuron"};
  std::set<libkineto::ActivityType> types_{libkineto::ActivityType::CONCURRENT_KERNEL,
                                           libkineto::ActivityType::PRIVATEUSE1_RUNTIME};
};

REGISTER_PRIVATEUSE1_PROFILER(ActivityProfiler);

}  // namespace

int64_t profiler_now_ns() { return libkineto::timeSinceEpoch(std::chrono::system_clock::now()); }

namespace {
// Compiled graphs this thread is running: on hardware a graph is one NEFF execution, so the host kernels a
// graph calls (its extern calls, such as aten::mm.out) are not device events of their own.
thread_local int t_graph_depth = 0;
}  // namespace

void record_device_event(const std::string& name, c10::DeviceIndex device, int64_t start_ns, int64_t end_ns,
                         int64_t bytes) {
  if (t_graph_depth > 0) return;
  const uint64_t correlation = t_correlation.empty() ? 0 : t_correlation.back();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_device_profiling.load(std::memory_order_relaxed)) return;
  g_events.push_back({name, device, start_ns, end_ns, correlation, bytes});
}

GraphEventScope::GraphEventScope(std::string name, c10::DeviceIndex device)
    : active_(device_profiling()), name_(std::move(name)), device_(device), start_(active_ ? profiler_now_ns() : 0) {
  if (active_) ++t_graph_depth;
}

GraphEventScope::~GraphEventScope() {
  if (!active_) return;
  --t_graph_depth;
  record_device_event(name_, device_, start_, profiler_now_ns());
}

}  // namespace torch_neuronx
