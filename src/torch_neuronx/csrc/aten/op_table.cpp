// What the fallback knows of each operator (computed once per op from its
// schema), the per-op counts the op tracker reads, and whether CPU fallbacks
// are allowed at all.
#include "aten.h"

#include <c10/util/flat_hash_map.h>

#include <memory>
#include <mutex>
#include <unordered_map>

namespace torch_neuronx {
namespace {

std::mutex g_ops_mutex;
std::unordered_map<const void*, std::unique_ptr<OpEntry>> g_ops;
std::atomic<bool> g_fallback_allowed{true};

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// CUDA's device rules: an operand may be a CPU tensor beside device tensors
// only where CUDA kernels accept one. 0-dim CPU tensors are read as scalars
// anywhere (never written: see the fallback). These arguments take CPU
// tensors of any size: advanced-indexing index lists, CTC lengths, the CPU
// `scalars` of the foreach ops, and the fused optimizers' step counters,
// learning rate and scaler state.
bool argument_may_be_cpu(const std::string& op, const std::string& arg) {
  if (arg == "indices") {
    return starts_with(op, "aten::index") || starts_with(op, "aten::_index_put_impl_") ||
           starts_with(op, "aten::_unsafe_index");
  }
  if (arg == "input_lengths" || arg == "target_lengths") return starts_with(op, "aten::_ctc_loss");
  if (arg == "scalars") return starts_with(op, "aten::_foreach_");
  if (arg == "state_steps" || arg == "lr" || arg == "grad_scale" || arg == "found_inf") {
    return starts_with(op, "aten::_fused_");
  }
  if (arg == "src") return op == "aten::copy_";
  return false;
}

std::unique_ptr<OpEntry> make_entry(const c10::OperatorHandle& op) {
  auto e = std::make_unique<OpEntry>();
  const auto& schema = op.schema();
  e->name = schema.name();
  if (!schema.overload_name().empty()) e->name += "." + schema.overload_name();
  const auto& args = schema.arguments();
  TORCH_INTERNAL_ASSERT(args.size() < 64, "torch_neuronx: ", e->name, " has ", args.size(), " arguments");
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& arg = args[i];
    if (arg.type()->str().find("Generator") != std::string::npos) e->generator_arg = static_cast<int>(i);
    if (arg.alias_info() != nullptr && arg.alias_info()->isWrite()) e->written |= uint64_t{1} << i;
    if (argument_may_be_cpu(e->name, arg.name())) e->cpu_ok |= uint64_t{1} << i;
  }
  // The c10d ops see CPU and device tensors by design; lift wraps whatever it is given.
  e->any_cpu_ok = starts_with(e->name, "c10d::") || starts_with(e->name, "aten::lift");
  e->mutates = schema.is_mutable();
  return e;
}

}  // namespace

OpEntry& entry_for(const c10::OperatorHandle& op) {
  // Per-thread cache in front of the shared table: no lock on the hot path.
  thread_local ska::flat_hash_map<const void*, OpEntry*> cache;
  const void* key = &op.schema();
  auto hit = cache.find(key);
  if (C10_LIKELY(hit != cache.end())) return *hit->second;
  std::lock_guard<std::mutex> lock(g_ops_mutex);
  auto& slot = g_ops[key];
  if (!slot) slot = make_entry(op);
  cache.emplace(key, slot.get());
  return *slot;
}

std::vector<OpCount> op_counts() {
  std::lock_guard<std::mutex> lock(g_ops_mutex);
  std::vector<OpCount> out;
  for (const auto& [key, e] : g_ops) {
    const int64_t ex = e->executed.load(), fb = e->fallback.load();
    if (ex || fb) out.push_back({e->name, ex, fb});
  }
  return out;
}

void reset_op_counts() {
  std::lock_guard<std::mutex> lock(g_ops_mutex);
  for (auto& [key, e] : g_ops) {
    e->executed.store(0);
    e->fallback.store(0);
  }
}

bool fallback_allowed() { return g_fallback_allowed.load(std::memory_order_relaxed); }
void set_fallback_allowed(bool allowed) { g_fallback_allowed.store(allowed); }

}  // namespace torch_neuronx
