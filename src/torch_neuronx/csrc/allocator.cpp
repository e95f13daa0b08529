// Device memory: host buffers charged to a NeuronCore's HBM budget, with the
// CUDA-style statistics torch.accelerator and torch.neuron report.
#include "neuron.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/flat_hash_map.h>
#include <c10/util/irange.h>

#include <array>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace torch_neuronx {
namespace {

using c10::CachingAllocator::StatType;
using Stats = c10::CachingDeviceAllocator::DeviceStats;
constexpr size_t kAll = static_cast<size_t>(StatType::AGGREGATE);
constexpr size_t kMaxDevices = 128;  // c10::DeviceIndex is an int8_t

struct DeviceState {
  std::mutex mutex;
  Stats stats;
  int64_t capacity = INT64_MAX;
  ska::flat_hash_map<const void*, size_t> live;  // base pointer -> bytes (open addressing: no node allocations)
};
std::array<DeviceState, kMaxDevices> g_devices;

std::string format_bytes(int64_t n) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    snprintf(buf, sizeof(buf), "%lld bytes", static_cast<long long>(n));
  } else {
    snprintf(buf, sizeof(buf), "%.2f %s", v, units[u]);
  }
  return buf;
}

// The context of every device DataPtr: the host buffer (with its original
// deleter, so adopted CPU-kernel outputs are freed the way they were made)
// and what it was charged to.
struct Block {
  c10::DataPtr host;
  size_t nbytes;
  c10::DeviceIndex device;
};

// Charges `nbytes` to a core before any host memory is touched, so that a
// request over capacity fails cleanly and leaves the statistics consistent.
void charge(c10::DeviceIndex index, size_t nbytes) {
  auto& d = g_devices[index];
  std::lock_guard<std::mutex> lock(d.mutex);
  const int64_t in_use = d.stats.allocated_bytes[kAll].current;
  if (C10_UNLIKELY(static_cast<int64_t>(nbytes) > d.capacity - in_use)) {
    d.stats.num_ooms += 1;
    TORCH_CHECK_WITH(OutOfMemoryError, false, "neuron:", static_cast<int>(index),
                     " out of memory: tried to allocate ", format_bytes(nbytes), " (", nbytes,
                     " bytes), but ", format_bytes(in_use), " (", in_use, " bytes) of the core's ",
                     format_bytes(d.capacity), " HBM capacity are in use, leaving ",
                     format_bytes(d.capacity - in_use), " free (", runtime().description,
                     "). A Trainium NeuronCore would fail here too: reduce the batch size or "
                     "sequence length, shard the model over more cores (FSDP, tensor parallel), "
                     "use bf16, or pick an instance with more HBM per core.");
  }
  for (auto* s : {&d.stats.allocated_bytes[kAll], &d.stats.reserved_bytes[kAll],
                  &d.stats.active_bytes[kAll], &d.stats.requested_bytes[kAll]}) {
    s->increase(static_cast<int64_t>(nbytes));
  }
  for (auto* s : {&d.stats.allocation[kAll], &d.stats.segment[kAll], &d.stats.active[kAll]}) {
    s->increase(1);
  }
  d.stats.num_device_alloc += 1;
}

void uncharge(DeviceState& d, const void* ptr, size_t nbytes) {
  std::lock_guard<std::mutex> lock(d.mutex);
  for (auto* s : {&d.stats.allocated_bytes[kAll], &d.stats.reserved_bytes[kAll],
                  &d.stats.active_bytes[kAll], &d.stats.requested_bytes[kAll]}) {
    s->decrease(static_cast<int64_t>(nbytes));
  }
  for (auto* s : {&d.stats.allocation[kAll], &d.stats.segment[kAll], &d.stats.active[kAll]}) {
    s->decrease(1);
  }
  d.stats.num_device_free += 1;
  if (ptr != nullptr) d.live.erase(ptr);
}

void release(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  uncharge(g_devices[block->device], block->host.get(), block->nbytes);
  delete block;  // frees the host buffer through its own deleter
}

