// Device memory: a caching allocator modelled on TorchNeuron's (and CUDA's).
//
// Device memory is host memory, carved out of segments that count against a
// NeuronCore's HBM capacity. As TorchNeuron documents its allocator:
//  * requests under 1 MiB are served from a small pool (2 MiB segments),
//    larger ones from a large pool (20 MiB segments for requests under
//    10 MiB, else a segment of the request rounded to 2 MiB);
//  * requests under 16 MiB are rounded up to a size class: 256 bytes at
//    least, then each power-of-two interval split in 4 (or in
//    PYTORCH_ALLOC_CONF's roundup_power2_divisions, alloc_conf.cpp);
//  * a freed block stays cached in its segment for the next request on the
//    same stream (and of the same pool); blocks are split and merged;
//    empty_cache() returns whole free segments; a request that does not fit
//    first frees cached segments and retries (num_alloc_retries), then raises
//    torch.OutOfMemoryError.
// Every byte a segment holds, cached or live, counts against the capacity.
// Segments start on 512-byte boundaries, and so does every block of 512
// bytes or more, as on CUDA: a 256-byte block (TorchNeuron's smallest size
// class) takes one half of a 512-byte slot, and a free block never merges
// into one that would start off a boundary.
//
// Host kernels allocate their results here too: while the fallback runs a
// CPU kernel for core d (KernelAllocationScope), the CPU allocator hands out
// blocks of core d's pools ("kernel blocks"). A kernel block that becomes a
// device tensor's storage (adopt) is then counted as an allocation; one the
// kernel frees again (a temporary) only ever occupied cached space. Results
// of host code that bypasses the CPU allocator are adopted as segments of
// their own.
//
// Statistics use CUDA's keys (torch.accelerator.memory_stats reads them);
// history and snapshots use PyTorch's snapshot format (memory_history.cpp).
#include "allocator.h"

#include <ATen/core/TensorBase.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/irange.h>

#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <thread>

namespace torch_neuronx {

using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;

namespace {

constexpr size_t kSmallSize = 1 << 20;       // below: the small pool (TorchNeuron: requests under 1 MB)
constexpr size_t kSmallBuffer = 2 << 20;     // small-pool segment
constexpr size_t kMinLargeAlloc = 10 << 20;  // below: a shared large segment
constexpr size_t kRoundLarge = 2 << 20;      // larger segments are rounded to this
constexpr size_t kRoundedBelow = 16 << 20;   // requests below are rounded to a size class (TorchNeuron)
constexpr size_t kMinBlockSize = 256;        // the smallest size class (TorchNeuron)
constexpr size_t kAlignment = 512;           // segments and blocks of this size or more start on this boundary
constexpr size_t kLargeBuffer = 20 << 20;    // a shared large-pool segment

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }
bool aligned(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % kAlignment == 0; }

// The settings in force: PYTORCH_ALLOC_CONF once parsed (every path into the
// pools parses it first), else c10's defaults.
const AllocSettings& settings_now() {
  static const AllocSettings defaults;
  const AllocSettings* parsed = parsed_alloc_settings();
  return parsed != nullptr ? *parsed : defaults;
}

}  // namespace

