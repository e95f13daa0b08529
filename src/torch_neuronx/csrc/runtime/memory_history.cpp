// Memory history and snapshots in PyTorch's own format, so that PyTorch's
// memory visualiser (torch.cuda._memory_viz, pytorch.org/memory_viz) renders a
// neuron snapshot: {"segments": [...], "device_traces": [[...] per device],
// "allocator_settings": {...}}, blocks in "active_allocated" /
// "active_pending_free" / "inactive" states, frames as {filename, line, name}.
// Stacks are gathered with PyTorch's CapturedTraceback, as CUDA's are.
#include "allocator.h"

#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <cstdlib>
#include <mutex>

namespace py = pybind11;

namespace torch_neuronx {
namespace {

using c10::CachingDeviceAllocator::TraceEntry;

const char* action_name(int action) {
  switch (action) {
    case TraceEntry::ALLOC:
      return "alloc";
    case TraceEntry::FREE_REQUESTED:
      return "free_requested";
    case TraceEntry::FREE_COMPLETED:
      return "free_completed";
    case TraceEntry::SEGMENT_ALLOC:
      return "segment_alloc";
    case TraceEntry::SEGMENT_FREE:
      return "segment_free";
    case TraceEntry::SNAPSHOT:
      return "snapshot";
    default:
      return "oom";
  }
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---------------------------------------------------------------- recording

void History::configure(int when, bool trace, size_t max_entries, bool cpp_stacks, bool clear, uint32_t skip) {
  std::lock_guard<std::mutex> lock(mutex_);
  when_.store(when);
  trace_.store(trace);
  cpp_.store(cpp_stacks);
  skip_ = skip;
  const size_t entries = trace ? std::max<size_t>(max_entries, 1) : 0;
  if (clear || !trace || entries != max_entries_) {
    // A ring of another length starts afresh (its order would be lost), as does a cleared one.
    if (!clear && trace && !ring_.empty()) {
      std::vector<Entry> ordered(ring_.begin() + static_cast<std::ptrdiff_t>(next_), ring_.end());
      ordered.insert(ordered.end(), ring_.begin(), ring_.begin() + static_cast<std::ptrdiff_t>(next_));
      if (ordered.size() > entries) ordered.erase(ordered.begin(), ordered.end() - static_cast<std::ptrdiff_t>(entries));
      ring_ = std::move(ordered);
    } else {
      ring_.clear();
    }
    next_ = 0;
  }
  max_entries_ = entries;
}

std::shared_ptr<c10::GatheredContext> History::gather() const {
  if (C10_LIKELY(when_.load(std::memory_order_relaxed) == 0)) return nullptr;
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true, /*cpp=*/cpp_.load());
}

void History::record(int action, c10::DeviceIndex, size_t addr, size_t size, c10::StreamId stream,
                     std::shared_ptr<c10::GatheredContext> context) {
  if (!trace_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (max_entries_ == 0 || (skip_ & (1u << action)) != 0) return;
  Entry entry{action_name(action), addr, size, stream, now_us(), std::move(context)};
  if (ring_.size() < max_entries_) {
    ring_.push_back(std::move(entry));
  } else {
    ring_[next_] = std::move(entry);
    next_ = (next_ + 1) % max_entries_;
  }
}

void History::record_oom(c10::DeviceIndex device, size_t free_bytes, size_t size) {
  record(TraceEntry::OOM, device, free_bytes, size, 0, nullptr);
}

std::vector<History::Entry> History::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Entry> out(ring_.begin() + static_cast<std::ptrdiff_t>(next_), ring_.end());
  out.insert(out.end(), ring_.begin(), ring_.begin() + static_cast<std::ptrdiff_t>(next_));
  return out;
}

// ---------------------------------------------------------------- Python side

namespace {

// Symbolises every stack at once (the expensive part), then hands out frame lists.
// Every context the history stores is a CapturedTraceback it gathered itself
// (torch's checked accessor compares typeids, which differ across libraries).
torch::CapturedTraceback* traceback_of(const std::shared_ptr<c10::GatheredContext>& context) {
  return static_cast<torch::CapturedTraceback*>(context.get());
}

class Frames {
 public:
  void want(const std::shared_ptr<c10::GatheredContext>& context) {
    if (auto* tb = traceback_of(context)) pending_.push_back(tb);
  }
  void symbolize() {
    const torch::SymbolizedTracebacks symbolized = torch::symbolize(pending_);
    std::vector<py::dict> all;
    all.reserve(symbolized.all_frames.size());
    for (const auto& f : symbolized.all_frames) {
      py::dict frame;
      frame["filename"] = f.filename;
      frame["line"] = f.lineno;
      frame["name"] = f.funcname;
      all.push_back(std::move(frame));
    }
    for (size_t i = 0; i < pending_.size(); ++i) {
      py::list frames;
      for (const uint64_t k : symbolized.tracebacks[i]) frames.append(all[k]);
      frames_[pending_[i]] = frames;
    }
  }
  py::object of(const std::shared_ptr<c10::GatheredContext>& context) const {
    auto* tb = traceback_of(context);
    auto it = tb != nullptr ? frames_.find(tb) : frames_.end();
    return it != frames_.end() ? it->second : py::list();
  }

