// What the allocator shares with its history (memory_history.cpp) and with
// the bindings: the snapshot records, the history ring, allocator settings.
#pragma once

#include "../neuron.h"

#include <c10/core/CachingDeviceAllocator.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace torch_neuronx {

using DeviceStats = c10::CachingDeviceAllocator::DeviceStats;

// The size class of a request: what a block for it really holds.
size_t size_class(size_t nbytes);

// PYTORCH_ALLOC_CONF as this allocator reads it (alloc_conf.cpp).
struct AllocSettings {
  std::string text;                                     // the variable as set ("" when unset)
  size_t max_split_size = SIZE_MAX;                     // max_split_size_mb: larger cached blocks are never split
  size_t max_non_split_rounding = size_t{20} << 20;     // max_non_split_rounding_mb (c10's default, 20 MiB)
  double garbage_collection_threshold = 0.0;            // 0: off
  std::array<size_t, 16> divisions = [] {               // roundup_power2_divisions per interval [2^(20+i), 2^(21+i))
    std::array<size_t, 16> d{};
    d.fill(4);                                          // TorchNeuron rounds below 16 MiB in quarters by default
    return d;
  }();
  std::vector<std::string> ignored;                     // keys warned about and ignored
  size_t divisions_for(size_t nbytes) const;
};
// Parsed once, at the first allocation; a bad value raises ValueError (naming
// the variable and the key) at every call until it is fixed. Call it outside
// the allocator lock.
const AllocSettings& alloc_settings();
// The settings once parsed, else null (for paths that must not throw).
const AllocSettings* parsed_alloc_settings();

// The allocation history of one core, recorded while enabled (PyTorch's
// _record_memory_history semantics: "state" keeps stacks of live blocks,
// "all" also a bounded trace of every event).
class History {
 public:
  struct Entry {
    const char* action;  // "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"
    size_t addr;         // for "oom": the bytes free
    size_t size;
    c10::StreamId stream;
    int64_t time_us;
    std::shared_ptr<c10::GatheredContext> context;
  };

  // when: 0 never, 1 stacks of live blocks, 2 also the trace, 3 also stacks of frees (RecordContext);
  // skip: a bit per TraceEntry action that the trace leaves out (skip_actions).
  void configure(int when, bool trace, size_t max_entries, bool cpp_stacks, bool clear, uint32_t skip);
  bool tracing() const { return trace_.load(std::memory_order_relaxed); }
  // A stack for a new allocation, when recording asks for one; null (one atomic load) when it does not.
  // Call it without the allocator lock: it may walk the Python stack.
  std::shared_ptr<c10::GatheredContext> gather() const;
  // Called with or without the allocator lock; the ring has a lock of its own
  // (taken after the allocator's, never before it), so configure() and
  // entries() from other threads never see it half-written.
  void record(int action, c10::DeviceIndex device, size_t addr, size_t size, c10::StreamId stream,
              std::shared_ptr<c10::GatheredContext> context);
  void record_oom(c10::DeviceIndex device, size_t free_bytes, size_t size);
  std::vector<Entry> entries() const;  // a copy, oldest first

 private:
  std::atomic<int> when_{0};
  std::atomic<bool> trace_{false};
  std::atomic<bool> cpp_{false};
  mutable std::mutex mutex_;  // guards what follows
  uint32_t skip_ = 0;
  size_t max_entries_ = 0;
  std::vector<Entry> ring_;
  size_t next_ = 0;  // where the ring writes next, once full
};
History& history(c10::DeviceIndex index);

// One statistic, without copying them all (memory_allocated() is logged every step).
enum class MemoryStat : int { kAllocated = 0, kAllocatedPeak = 1, kReserved = 2, kReservedPeak = 3 };
int64_t memory_stat(c10::DeviceIndex index, MemoryStat which);

struct BlockSnapshot {
  size_t size;
  size_t requested;
  bool allocated;
  bool active;
  bool pending;
  std::shared_ptr<c10::GatheredContext> context;
};
struct SegmentSnapshot {
  c10::DeviceIndex device;
  size_t address;
  size_t total_size;
  c10::StreamId stream;
  bool small;
  std::vector<BlockSnapshot> blocks;
};
std::vector<SegmentSnapshot> snapshot_segments();

// memory_history.cpp: where an out-of-memory error writes a snapshot
// (TORCH_NEURONX_OOM_SNAPSHOT), or "" for nowhere. Called without the lock.
std::string write_oom_snapshot();

}  // namespace torch_neuronx
