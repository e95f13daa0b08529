// Device guard, streams and events. Work on the emulated device completes
// when the call returns, so streams are ordering labels and an event is the
// moment it was recorded; record, wait, query, synchronize and elapsed_time
// keep their CUDA meaning under that synchronous model.
#include "../neuron.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <array>
#include <atomic>
#include <chrono>

namespace torch_neuronx {
namespace {

struct Event {
  c10::DeviceIndex device;
  bool timing;
  bool recorded = false;
  std::chrono::steady_clock::time_point when;
};

// New streams come from a fixed pool per core and priority, as CUDA's do (32
// low-priority and 32 high-priority streams, handed out round-robin): ids
// recycle, so memory cached for one stream serves the next one that reuses
// the id, and a loop that makes a stream per step does not strand the cache.
// Id 0 is each core's default stream, 1-32 the low-priority pool, 33-64 the
// high-priority one.
constexpr uint32_t kStreamsPerPool = 32;
std::array<std::array<std::atomic<uint32_t>, 2>, kMaxDevices> g_pool_next{};

c10::StreamId pool_stream(c10::DeviceIndex index, bool high_priority) {
  const uint32_t k = g_pool_next[index][high_priority].fetch_add(1, std::memory_order_relaxed) % kStreamsPerPool;
  return 1 + (high_priority ? kStreamsPerPool : 0) + k;
}
thread_local std::array<c10::StreamId, kMaxDevices> t_current_stream{};

// "neuron" without an index means the calling thread's current core; any
// other index must name a visible core (it indexes per-core tables).
c10::Device resolve(c10::Device d) {
  if (!d.has_index()) return {kNeuron, current_device()};
  check_index(d.index());
  return d;
}

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNeuron; }

  c10::Device exchangeDevice(c10::Device d) const override {
    const auto old = current_device();
    if (d.index() != old) set_current_device(d.index());
    return {kNeuron, old};
  }
  c10::Device getDevice() const override { return {kNeuron, current_device()}; }
  void setDevice(c10::Device d) const override { set_current_device(d.index()); }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      set_current_device(d.index());
    } catch (...) {
    }
  }

  c10::Stream getStream(c10::Device d) const override {
    d = resolve(d);
    return c10::Stream(c10::Stream::UNSAFE, d, t_current_stream[d.index()]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, resolve(d), 0);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    d = resolve(d);
    return c10::Stream(c10::Stream::UNSAFE, d, pool_stream(d.index(), high_priority));
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return getStreamFromGlobalPool(d, priority < 0);  // CUDA: lower numbers are higher priorities
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    check_index(s.device_index());
    auto& slot = t_current_stream[s.device_index()];
    const auto old = slot;
    slot = s.id();
    return c10::Stream(c10::Stream::UNSAFE, s.device(), old);
  }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count_or_zero(); }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ",
                static_cast<int>(device_index), " does not match recording stream's device index ",
                static_cast<int>(stream.device_index()), ".");
    auto* e = static_cast<Event*>(*event);
    if (e == nullptr) {
      e = new Event{stream.device_index(), flag == c10::EventFlag::BACKEND_DEFAULT};
      *event = e;
    }
    e->recorded = true;
    e->when = std::chrono::steady_clock::now();
  }
  void block(void*, const c10::Stream&) const override {}  // recorded work is already done
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<Event*>(event);
  }
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const c10::DeviceIndex index) const override { check_index(index < 0 ? current_device() : index); }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}

  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<Event*>(start);
    auto* b = static_cast<Event*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->recorded && b->recorded,
                "Both events must be recorded before calculating elapsed time.");
    TORCH_CHECK(a->timing && b->timing,
                "Both events must be created with argument 'enable_timing=True' to measure elapsed time.");
    return std::chrono::duration<double, std::milli>(b->when - a->when).count();
  }
};

}  // namespace

c10::StreamId current_stream_id(c10::DeviceIndex index) { return t_current_stream[index]; }

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

}  // namespace torch_neuronx