 private:
  std::vector<torch::CapturedTraceback*> pending_;
  std::unordered_map<torch::CapturedTraceback*, py::object> frames_;
};

py::dict allocator_settings() {
  const AllocSettings& conf = alloc_settings();
  py::dict settings;
  settings["PYTORCH_ALLOC_CONF"] = conf.text;
  settings["max_split_size"] = conf.max_split_size;
  settings["max_non_split_rounding_size"] = conf.max_non_split_rounding;
  settings["garbage_collection_threshold"] = conf.garbage_collection_threshold;
  settings["expandable_segments"] = false;
  py::dict divisions;
  for (size_t i = 0; i < conf.divisions.size(); ++i) {
    divisions[py::str(std::to_string((size_t{1} << 20) << i))] = conf.divisions[i];
  }
  settings["roundup_power2_divisions"] = divisions;
  return settings;
}

}  // namespace

py::dict memory_snapshot(bool include_traces) {
  const auto segments = snapshot_segments();
  const auto n = is_initialized() ? runtime().device_count : 0;
  std::vector<std::vector<History::Entry>> traces(n);
  for (c10::DeviceIndex i = 0; i < n; ++i) {
    // As CUDA's: a "snapshot" event (with the bytes active) lets a trace be lined up with the snapshot.
    size_t active = 0;
    for (const auto& seg : segments) {
      if (seg.device != i) continue;
      for (const auto& b : seg.blocks) active += b.active ? b.size : 0;
    }
    history(i).record(TraceEntry::SNAPSHOT, i, 0, active, 0, nullptr);
    if (include_traces) traces[i] = history(i).entries();
  }

  Frames frames;
  for (const auto& seg : segments) {
    for (const auto& b : seg.blocks) frames.want(b.context);
  }
  for (const auto& trace : traces) {
    for (const auto& e : trace) frames.want(e.context);
  }
  frames.symbolize();

  py::list segment_list;
  for (const auto& seg : segments) {
    py::dict s;
    s["device"] = static_cast<int>(seg.device);
    s["address"] = seg.address;
    s["total_size"] = seg.total_size;
    s["stream"] = static_cast<int64_t>(seg.stream);
    s["segment_type"] = seg.small ? "small" : "large";
    s["segment_pool_id"] = py::make_tuple(0, 0);
    s["is_expandable"] = false;
    s["frames"] = py::list();
    size_t allocated = 0, active = 0, requested = 0;
    py::list blocks;
    size_t address = seg.address;
    for (const auto& b : seg.blocks) {
      py::dict block;
      block["address"] = address;
      block["size"] = b.size;
      block["requested_size"] = b.allocated ? b.requested : b.size;
      block["state"] = b.allocated ? "active_allocated" : (b.active ? "active_pending_free" : "inactive");
      block["frames"] = frames.of(b.context);
      blocks.append(block);
      address += b.size;
      allocated += b.allocated ? b.size : 0;
      active += b.active ? b.size : 0;
      requested += b.allocated ? b.requested : 0;
    }
    s["allocated_size"] = allocated;
    s["active_size"] = active;
    s["requested_size"] = requested;
    s["blocks"] = blocks;
    segment_list.append(s);
  }

  py::list device_traces;
  for (const auto& trace : traces) {
    py::list entries;
    for (const auto& e : trace) {
      py::dict d;
      d["action"] = e.action;
      if (std::string(e.action) == "oom") {
        d["device_free"] = e.addr;
      } else {
        d["addr"] = e.addr;
      }
      d["size"] = e.size;
      d["stream"] = static_cast<int64_t>(e.stream);
      d["time_us"] = e.time_us;
      if (e.context) d["frames"] = frames.of(e.context);
      entries.append(d);
    }
    device_traces.append(entries);
  }

  py::dict result;
  result["segments"] = segment_list;
  result["device_traces"] = device_traces;
  result["allocator_settings"] = allocator_settings();
  result["external_annotations"] = py::list();
  return result;
}

void record_memory_history(std::optional<std::string> enabled, std::optional<std::string> context,
                           const std::string& stacks, size_t max_entries, bool clear_history,
                           const std::vector<std::string>& skip_actions) {
  TORCH_CHECK_VALUE(!enabled || *enabled == "state" || *enabled == "all",
                    "_record_memory_history: enabled must be None, 'state' or 'all', got '", *enabled, "'");
  TORCH_CHECK_VALUE(!context || *context == "state" || *context == "alloc" || *context == "all",
                    "_record_memory_history: context must be None, 'state', 'alloc' or 'all', got '", *context, "'");
  TORCH_CHECK_VALUE(stacks == "python" || stacks == "all",
                    "_record_memory_history: stacks must be 'python' or 'all', got '", stacks, "'");
  int when = 0;
  if (enabled && context) when = *context == "state" ? 1 : (*context == "alloc" ? 2 : 3);
  const bool trace = enabled && *enabled == "all";
  uint32_t skip = 0;
  for (const auto& name : skip_actions) {
    int action = -1;
    for (int a = TraceEntry::ALLOC; a <= TraceEntry::OOM; ++a) {
      if (a != TraceEntry::SEGMENT_MAP && a != TraceEntry::SEGMENT_UNMAP && name == action_name(a)) action = a;
    }
    TORCH_CHECK_VALUE(action >= 0, "_record_memory_history: skip_actions takes 'alloc', 'free_requested', "
                      "'free_completed', 'segment_alloc', 'segment_free', 'oom' and 'snapshot', got '", name, "'");
    skip |= 1u << action;
  }
  const auto n = runtime().device_count;
  for (c10::DeviceIndex i = 0; i < n; ++i) {
    history(i).configure(when, trace, max_entries, stacks == "all", clear_history, skip);
  }
}

std::string python_stack_text() {
  auto context = torch::CapturedTraceback::gather(/*python=*/true, /*script=*/false, /*cpp=*/false);
  std::vector<torch::CapturedTraceback*> one{context.get()};
  const torch::SymbolizedTracebacks symbolized = torch::symbolize(one);
  std::string text;
  for (const uint64_t k : symbolized.tracebacks.at(0)) {
    const auto& f = symbolized.all_frames.at(k);
    text += "  File \"" + f.filename + "\", line " + std::to_string(f.lineno) + ", in " + f.funcname + "\n";
  }
  return text;
}

std::string write_oom_snapshot() {
  const char* path = std::getenv("TORCH_NEURONX_OOM_SNAPSHOT");
  if (path == nullptr || *path == '\0' || !Py_IsInitialized()) return "";
  try {
    py::gil_scoped_acquire gil;
    py::module_::import("torch_neuronx.device.memory").attr("_dump_snapshot")(path);
    return path;
  } catch (const std::exception& e) {
    TORCH_WARN("torch_neuronx: could not write the out-of-memory snapshot to ", path, ": ", e.what());
    return "";
  }
}

}  // namespace torch_neuronx
