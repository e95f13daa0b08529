// Random numbers on the device.
//
// A neuron generator exposes a CUDA-style state of 16 bytes, (seed, offset),
// because DTensor's RNG tracker and activation checkpointing save, shift and
// restore exactly that. The numbers come from a CPU (mt19937) engine, so a
// seed gives the same numbers on neuron as on CPU, the reference path:
//  * after manual_seed(s) the engine is the CPU engine seeded with s, and
//    successive ops draw from it as successive CPU ops would;
//  * each op advances the offset by the values it drew (rounded up to 4, as
//    Philox counts), so (seed, offset) names a point in the sequence;
//  * the state tensor get_state() returns carries the engine as it was at
//    that point, and set_state() of that tensor restores it exactly, however
//    many states were taken since (fork_rng, checkpoint recompute);
//  * set_state() of any other (seed, offset) (a copy, a state loaded from a
//    file, a shifted offset) puts the engine at that position of the stream
//    manual_seed(seed) starts: `offset` draws into it. That is what makes
//    DTensor's per-shard offsets work as with CUDA's Philox: shard k of a
//    random init starts where element k * shard_size of the unsharded draw
//    starts, so ops that draw once per element (uniform_ and the inits built
//    on it; normal_ on shards of multiples of 16 elements) give every shard
//    its slice of the unsharded tensor, and every rank that sets the same
//    state draws the same numbers. The walk is incremental (from the last
//    position set, when it lies behind); a position more than kMaxWalk draws
//    away (a state from a long run, loaded from a file) reseeds the engine
//    from the pair instead, deterministically.
#include "../neuron.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>

#include <cstring>
#include <mutex>

