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
std::unordered_map<std::string, std::unique_ptr<OpEntry>> g_named;  // ops the device's own kernels run
std::atomic<bool> g_fallback_allowed{true};
std::atomic<bool> g_fallback_stacks{false};
std::vector<std::pair<std::string, std::string>> g_stacks;  // under g_ops_mutex

// The ops TorchNeuron registers to run on the CPU (its CPU-fallback table:
// decompositions it has no NeuronCore kernel for), whatever their dtypes.
constexpr const char* kHostOnly[] = {
    "aten::linalg_qr", "aten::_linalg_svd", "aten::_linalg_eigh", "aten::linalg_cholesky_ex",
    "aten::linalg_inv_ex", "aten::linalg_lu_factor_ex", "aten::linalg_ldl_factor_ex", "aten::_linalg_slogdet",
    "aten::_linalg_det", "aten::cholesky_inverse", "aten::triangular_solve",
};

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
  for (const char* name : kHostOnly) {
    if (schema.name() == name) e->host_only = true;
  }
  return e;
}

const char* reason_text(HostReason why) {
  switch (why) {
    case HostReason::kTable:
      return "TorchNeuron runs it on the CPU (it has no NeuronCore kernel for it)";
    case HostReason::kFloat64:
      return "Trainium has no float64 units, so float64 work runs on the host; use float32 or bfloat16 to keep it on "
             "the device";
    case HostReason::kComplex:
      return "NeuronCores do not support complex dtypes (Neuron compiler error NCC_EVRF004); keep complex work on "
             "the CPU or split it into real and imaginary parts";
    case HostReason::kWidened:
      return "the host has no kernel for its reduced-precision dtype, so it runs in float32 and is cast back";
    default:
      return "the device cannot run it as it is";
  }
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
  std::unordered_map<std::string, OpCount> merged;  // an op counted both ways appears once
  const auto add = [&](const OpEntry& e) {
    const int64_t ex = e.executed.load(), fb = e.fallback.load(), wide = e.widened.load();
    if (!ex && !fb) return;
    auto& c = merged.try_emplace(e.name, OpCount{e.name, 0, 0, 0}).first->second;
    c.executed += ex;
    c.fallback += fb;
    c.widened += wide;
  };
  for (const auto& [key, e] : g_ops) add(*e);
  for (const auto& [key, e] : g_named) add(*e);
  std::vector<OpCount> out;
  for (auto& [name, c] : merged) out.push_back(std::move(c));
  return out;
}

void reset_op_counts() {
  std::lock_guard<std::mutex> lock(g_ops_mutex);
  for (auto* table : {&g_ops}) {
    for (auto& [key, e] : *table) {
      e->executed.store(0);
      e->fallback.store(0);
      e->widened.store(0);
    }
  }
  for (auto& [key, e] : g_named) {
    e->executed.store(0);
    e->fallback.store(0);
    e->widened.store(0);
  }
}

OpEntry& entry_named(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_ops_mutex);
  auto& slot = g_named[name];
  if (!slot) {
    slot = std::make_unique<OpEntry>();
    slot->name = name;
  }
  return *slot;
}

void note_fallback(OpEntry& e, HostReason why) {
  if (why == HostReason::kWidened) {
    e.widened.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  TORCH_CHECK(fallback_allowed(), "torch_neuronx: ", e.name, " would fall back to the CPU: ", reason_text(why),
              ". TORCH_NEURONX_FORBID_CPU_FALLBACK forbids CPU fallbacks.");
  e.fallback.fetch_add(1, std::memory_order_relaxed);
  if (!e.warned.exchange(true)) {
    std::string stack;
    if (g_fallback_stacks.load()) {
      stack = python_stack_text();
      std::lock_guard<std::mutex> lock(g_ops_mutex);
      g_stacks.emplace_back(e.name, stack);
    }
    TORCH_WARN("torch_neuronx: ", e.name, " falls back to the CPU: ", reason_text(why),
               ". torch_neuronx.get_fallback_ops() lists the ops that did.",
               stack.empty() ? std::string() : "\nFirst called from (innermost first):\n" + stack);
  }
}

void set_fallback_stacks(bool record) { g_fallback_stacks.store(record); }

std::vector<std::pair<std::string, std::string>> fallback_stacks() {
  std::lock_guard<std::mutex> lock(g_ops_mutex);
  return g_stacks;
}

bool fallback_allowed() { return g_fallback_allowed.load(std::memory_order_relaxed); }
void set_fallback_allowed(bool allowed) { g_fallback_allowed.store(allowed); }

}  // namespace torch_neuronx