std::string format_bytes(int64_t n) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (std::abs(v) >= 1024.0 && u < 4) {
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

// c10's round_size with TorchNeuron's smallest class: a power of two stays as
// it is; otherwise the power-of-two interval [2^k, 2^(k+1)) holding the
// request is split in its roundup_power2_divisions (looked up by k, as c10
// does), and 0 or 1 divisions mean 512-byte steps.
size_t size_class(size_t nbytes) {
  if (nbytes <= kMinBlockSize) return kMinBlockSize;
  if (nbytes >= kRoundedBelow) return round_up(nbytes, kAlignment);
  const size_t divisions = settings_now().divisions_for(nbytes);
  if (divisions <= 1) return round_up(nbytes, kAlignment);
  const size_t lower = size_t{1} << (63 - __builtin_clzll(nbytes));
  const size_t step = std::max<size_t>(lower / divisions, kAlignment);
  return round_up(nbytes, step);  // at most 2 * lower: step divides it
}

namespace {

// ---------------------------------------------------------------- blocks and pools

struct Pool;

struct Block {
  c10::DeviceIndex device;
  Pool* pool;
  char* ptr;
  size_t size;            // bytes of the segment this block covers
  size_t requested = 0;   // bytes asked for (0 while free)
  c10::StreamId stream;   // the stream the block's memory belongs to
  bool allocated = false;
  bool kernel = false;    // handed to a host kernel, not (yet) a device tensor's storage
  bool pending = false;   // freed, but recorded on another stream: reused once that is safe
  bool quick = false;     // freed into its device's quick list
  Block* prev = nullptr;  // neighbours in the segment
  Block* next = nullptr;
  ska::flat_hash_set<c10::StreamId> stream_uses;
  std::shared_ptr<c10::GatheredContext> context;
  c10::DataPtr foreign;   // a host buffer adopted as a segment of its own (not cached)
};

struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};

struct Pool {
  bool small;
  std::set<Block*, BlockOrder> free;
};

// A quick list holds whole blocks of one size, stream and pool.
struct QuickKey {
  c10::StreamId stream;
  size_t size;
  bool small;
  bool operator==(const QuickKey& o) const { return stream == o.stream && size == o.size && small == o.small; }
};
struct QuickKeyHash {
  size_t operator()(const QuickKey& k) const {
    size_t h = std::hash<int64_t>()(k.stream);
    h ^= std::hash<size_t>()(k.size) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h ^ static_cast<size_t>(k.small);
  }
};

struct DeviceState {
  Pool small{true, {}};
  Pool large{false, {}};
  // Freed blocks kept whole, by (stream, size): the next request of that size
  // takes one without searching, splitting or merging (eager code allocates
  // the same sizes over and over). They go back into the pools, merged, when
  // a request finds no fit there, and before cached segments are released.
  ska::flat_hash_map<QuickKey, std::vector<Block*>, QuickKeyHash> quick;
  DeviceStats stats;
  int64_t capacity = INT64_MAX;
  std::vector<Block*> pending;   // freed blocks waiting for their streams
  History history;
};

// One allocator lock. Allocation and free hold it for a few hundred
// instructions: a spin lock costs a fraction of a mutex uncontended, and
// yields the core when it has to wait.
class SpinLock {
 public:
  void lock() {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      while (flag_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  void unlock() { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};
SpinLock g_mutex;
std::array<DeviceState, kMaxDevices> g_devices;
ska::flat_hash_map<const void*, Block*> g_allocated;  // block start -> block, for every live block
thread_local c10::DeviceIndex t_kernel_device = -1;

// Fork safety: a child forked while another thread holds the lock must not
// inherit it locked (the child cannot use the device, but it frees memory).
const bool g_atfork = [] {
  pthread_atfork([] { g_mutex.lock(); }, [] { g_mutex.unlock(); }, [] { g_mutex.unlock(); });
  return true;
}();

StatType pool_stat(const Pool* pool) { return pool->small ? StatType::SMALL_POOL : StatType::LARGE_POOL; }

template <typename Fn>
void for_stat_types(const Pool* pool, Fn&& fn) {
  fn(static_cast<size_t>(StatType::AGGREGATE));
  fn(static_cast<size_t>(pool_stat(pool)));
}

c10::Device neuron(c10::DeviceIndex index) { return {kNeuron, index}; }

size_t segment_size(const Pool& pool, size_t size) {
  if (pool.small) return kSmallBuffer;
  if (size < kMinLargeAlloc) return kLargeBuffer;
  return round_up(size, kRoundLarge);
}

bool should_split(const Block* block, size_t size) {
  const size_t remaining = block->size - size;
  if (block->pool->small) return remaining >= kMinBlockSize;
  return size < settings_now().max_split_size && remaining > kSmallSize;
}

bool oversize(const Block* block) { return !block->pool->small && block->size >= settings_now().max_split_size; }

void report_to_profiler(const Block* block, int64_t delta, const DeviceStats& stats) {
  if (c10::memoryProfilingEnabled()) {
    c10::reportMemoryUsageToProfiler(block->ptr, delta,
                                     stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].current,
                                     stats.reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)].current,
                                     neuron(block->device));
  }
}

// ---------------------------------------------------------------- the core (g_mutex held)

// Why a request failed, for the error raised once the lock is released.
struct Oom {
  size_t nbytes = 0, size = 0, segment = 0;
  int64_t capacity = 0, allocated = 0, reserved = 0;
};

class Core {
 public:
  explicit Core(c10::DeviceIndex index) : index_(index), d_(g_devices[index]) {}

  // A block of at least `nbytes` on `stream`: from the cache, a new segment, or
  // after freeing the cache; null if it does not fit (`oom` says why).
  Block* malloc(size_t nbytes, c10::StreamId stream, bool kernel, std::shared_ptr<c10::GatheredContext> context,
                Oom* oom) {
    process_pending();
    const size_t size = size_class(nbytes);
    Pool& pool = nbytes < kSmallSize ? d_.small : d_.large;  // by the request, as TorchNeuron documents
    Block* block = take_quick(size, stream, pool.small);
    if (block == nullptr) block = take_free(pool, size, stream);
    if (block == nullptr && flush_quick()) block = take_free(pool, size, stream);
    if (block == nullptr) {
      const size_t want = segment_size(pool, size);
      collect_garbage(want);
      block = new_segment(pool, want, stream);
      if (block == nullptr && release_cached()) {
        d_.stats.num_alloc_retries += 1;
        block = new_segment(pool, want, stream);
      }
      if (block == nullptr) {
        if (!kernel) fail(nbytes, size, want, oom);  // a host kernel's temporary takes plain host memory instead
        return nullptr;
      }
    }
    // A 256-byte class takes half of a 512-byte slot, so that the rest stays on 512-byte boundaries.
    if (size < kAlignment && block->size > kAlignment && aligned(block->ptr)) split(block, kAlignment);
    if (block->size > size && should_split(block, size)) split(block, size);
    block->allocated = true;
    block->kernel = kernel;
    block->requested = nbytes;
    block->context = std::move(context);
    g_allocated.emplace(block->ptr, block);
    if (!kernel) allocated(block);
    return block;
  }

  // A live block's memory is given up: cached again now, or once its other
  // streams are done with it.
  void free(Block* block) {
    g_allocated.erase(block->ptr);
    block->allocated = false;
    if (block->kernel) {  // a host kernel's temporary: it was never device memory
      block->kernel = false;
      keep_quick(block);
      return;
    }
    count_allocation(block, -1);
    record(TraceEntry::FREE_REQUESTED, block);
    report_to_profiler(block, -static_cast<int64_t>(block->size), d_.stats);
    if (block->foreign) {  // an adopted host buffer: its own segment, returned at once
      complete_free(block);
      return;
    }
    if (!block->stream_uses.empty()) {
      block->pending = true;
      d_.pending.push_back(block);
      return;
    }
    complete_free(block);
  }

  // A kernel block becomes a device tensor's storage (allocated by the op whose stack `context` holds).
  void adopt(Block* block, std::shared_ptr<c10::GatheredContext> context) {
    block->kernel = false;
    block->context = std::move(context);
    allocated(block);
  }

  // A host buffer no block holds (host code that bypassed the CPU allocator):
  // a segment of its own; null if it does not fit.
  Block* adopt_foreign(c10::DataPtr& host, size_t nbytes, std::shared_ptr<c10::GatheredContext> context, Oom* oom) {
    process_pending();
    if (!fits(nbytes) && release_cached()) d_.stats.num_alloc_retries += 1;
    if (!fits(nbytes)) {
      fail(nbytes, nbytes, nbytes, oom);
      return nullptr;
    }
    auto* block = new Block{index_, &d_.large, static_cast<char*>(host.get()), nbytes};
    block->stream = 0;
    block->foreign = std::move(host);
    add_segment(block);
    block->allocated = true;
    block->requested = nbytes;
    block->context = std::move(context);
    g_allocated.emplace(block->ptr, block);
    allocated(block);
    return block;
  }

  // Returns every cached whole segment to the host; true if any was.
  bool release_cached() {
    process_pending();
    flush_quick();
    bool freed = false;
    for (Pool* pool : {&d_.small, &d_.large}) {
      for (auto it = pool->free.begin(); it != pool->free.end();) {
        Block* block = *it;
        if (block->prev == nullptr && block->next == nullptr) {
          it = pool->free.erase(it);
          release_segment(block);
          freed = true;
        } else {
          ++it;
        }
      }
    }
    return freed;
  }

  void record_stream(Block* block, c10::StreamId stream) {
    if (stream != block->stream) block->stream_uses.insert(stream);
  }

  // Work on the emulated device has finished when its call returns, so a
  // block recorded on other streams is safe to reuse at the next allocation.
  void process_pending() {
    if (d_.pending.empty()) return;
    std::vector<Block*> done;
    done.swap(d_.pending);
    for (Block* block : done) {
      block->pending = false;
      block->stream_uses.clear();
      complete_free(block);
    }
  }

 private:
  void allocated(Block* block) {
    count_allocation(block, +1);
    count_active(block, +1);
    record(TraceEntry::ALLOC, block);
    report_to_profiler(block, static_cast<int64_t>(block->size), d_.stats);
  }

  void complete_free(Block* block) {
    count_active(block, -1);
    record(TraceEntry::FREE_COMPLETED, block);
    if (block->foreign) {
      release_segment(block);
    } else {
      keep_quick(block);
    }
  }

  void keep_quick(Block* block) {
    block->context.reset();
    block->requested = 0;
    block->quick = true;
    d_.quick[QuickKey{block->stream, block->size, block->pool->small}].push_back(block);
    count_inactive_split(block, +1);
  }

  Block* take_quick(size_t size, c10::StreamId stream, bool small) {
    auto it = d_.quick.find(QuickKey{stream, size, small});
    if (it == d_.quick.end() || it->second.empty()) return nullptr;
    Block* block = it->second.back();
    it->second.pop_back();
    block->quick = false;
    count_inactive_split(block, -1);
    return block;
  }

  // Every quick block back into its pool, merged with its free neighbours; true if there were any.
  bool flush_quick() {
    bool any = false;
    for (auto& [key, blocks] : d_.quick) {
      for (Block* block : blocks) {
        block->quick = false;
        count_inactive_split(block, -1);
        cache(block);
        any = true;
      }
      blocks.clear();
    }
    return any;
  }

  bool fits(size_t bytes) const {
    const int64_t reserved = d_.stats.reserved_bytes[0].current;
    return bytes <= static_cast<size_t>(INT64_MAX) && static_cast<int64_t>(bytes) <= d_.capacity - reserved;
  }

  void fail(size_t nbytes, size_t size, size_t segment, Oom* oom) {
    auto& s = d_.stats;
    s.num_ooms += 1;
    *oom = {nbytes, size, segment, d_.capacity, s.allocated_bytes[0].current, s.reserved_bytes[0].current};
    d_.history.record_oom(index_, static_cast<size_t>(std::max<int64_t>(d_.capacity - oom->reserved, 0)), nbytes);
    if (c10::memoryProfilingEnabled()) {
      c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(nbytes), oom->allocated, oom->reserved, neuron(index_));
    }
  }

  Block* take_free(Pool& pool, size_t size, c10::StreamId stream) {
    Block key{index_, &pool, nullptr, size};
    key.stream = stream;
    auto it = pool.free.lower_bound(&key);
    if (it == pool.free.end() || (*it)->stream != stream) return nullptr;
    Block* block = *it;
    const AllocSettings& conf = settings_now();
    // An unsplittable (oversize) cached block serves only requests within
    // max_non_split_rounding_mb of its size (c10's rule).
    if (size < conf.max_split_size && block->size >= conf.max_split_size) return nullptr;
    if (size >= conf.max_split_size && block->size >= size + conf.max_non_split_rounding) return nullptr;
    pool.free.erase(it);
    count_inactive_split(block, -1);
    return block;
  }

  Block* new_segment(Pool& pool, size_t bytes, c10::StreamId stream) {
    if (!fits(bytes)) return nullptr;
    void* host = nullptr;
    if (posix_memalign(&host, kAlignment, bytes) != 0 || host == nullptr) {
      return nullptr;  // the host itself is out of memory: reported as the device's OOM
    }
    auto* block = new Block{index_, &pool, static_cast<char*>(host), bytes};
    block->stream = stream;
    add_segment(block);
    if (oversize(block)) d_.stats.oversize_segments.increase(1);
    return block;
  }

  void add_segment(Block* block) {
    for_stat_types(block->pool, [&](size_t t) {
      d_.stats.segment[t].increase(1);
      d_.stats.reserved_bytes[t].increase(block->size);
    });
    d_.stats.num_device_alloc += 1;
    record(TraceEntry::SEGMENT_ALLOC, block);
  }

  void release_segment(Block* block) {
    for_stat_types(block->pool, [&](size_t t) {
      d_.stats.segment[t].decrease(1);
      d_.stats.reserved_bytes[t].decrease(block->size);
    });
    if (oversize(block)) d_.stats.oversize_segments.decrease(1);
    d_.stats.num_device_free += 1;
    record(TraceEntry::SEGMENT_FREE, block);
    if (block->foreign) {
      block->foreign.clear();  // the host buffer goes back the way it was made
    } else {
      std::free(block->ptr);  // from posix_memalign
    }
    delete block;
  }

  void split(Block* block, size_t size) {
    auto* rest = new Block{index_, block->pool, block->ptr + size, block->size - size};
    rest->stream = block->stream;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next != nullptr) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    block->pool->free.insert(rest);
    count_inactive_split(rest, +1);
  }

  static bool mergeable(const Block* other) {
    return other != nullptr && !other->allocated && !other->pending && !other->quick;
  }

  // Back into the pool, merged with its free neighbours, as far as the
  // merged block starts on a 512-byte boundary (only a 256-byte block may not).
  void cache(Block* block) {
    while (mergeable(block->prev) && aligned(block->prev->ptr)) {
      Block* other = block->prev;
      block->pool->free.erase(other);
      count_inactive_split(other, -1);
      block->ptr = other->ptr;
      block->prev = other->prev;
      if (block->prev != nullptr) block->prev->next = block;
      block->size += other->size;
      delete other;
    }
    while (mergeable(block->next) && aligned(block->ptr)) {
      Block* other = block->next;
      block->pool->free.erase(other);
      count_inactive_split(other, -1);
      block->next = other->next;
      if (block->next != nullptr) block->next->prev = block;
      block->size += other->size;
      delete other;
    }
    block->context.reset();
    block->requested = 0;
    block->pool->free.insert(block);
    count_inactive_split(block, +1);
  }

  void count_inactive_split(const Block* block, int sign) {
    if (block->prev == nullptr && block->next == nullptr) return;  // a whole segment is not split
    for_stat_types(block->pool, [&](size_t t) {
      if (sign > 0) {
        d_.stats.inactive_split[t].increase(1);
        d_.stats.inactive_split_bytes[t].increase(block->size);
      } else {
        d_.stats.inactive_split[t].decrease(1);
        d_.stats.inactive_split_bytes[t].decrease(block->size);
      }
    });
  }

  void count_allocation(const Block* block, int sign) {
    auto& s = d_.stats;
    for_stat_types(block->pool, [&](size_t t) {
      if (sign > 0) {
        s.allocation[t].increase(1);
        s.allocated_bytes[t].increase(block->size);
        s.requested_bytes[t].increase(block->requested);
      } else {
        s.allocation[t].decrease(1);
        s.allocated_bytes[t].decrease(block->size);
        s.requested_bytes[t].decrease(block->requested);
      }
    });
    if (oversize(block)) {
      if (sign > 0) {
        s.oversize_allocations.increase(1);
      } else {
        s.oversize_allocations.decrease(1);
      }
    }
  }

  void count_active(const Block* block, int sign) {
    for_stat_types(block->pool, [&](size_t t) {
      if (sign > 0) {
        d_.stats.active[t].increase(1);
        d_.stats.active_bytes[t].increase(block->size);
      } else {
        d_.stats.active[t].decrease(1);
        d_.stats.active_bytes[t].decrease(block->size);
      }
    });
  }

  // PYTORCH_ALLOC_CONF garbage_collection_threshold: above that share of the
  // capacity, cached segments are returned before a new one is made.
  void collect_garbage(size_t want) {
    const double threshold = settings_now().garbage_collection_threshold;
    if (threshold <= 0.0 || d_.capacity == INT64_MAX) return;
    const double reserved = static_cast<double>(d_.stats.reserved_bytes[0].current + static_cast<int64_t>(want));
    if (reserved > threshold * static_cast<double>(d_.capacity)) release_cached();
  }

  void record(TraceEntry::Action action, const Block* block) {
    if (!d_.history.tracing()) return;
    d_.history.record(action, index_, reinterpret_cast<size_t>(block->ptr), block->size, block->stream,
                      action == TraceEntry::ALLOC ? block->context : nullptr);
  }

  c10::DeviceIndex index_;
  DeviceState& d_;
};