namespace torch_neuronx {
namespace {

constexpr uint64_t kMaxWalk = uint64_t{1} << 30;  // draws: about 2 s of mt19937

uint64_t mix(uint64_t seed, uint64_t offset) {
  if (offset == 0) return seed;  // the CPU engine's own seeding
  uint64_t z = seed ^ (offset * 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The storage context of a state tensor: its 16 bytes, and the engine they
// named when it was taken. Freed with the last tensor that views it.
struct StateSnapshot {
  uint64_t words[2];  // the tensor's data: seed, offset
  uint64_t seed, offset;
  at::Tensor engine_state;
};

void delete_snapshot(void* ctx) { delete static_cast<StateSnapshot*>(ctx); }

// The snapshot a state tensor carries, if it is one get_state() made and its
// bytes still name the point the snapshot was taken at.
const StateSnapshot* snapshot_of(const c10::TensorImpl& state) {
  if (!state.has_storage()) return nullptr;
  const c10::DataPtr& data = state.storage().data_ptr();
  if (data.get_deleter() != &delete_snapshot) return nullptr;
  const auto* snap = static_cast<const StateSnapshot*>(data.get_context());
  if (state.data() != static_cast<const void*>(snap->words)) return nullptr;  // a slice of one
  if (snap->words[0] != snap->seed || snap->words[1] != snap->offset) return nullptr;  // edited in place
  return snap;
}

class NeuronGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit NeuronGeneratorImpl(c10::DeviceIndex index, uint64_t seed = c10::default_rng_seed_val)
      : c10::GeneratorImpl(c10::Device(kNeuron, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        engine_(at::detail::createCPUGenerator(seed)),
        seed_(seed) {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
    position();
  }
  void set_offset(uint64_t offset) override {
    offset_ = offset;
    position();
  }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    const uint64_t s = c10::detail::getNonDeterministicRandom();
    set_current_seed(s);
    return s;
  }

  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto* snap = new StateSnapshot{{seed_, offset_}, seed_, offset_, at::Tensor(engine_.get_state())};
    c10::DataPtr data(snap->words, snap, &delete_snapshot, c10::Device(c10::DeviceType::CPU));
    c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), sizeof(snap->words),
                                                               std::move(data), nullptr, false));
    auto state = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                          caffe2::TypeMeta::Make<uint8_t>());
    state.unsafeGetTensorImpl()->set_sizes_contiguous({static_cast<int64_t>(sizeof(snap->words))});
    return state.getIntrusivePtr();
  }

  void set_state(const c10::TensorImpl& new_state) override {
    TORCH_CHECK_TYPE(new_state.dtype() == caffe2::TypeMeta::Make<uint8_t>() && new_state.numel() == 16 &&
                         new_state.device().is_cpu(),
                     "a neuron RNG state is a CPU torch.uint8 tensor of 16 bytes (seed, offset), as returned by "
                     "torch.neuron.get_rng_state(); got ",
                     new_state.numel(), " elements of ", new_state.dtype().name(), " on ", new_state.device());
    TORCH_CHECK(new_state.is_contiguous(), "a neuron RNG state must be contiguous");
    uint64_t words[2];
    std::memcpy(words, new_state.data(), sizeof(words));
    const uint64_t seed = words[0], offset = words[1];
    if (const auto* snap = snapshot_of(new_state)) {
      seed_ = seed;
      offset_ = offset;
      engine_.set_state(snap->engine_state);
      return;
    }
    // Any other state names (seed, offset) only: the same bytes give the same
    // numbers wherever the generator stands, on every rank.
    seed_ = seed;
    offset_ = offset;
    position();
  }

  // The engine a kernel draws from; a lease holds this generator's mutex.
  at::Generator engine() const { return engine_; }
  void advance(int64_t numel) {
    offset_ += static_cast<uint64_t>((numel + 3) / 4 * 4);
  }

  NeuronGeneratorImpl* clone_impl() const override {
    auto* g = new NeuronGeneratorImpl(device_.index(), seed_);
    g->engine_ = engine_.clone();
    g->offset_ = offset_;
    return g;
  }

 private:
  // The engine at draw `offset_` of the stream seeded with `seed_` (see the
  // file's comment); remembers that point, to walk on from it next time.
  void position() {
    const bool from_mark = mark_.defined() && mark_seed_ == seed_ && offset_ >= mark_offset_ &&
                           offset_ - mark_offset_ <= kMaxWalk;
    if (from_mark) {
      engine_.set_state(mark_);
      walk(offset_ - mark_offset_);
    } else if (offset_ <= kMaxWalk) {
      engine_.set_current_seed(seed_);
      walk(offset_);
    } else {
      engine_.set_current_seed(mix(seed_, offset_));  // too far to walk
      return;
    }
    mark_ = engine_.get_state();
    mark_seed_ = seed_;
    mark_offset_ = offset_;
  }

  void walk(uint64_t draws) {
    if (draws == 0) return;
    auto* cpu = engine_.get<at::CPUGeneratorImpl>();
    for (uint64_t i = 0; i < draws; ++i) cpu->random();
  }

  at::Generator engine_;
  uint64_t seed_;
  uint64_t offset_ = 0;
  at::Tensor mark_;  // the engine's state at (mark_seed_, mark_offset_)
  uint64_t mark_seed_ = 0, mark_offset_ = 0;
};

std::once_flag g_defaults_once;
std::vector<at::Generator> g_defaults;

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  const auto n = runtime().device_count;
  std::call_once(g_defaults_once, [n] {
    for (c10::DeviceIndex i = 0; i < n; ++i) g_defaults.push_back(at::make_generator<NeuronGeneratorImpl>(i));
  });
  if (index < 0) index = current_device();
  check_index(index);
  return g_defaults[index];
}

at::Generator new_generator(c10::DeviceIndex index) {
  if (index < 0) index = current_device();
  check_index(index);
  return at::make_generator<NeuronGeneratorImpl>(index);
}

GeneratorLease::GeneratorLease(const at::Generator& gen) : gen_(gen), lock_(gen_.mutex()) {}

GeneratorLease::~GeneratorLease() { static_cast<NeuronGeneratorImpl*>(gen_.unsafeGetGeneratorImpl())->advance(numel_); }

at::Generator GeneratorLease::engine() const {
  return static_cast<NeuronGeneratorImpl*>(gen_.unsafeGetGeneratorImpl())->engine();
}

}  // namespace torch_neuronx
