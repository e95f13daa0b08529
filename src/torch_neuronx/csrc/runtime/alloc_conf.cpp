// PYTORCH_ALLOC_CONF, read once for the neuron allocator.
//
// The grammar and the meaning of each honoured key are c10's (the caching
// allocator documentation of PyTorch): "key:value,key:value", with
// roundup_power2_divisions either one number or a list
// "[1:4,2:1,>:8]" whose keys are sizes in MiB (powers of two) naming the
// power-of-two interval [k MiB, 2k MiB) and ">" every interval after the
// last one listed. Sizes below 1 MiB share the first interval, sizes from
// 32 GiB the last (16 intervals, as c10).
//
// What differs from c10 is how bad input is met: c10 throws a bare "stoull"
// or an INTERNAL ASSERT from inside whichever allocation first reads the
// setting. Here a bad value raises a ValueError naming the variable, the key
// and the accepted form at every allocation until it is fixed, and a key this
// allocator does not honour warns once and is ignored.
#include "allocator.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <sstream>

namespace torch_neuronx {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kMinSplitMiB = 20;  // c10's floor for max_split_size_mb and max_non_split_rounding_mb

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\n");
  if (first == std::string::npos) return "";
  const auto last = s.find_last_not_of(" \t\n");
  return s.substr(first, last - first + 1);
}

[[noreturn]] void bad(const std::string& item, const std::string& form) {
  TORCH_CHECK_VALUE(false, "PYTORCH_ALLOC_CONF: '", item, "' is not a valid setting: expected ", form,
                    ". Fix or unset PYTORCH_ALLOC_CONF (docs/memory.md lists the keys the neuron allocator honours).");
}

// A whole decimal number (no sign, no suffix), or nothing. One too large for
// size_t saturates at its maximum, which the callers clamp as c10's
// AcceleratorAllocatorConfig does (parseMaxSplitSize: min(value, max / 1 MiB)).
std::optional<size_t> parse_size(const std::string& text) {
  if (text.empty()) return std::nullopt;
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  size_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto digit = static_cast<size_t>(c - '0');
    value = value > (kMax - digit) / 10 ? kMax : value * 10 + digit;
  }
  return value;
}

bool power_of_two(size_t n) { return n != 0 && (n & (n - 1)) == 0; }
size_t log2_floor(size_t n) { return 63 - static_cast<size_t>(__builtin_clzll(n)); }

// The top-level items: commas split them, except inside [ ].
std::vector<std::string> items_of(const std::string& conf) {
  std::vector<std::string> items;
  std::string current;
  int depth = 0;
  for (const char c : conf) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      items.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  items.push_back(current);
  return items;
}

void parse_divisions(const std::string& item, const std::string& value, AllocSettings& s) {
  const char* form = "roundup_power2_divisions:N or roundup_power2_divisions:[1:4,2:8,>:2], N and each count a power "
                     "of two (0 or 1: no power-of-two rounding), each list key a size in MiB that is a power of two";
  if (value.empty() || value.front() != '[') {
    const auto n = parse_size(value);
    if (!n || (*n != 0 && !power_of_two(*n))) bad(item, form);
    s.divisions.fill(*n);
    return;
  }
  if (value.back() != ']') bad(item, form);
  const std::string body = value.substr(1, value.size() - 2);
  bool first = true;
  size_t last = 0;
  for (const auto& raw : items_of(body)) {
    const std::string entry = trim(raw);
    const auto colon = entry.find(':');
    if (colon == std::string::npos) bad(item, form);
    const std::string key = trim(entry.substr(0, colon));
    const auto count = parse_size(trim(entry.substr(colon + 1)));
    if (!count || (*count != 0 && !power_of_two(*count))) bad(item, form);
    if (key == ">") {
      for (size_t i = first ? 0 : last + 1; i < s.divisions.size(); ++i) s.divisions[i] = *count;
      continue;
    }
    const auto mib = parse_size(key);
    if (!mib || !power_of_two(*mib)) bad(item, form);
    const size_t index = std::min(log2_floor(*mib), s.divisions.size() - 1);
    if (first) {
      for (size_t i = 0; i < index; ++i) s.divisions[i] = *count;  // the intervals below the first key
      first = false;
    }
    s.divisions[index] = *count;
    last = index;
  }
}