[[noreturn]] void raise_oom(c10::DeviceIndex index, const Oom& oom) {
  const std::string snapshot = write_oom_snapshot();
  const int64_t free_bytes = std::max<int64_t>(oom.capacity - oom.reserved, 0);
  TORCH_CHECK_WITH(
      OutOfMemoryError, false, "neuron:", static_cast<int>(index), " out of memory (", runtime().description,
      "): tried to allocate ", format_bytes(static_cast<int64_t>(oom.nbytes)), " (", oom.nbytes, " bytes",
      oom.size != oom.nbytes ? ", " + std::to_string(oom.size) + " as a size class" : std::string(),
      oom.segment != oom.size ? ", in a new segment of " + format_bytes(static_cast<int64_t>(oom.segment))
                              : std::string(),
      "). The core has ", format_bytes(oom.capacity), " of HBM: ", format_bytes(oom.allocated),
      " allocated to tensors, ", format_bytes(oom.reserved - oom.allocated),
      " reserved by the allocator but unallocated (cached or fragmented), ", format_bytes(free_bytes),
      " free. A Trainium NeuronCore would fail here too. To fit: use a smaller batch or sequence length; shard "
      "the model over more cores (more tensor parallel or FSDP); use activation checkpointing or bf16; call "
      "torch.neuron.empty_cache() when much is reserved but unallocated; rehearse with a smaller core through "
      "TORCH_NEURONX_HBM_PER_CORE.",
      snapshot.empty() ? std::string() : " A memory snapshot was written to " + snapshot + ".");
}

