// What the allocator shares with its history (memory_history.cpp) and with
// the bindings: the snapshot records, the history ring, allocator settings.
#pragma once

#include "../neuron.h"

#include <c10/core/CachingDeviceAllocator.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace torch_neuronx {

using DeviceStats = c10::CachingDeviceAllocator::DeviceStats;

// The size class of a request: what a block for it really holds.
size_t size_class(size_t nbytes);

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

  // when: 0 never, 1 stacks of live blocks, 2 also the trace, 3 also stacks of frees (RecordContext)
  void configure(int when, bool trace, size_t max_entries, bool cpp_stacks, bool clear);
  bool tracing() const { return trace_.load(std::memory_order_relaxed); }
  // A stack for a new allocation, when recording asks for one (call without the allocator lock).
  std::shared_ptr<c10::GatheredContext> gather() const;
  // Under the allocator lock:
  void record(int action, c10::DeviceIndex device, size_t addr, size_t size, c10::StreamId stream,
              std::shared_ptr<c10::GatheredContext> context);
  void record_oom(c10::DeviceIndex device, size_t free_bytes, size_t size);
  std::vector<Entry> entries() const;

 private:
  std::atomic<int> when_{0};
  std::atomic<bool> trace_{false};
  bool cpp_ = false;
  size_t max_entries_ = 0;
  std::vector<Entry> ring_;
  size_t next_ = 0;  // where the ring writes next, once full
};
History& history(c10::DeviceIndex index);

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