size_t parse_mib(const std::string& item, const std::string& key, const std::string& value) {
  const auto n = parse_size(value);
  const std::string form = key + ":N, N a whole number of MiB, at least " + std::to_string(kMinSplitMiB);
  if (!n || *n < kMinSplitMiB) bad(item, form);
  return std::min(*n, std::numeric_limits<size_t>::max() / kMiB) * kMiB;
}

AllocSettings parse(const char* env) {
  AllocSettings s;
  s.text = env == nullptr ? "" : env;
  if (trim(s.text).empty()) return s;
  for (const auto& raw : items_of(s.text)) {
    const std::string item = trim(raw);
    if (item.empty()) {
      TORCH_CHECK_VALUE(false, "PYTORCH_ALLOC_CONF: '", s.text,
                        "' has an empty setting (two commas in a row, or a comma at an end). Write "
                        "key:value pairs separated by single commas, e.g. max_split_size_mb:512,"
                        "garbage_collection_threshold:0.8.");
    }
    const auto colon = item.find(':');
    if (colon == std::string::npos) bad(item, "key:value");
    const std::string key = trim(item.substr(0, colon));
    const std::string value = trim(item.substr(colon + 1));
    // A setting without a key or without a value (":", "foo:") is malformed whatever the key: docs/memory.md.
    if (key.empty() || value.empty()) bad(item, "key:value, with both a key and a value");
    if (key == "max_split_size_mb") {
      s.max_split_size = parse_mib(item, key, value);
    } else if (key == "max_non_split_rounding_mb") {
      s.max_non_split_rounding = parse_mib(item, key, value);
    } else if (key == "garbage_collection_threshold") {
      char* end = nullptr;
      const double v = value.empty() ? NAN : std::strtod(value.c_str(), &end);
      if (end == nullptr || *end != '\0' || !(v > 0.0 && v < 1.0)) {
        bad(item, "garbage_collection_threshold:F, F a number strictly between 0 and 1, e.g. 0.8");
      }
      s.garbage_collection_threshold = v;
    } else if (key == "roundup_power2_divisions") {
      parse_divisions(item, value, s);
    } else if (key == "expandable_segments") {
      if (value != "True" && value != "False") bad(item, "expandable_segments:True or expandable_segments:False");
      if (value == "True") {
        s.ignored.push_back(item + " (the neuron allocator has no expandable segments: NRT allocates fixed "
                            "segments; ignored)");
      }
    } else if (key == "backend") {
      if (value != "native") s.ignored.push_back(item + " (the neuron allocator has one backend, native; ignored)");
    } else if (key == "release_lock_on_cudamalloc" || key == "pinned_use_cuda_host_register" ||
               key == "pinned_num_register_threads" || key == "pinned_use_background_threads" ||
               key == "pinned_use_host_register" || key == "pinned_max_round_threshold_mb" ||
               key == "pinned_max_cached_size_mb" || key == "large_segment_size_mb" ||
               key == "per_process_memory_fraction" || key == "graph_capture_record_stream_reuse") {
      s.ignored.push_back(item + " (a CUDA or host-memory setting with no meaning for the neuron allocator; ignored)");
    } else {
      s.ignored.push_back(item + " (unknown key; the keys honoured are max_split_size_mb, "
                          "max_non_split_rounding_mb, garbage_collection_threshold and roundup_power2_divisions)");
    }
  }
  return s;
}

std::atomic<const AllocSettings*> g_settings{nullptr};
std::mutex g_settings_mutex;

}  // namespace

const AllocSettings& alloc_settings() {
  if (const AllocSettings* s = g_settings.load(std::memory_order_acquire)) return *s;
  std::lock_guard<std::mutex> lock(g_settings_mutex);
  if (const AllocSettings* s = g_settings.load(std::memory_order_acquire)) return *s;
  auto* parsed = new AllocSettings(parse(std::getenv("PYTORCH_ALLOC_CONF")));  // throws until the variable is fixed
  for (const auto& what : parsed->ignored) TORCH_WARN("PYTORCH_ALLOC_CONF: ", what, ".");
  g_settings.store(parsed, std::memory_order_release);  // leaked: read by every allocation until exit
  return *parsed;
}

const AllocSettings* parsed_alloc_settings() { return g_settings.load(std::memory_order_acquire); }

size_t AllocSettings::divisions_for(size_t nbytes) const {
  const size_t log2_size = log2_floor(nbytes);
  const size_t index = log2_size < 20 ? 0 : std::min<size_t>(log2_size - 20, divisions.size() - 1);
  return divisions[index];
}

}  // namespace torch_neuronx