// ---------------------------------------------------------------- DataPtrs

Block* find_block(const void* ptr) {
  auto it = g_allocated.find(ptr);
  return it == g_allocated.end() ? nullptr : it->second;
}

// The deleter of every device and kernel DataPtr (its context is the pointer
// itself, as Allocator::raw_allocate requires).
void delete_block(void* ptr) {
  std::lock_guard<SpinLock> lock(g_mutex);
  Block* block = find_block(ptr);
  TORCH_INTERNAL_ASSERT(block != nullptr, "torch_neuronx: freeing memory the allocator does not hold: ", ptr);
  Core(block->device).free(block);
}

std::shared_ptr<c10::GatheredContext> gather_context(c10::DeviceIndex index) {
  return g_devices[index].history.gather();  // outside the lock: it may walk the Python stack
}

c10::DataPtr block_ptr(Block* block, c10::Device device) { return {block->ptr, block->ptr, &delete_block, device}; }

// ---------------------------------------------------------------- allocators

struct NeuronAllocator final : c10::DeviceAllocator {
  c10::DataPtr allocate(size_t nbytes) override { return allocate_on(current_device(), nbytes); }
  c10::DeleterFnPtr raw_deleter() const override { return &delete_block; }
  void copy_data(void* dst, const void* src, size_t n) const override { std::memcpy(dst, src, n); }
  bool initialized() override { return is_initialized(); }
  void emptyCache(c10::MempoolId_t) override { empty_cache(); }
  void recordStream(const c10::DataPtr& data, c10::Stream stream) override {
    if (data.get() == nullptr || data.get_deleter() != &delete_block) return;
    std::lock_guard<SpinLock> lock(g_mutex);
    if (Block* block = find_block(data.get())) Core(block->device).record_stream(block, stream.id());
  }
  DeviceStats getDeviceStats(c10::DeviceIndex index) override {
    check_index(index);
    std::lock_guard<SpinLock> lock(g_mutex);
    auto stats = g_devices[index].stats;
    const size_t max_split = settings_now().max_split_size;
    stats.max_split_size = max_split == SIZE_MAX ? -1 : static_cast<int64_t>(max_split);
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex index) override {
    check_index(index);
    std::lock_guard<SpinLock> lock(g_mutex);
    auto& s = g_devices[index].stats;
    for (const auto t : c10::irange(static_cast<size_t>(StatType::NUM_TYPES))) {
      for (auto* stat : {&s.allocation[t], &s.segment[t], &s.active[t], &s.inactive_split[t], &s.allocated_bytes[t],
                         &s.reserved_bytes[t], &s.active_bytes[t], &s.inactive_split_bytes[t], &s.requested_bytes[t]}) {
        stat->reset_accumulated();
      }
    }
    s.oversize_allocations.reset_accumulated();
    s.oversize_segments.reset_accumulated();
    s.num_alloc_retries = s.num_ooms = s.num_sync_all_streams = s.num_device_alloc = s.num_device_free = 0;
  }
  void resetPeakStats(c10::DeviceIndex index) override {
    check_index(index);
    std::lock_guard<SpinLock> lock(g_mutex);
    auto& s = g_devices[index].stats;
    for (const auto t : c10::irange(static_cast<size_t>(StatType::NUM_TYPES))) {
      for (auto* stat : {&s.allocation[t], &s.segment[t], &s.active[t], &s.inactive_split[t], &s.allocated_bytes[t],
                         &s.reserved_bytes[t], &s.active_bytes[t], &s.inactive_split_bytes[t], &s.requested_bytes[t]}) {
        stat->reset_peak();
      }
    }
    s.oversize_allocations.reset_peak();
    s.oversize_segments.reset_peak();
  }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex index) override {
    check_index(index);
    std::lock_guard<SpinLock> lock(g_mutex);
    const auto& d = g_devices[index];
    const int64_t used = d.stats.reserved_bytes[0].current;
    // A capacity lowered below what is reserved leaves nothing free (not a negative amount).
    return {static_cast<size_t>(std::max<int64_t>(d.capacity - used, 0)), static_cast<size_t>(d.capacity)};
  }
};
NeuronAllocator* g_allocator = new NeuronAllocator();  // leaked: tensors freed at exit still reach it