// Wraps a charged host buffer as device memory of core `index`.
c10::DataPtr wrap(c10::DataPtr&& host, size_t nbytes, c10::DeviceIndex index) {
  void* ptr = host.get();
  {
    auto& d = g_devices[index];
    std::lock_guard<std::mutex> lock(d.mutex);
    d.live.emplace(ptr, nbytes);
  }
  auto* block = new Block{std::move(host), nbytes, index};
  return {ptr, block, &release, c10::Device(kNeuron, index)};
}
struct NeuronAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override { return allocate_on(current_device(), nbytes); }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dst, const void* src, size_t n) const override { std::memcpy(dst, src, n); }
  bool initialized() override { return is_initialized(); }
  void emptyCache(c10::MempoolId_t) override {}  // no cache: freed memory returns at once
  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // streams are synchronous
  Stats getDeviceStats(c10::DeviceIndex index) override {
    check_index(index);
    auto& d = g_devices[index];
    std::lock_guard<std::mutex> lock(d.mutex);
    return d.stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex index) override {
    check_index(index);
    auto& d = g_devices[index];
    std::lock_guard<std::mutex> lock(d.mutex);
    for (const auto t : c10::irange(static_cast<size_t>(StatType::NUM_TYPES))) {
      for (auto* s : {&d.stats.allocation[t], &d.stats.segment[t], &d.stats.active[t],
                      &d.stats.allocated_bytes[t], &d.stats.reserved_bytes[t],
                      &d.stats.active_bytes[t], &d.stats.requested_bytes[t]}) {
        s->reset_accumulated();
      }
    }
    d.stats.num_alloc_retries = 0;
    d.stats.num_ooms = 0;
    d.stats.num_device_alloc = 0;
    d.stats.num_device_free = 0;
  }
  void resetPeakStats(c10::DeviceIndex index) override {
    check_index(index);
    auto& d = g_devices[index];
    std::lock_guard<std::mutex> lock(d.mutex);
    for (const auto t : c10::irange(static_cast<size_t>(StatType::NUM_TYPES))) {
      for (auto* s : {&d.stats.allocation[t], &d.stats.segment[t], &d.stats.active[t],
                      &d.stats.allocated_bytes[t], &d.stats.reserved_bytes[t],
                      &d.stats.active_bytes[t], &d.stats.requested_bytes[t]}) {
        s->reset_peak();
      }
    }
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex index) override {
    check_index(index);
    auto& d = g_devices[index];
    std::lock_guard<std::mutex> lock(d.mutex);
    const int64_t used = d.stats.allocated_bytes[kAll].current;
    return {static_cast<size_t>(d.capacity - used), static_cast<size_t>(d.capacity)};
  }
};
NeuronAllocator g_allocator;

// Host memory is already where the device reads from: "pinned" memory is
// plain host memory, remembered so that is_pinned() answers truthfully.
std::mutex g_pinned_mutex;
std::unordered_set<const void*> g_pinned;

void free_pinned(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned.erase(ptr);
  }
  c10::free_cpu(ptr);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nbytes ? c10::alloc_cpu(nbytes) : nullptr;
    if (ptr != nullptr) {
      std::lock_guard<std::mutex> lock(g_pinned_mutex);
      g_pinned.insert(ptr);
    }
    return {ptr, ptr, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dst, const void* src, size_t n) const override { std::memcpy(dst, src, n); }
};
PinnedAllocator g_pinned_allocator;

}  // namespace

REGISTER_ALLOCATOR(kNeuron, &g_allocator);

c10::DeviceAllocator* device_allocator() { return &g_allocator; }

c10::DataPtr allocate_on(c10::DeviceIndex index, size_t nbytes) {
  runtime();
  if (nbytes == 0) return {nullptr, nullptr, nullptr, c10::Device(kNeuron, index)};
  charge(index, nbytes);
  void* ptr = nullptr;
  try {
    ptr = c10::alloc_cpu(nbytes);
  } catch (...) {
    uncharge(g_devices[index], nullptr, nbytes);
    throw;
  }
  return wrap(c10::DataPtr(ptr, ptr, &c10::free_cpu, c10::Device(c10::DeviceType::CPU)), nbytes, index);
}

c10::DataPtr adopt(c10::DataPtr&& host, size_t nbytes, c10::DeviceIndex index) {
  charge(index, nbytes);  // on failure `host` stays with the caller, who frees it
  return wrap(std::move(host), nbytes, index);
}

c10::Allocator* pinned_allocator() { return &g_pinned_allocator; }

bool is_pinned(const void* ptr) {
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  return g_pinned.count(ptr) != 0;
}

c10::DeviceIndex device_of_ptr(const void* ptr) {
  const auto n = device_count_noinit();
  for (c10::DeviceIndex i = 0; i < n; ++i) {
    auto& d = g_devices[i];
    std::lock_guard<std::mutex> lock(d.mutex);
    if (d.live.count(ptr)) return i;
  }
  return -1;
}

void set_capacity(c10::DeviceIndex index, int64_t bytes) {
  TORCH_CHECK(index >= 0 && static_cast<size_t>(index) < kMaxDevices, "device index out of range");
  auto& d = g_devices[index];
  std::lock_guard<std::mutex> lock(d.mutex);
  d.capacity = bytes;
}

}  // namespace torch_neuronx