// The CPU allocator while a host kernel runs for a core: the kernel's
// allocations come from that core's pools (cached, no page faults); at any
// other time, and for what does not fit, the allocator it replaced.
struct KernelAllocator final : c10::Allocator {
  c10::Allocator* base = nullptr;

  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex index = t_kernel_device;
    // Before the settings are read, or in a forked child (whose copy of the pools is not its own), a
    // kernel takes plain host memory; its result is refused there when it would become device memory.
    if (index < 0 || nbytes == 0 || parsed_alloc_settings() == nullptr || in_bad_fork()) {
      return base->allocate(nbytes);
    }
    const auto stream = current_stream_id(index);
    Oom oom;
    Block* block = nullptr;
    {
      std::lock_guard<SpinLock> lock(g_mutex);
      block = Core(index).malloc(nbytes, stream, /*kernel=*/true, nullptr, &oom);
    }
    if (block == nullptr) return base->allocate(nbytes);
    return block_ptr(block, c10::Device(c10::DeviceType::CPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete; }
  void copy_data(void* dst, const void* src, size_t n) const override { std::memcpy(dst, src, n); }

  // raw_allocate() hands out DataPtrs of either kind: free each its own way.
  static void raw_delete(void* ptr) {
    {
      std::lock_guard<SpinLock> lock(g_mutex);
      if (Block* block = find_block(ptr)) {
        Core(block->device).free(block);
        return;
      }
    }
    g_kernel_allocator->base->raw_deleter()(ptr);
  }

  static KernelAllocator* g_kernel_allocator;
};
KernelAllocator* KernelAllocator::g_kernel_allocator = nullptr;

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

REGISTER_ALLOCATOR(kNeuron, g_allocator);

c10::DeviceAllocator* device_allocator() { return g_allocator; }

c10::DataPtr allocate_on(c10::DeviceIndex index, size_t nbytes) {
  check_index(index);  // raises in a forked child, and for a core this process does not attach to
  alloc_settings();    // raises while PYTORCH_ALLOC_CONF is bad
  if (nbytes == 0) return {nullptr, nullptr, nullptr, neuron(index)};
  TORCH_CHECK_WITH(OutOfMemoryError, nbytes <= static_cast<size_t>(INT64_MAX), "neuron:", static_cast<int>(index),
                   " out of memory: tried to allocate ", nbytes, " bytes");
  const auto stream = current_stream_id(index);
  auto context = gather_context(index);
  Oom oom;
  Block* block = nullptr;
  {
    std::lock_guard<SpinLock> lock(g_mutex);
    block = Core(index).malloc(nbytes, stream, /*kernel=*/false, std::move(context), &oom);
  }
  if (block == nullptr) raise_oom(index, oom);
  return block_ptr(block, neuron(index));
}

c10::DataPtr adopt(c10::DataPtr&& host, size_t nbytes, c10::DeviceIndex index) {
  runtime();  // raises in a forked child: an op's result is device memory as much as torch.empty's
  if (host.get() == nullptr) return {nullptr, nullptr, nullptr, neuron(index)};
  auto context = gather_context(index);  // the op's stack, while history is recorded (else null, at once)
  Oom oom;
  Block* block = nullptr;
  {
    std::lock_guard<SpinLock> lock(g_mutex);
    if (host.get_deleter() == &delete_block) {
      block = find_block(host.get());
      TORCH_INTERNAL_ASSERT(block != nullptr);
      if (block->device == index) {
        if (block->kernel) Core(index).adopt(block, std::move(context));
        host.release_context();
        return block_ptr(block, neuron(index));
      }
    }
  }
  if (block != nullptr) {  // another core's memory: copied, as a transfer between cores would be
    c10::DataPtr copy = allocate_on(index, nbytes);
    std::memcpy(copy.get(), host.get(), nbytes);
    return copy;
  }
  {
    // A buffer from elsewhere (host code that did not use the CPU allocator).
    // On failure it stays with the caller, who frees it.
    std::lock_guard<SpinLock> lock(g_mutex);
    block = Core(index).adopt_foreign(host, nbytes, std::move(context), &oom);
  }
  if (block == nullptr) raise_oom(index, oom);
  return block_ptr(block, neuron(index));
}

int64_t memory_stat(c10::DeviceIndex index, MemoryStat which) {
  std::lock_guard<SpinLock> lock(g_mutex);
  const auto& s = g_devices[index].stats;
  switch (which) {
    case MemoryStat::kAllocated:
      return s.allocated_bytes[0].current;
    case MemoryStat::kAllocatedPeak:
      return s.allocated_bytes[0].peak;
    case MemoryStat::kReserved:
      return s.reserved_bytes[0].current;
    case MemoryStat::kReservedPeak:
      return s.reserved_bytes[0].peak;
  }
  TORCH_CHECK_VALUE(false, "unknown memory statistic ", static_cast<int>(which));
}

void empty_cache() {
  const auto n = is_initialized() ? runtime().device_count : 0;
  std::lock_guard<SpinLock> lock(g_mutex);
  for (c10::DeviceIndex i = 0; i < n; ++i) Core(i).release_cached();
}

KernelAllocationScope::KernelAllocationScope(c10::DeviceIndex index) : previous_(t_kernel_device) {
  t_kernel_device = index;
}
KernelAllocationScope::~KernelAllocationScope() { t_kernel_device = previous_; }

void install_kernel_allocator() {
  static const bool installed = [] {
    auto* allocator = new KernelAllocator();  // leaked, as every registered allocator
    allocator->base = c10::GetCPUAllocator();
    KernelAllocator::g_kernel_allocator = allocator;
    c10::SetCPUAllocator(allocator, /*priority=*/1);
    return c10::GetCPUAllocator() == allocator;
  }();
  (void)installed;
}

c10::Allocator* pinned_allocator() { return &g_pinned_allocator; }

bool is_pinned(const void* ptr) {
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  return g_pinned.count(ptr) != 0;
}

c10::DeviceIndex device_of_ptr(const void* ptr) {
  std::lock_guard<SpinLock> lock(g_mutex);
  Block* block = find_block(ptr);
  return block != nullptr && !block->kernel ? block->device : -1;
}

void set_capacity(c10::DeviceIndex index, int64_t bytes) {
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "device index out of range");
  std::lock_guard<SpinLock> lock(g_mutex);
  g_devices[index].capacity = bytes;
}

int64_t capacity(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "device index out of range");
  std::lock_guard<SpinLock> lock(g_mutex);
  return g_devices[index].capacity;
}

// ---------------------------------------------------------------- snapshots (memory_history.cpp formats them)

History& history(c10::DeviceIndex index) { return g_devices[index].history; }

std::vector<SegmentSnapshot> snapshot_segments() {
  std::lock_guard<SpinLock> lock(g_mutex);
  std::vector<SegmentSnapshot> out;
  const auto n = is_initialized() ? runtime().device_count : 0;
  std::set<const Block*> seen;
  const auto add_segment_of = [&](const Block* block) {
    while (block->prev != nullptr) block = block->prev;
    if (!seen.insert(block).second) return;
    SegmentSnapshot seg{block->device, reinterpret_cast<size_t>(block->ptr), 0, block->stream, block->pool->small};
    for (const Block* b = block; b != nullptr; b = b->next) {
      seg.total_size += b->size;
      seg.blocks.push_back({b->size, b->requested, b->allocated, b->allocated || b->pending, b->pending,
                            b->context});
    }
    out.push_back(std::move(seg));
  };
  for (c10::DeviceIndex i = 0; i < n; ++i) {
    for (const Pool* pool : {&g_devices[i].small, &g_devices[i].large}) {
      for (const Block* b : pool->free) add_segment_of(b);
    }
    for (const Block* b : g_devices[i].pending) add_segment_of(b);
    for (const auto& [key, blocks] : g_devices[i].quick) {
      for (const Block* b : blocks) add_segment_of(b);
    }
  }
  for (const auto& [ptr, block] : g_allocated) add_segment_of(block);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::tie(a.device, a.address) < std::tie(b.device, b.address);
  });
  return out;
}

}  // namespace torch_neuronx
