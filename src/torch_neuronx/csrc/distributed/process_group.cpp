// ProcessGroupNeuron: the c10d backend "neuron". Collectives run on Gloo over
// host memory: device tensors are handed to Gloo as CPU tensors aliasing the
// same memory, so nothing is copied on the way in or out. The wrapper adds
// what Gloo lacks (PREMUL_SUM, which FSDP2 uses for gradient division) and
// counts each collective and the bytes it moved, per process group. As
// TorchNeuron's backend (NEURON_USE_SPLIT_ALLGATHER / _REDUCE_SCATTER), an
// all_gather_into_tensor or reduce_scatter_tensor larger than the bucket size
// (COLLECTIVE_BUCKETSIZE_IN_MB) runs as bucket-sized pieces, with the same
// result; the pieces are counted as "<collective>_pieces".
//
// Teardown never holds the GIL: destroying the wrapped ProcessGroupGloo joins
// its worker threads, and a worker finishing its last Work may need the GIL
// (dropping the last reference to a tensor or storage that a Python object
// still owns, or a Python callback on the Work's future). Destroyed with the
// GIL held (the Python object's deallocation, DDP's Reducer, interpreter
// exit), the join would wait forever for a thread that waits for the GIL.
// PyTorch's own bindings avoid it the same way (torch/csrc/distributed/c10d/
// init.cpp, IntrusivePtrNoGilDestructor); here the destructor itself lets go,
// so that every path that drops the last reference is covered.
#include "../neuron.h"

#include <pybind11/chrono.h>
#include "../runtime/profiler.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <map>
#include <mutex>

namespace torch_neuronx {
namespace {

// A CPU alias that keeps the device storage alive: Gloo may finish the
// collective on its own thread after the caller let go of the tensor.
at::Tensor host_view(const at::Tensor& t) { return cpu_alias(t, /*keep_alive=*/true); }

std::vector<at::Tensor> host_views(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(host_view(t));
  return out;
}

std::vector<std::vector<at::Tensor>> host_views(const std::vector<std::vector<at::Tensor>>& tss) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(tss.size());
  for (const auto& ts : tss) out.push_back(host_views(ts));
  return out;
}

int64_t nbytes(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) n += t.defined() ? static_cast<int64_t>(t.numel() * t.element_size()) : 0;
  return n;
}

bool is_premul(const c10d::ReduceOp& op) { return op.op_ == c10d::ReduceOp::PREMUL_SUM; }

// PREMUL_SUM(x, f) = SUM(f * x): scale the contribution, then sum.
at::Tensor premultiplied(const at::Tensor& t, const c10d::ReduceOp& op) {
  auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(s != nullptr, "PREMUL_SUM needs a scaling factor");
  return s->tensor_factor.defined() ? t * host_view(s->tensor_factor).to(t.scalar_type()) : t * s->double_factor;
}

void scale_in_place(const at::Tensor& t, const c10d::ReduceOp& op) {
  auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(s != nullptr, "PREMUL_SUM needs a scaling factor");
  if (s->tensor_factor.defined()) {
    t.mul_(host_view(s->tensor_factor).to(t.scalar_type()));
  } else {
    t.mul_(s->double_factor);
  }
}

// NCCL accepts the world-sized tensor of all_gather_into_tensor and
// reduce_scatter_tensor stacked ([W, *shard]) as well as concatenated
// ([W * d0, ...]); Gloo only the latter. Same memory, so a view serves.
at::Tensor flat_if_stacked(const at::Tensor& big, const at::Tensor& shard) {
  if (big.dim() == shard.dim() + 1 && big.dim() >= 2) return big.flatten(0, 1);
  return big;
}

c10d::ReduceOp sum_op() { return c10d::ReduceOp(c10d::ReduceOp::SUM); }

// Drops `host` (the last reference joins Gloo's threads) with the GIL released if this thread holds it.
void release_host_without_gil(c10::intrusive_ptr<c10d::Backend>& host) noexcept {
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release no_gil;
    host.reset();
  } else {
    host.reset();
  }
}

// In-place reductions: PREMUL_SUM scales each contribution, then sums.
template <typename Options, typename Run>
c10::intrusive_ptr<c10d::Work> in_place_reduction(std::vector<at::Tensor>& tensors, const Options& opts, Run&& run) {
  if (!is_premul(opts.reduceOp)) return run(tensors, opts);
  for (auto& x : tensors) scale_in_place(x, opts.reduceOp);
  auto summed = opts;
  summed.reduceOp = sum_op();
  return run(tensors, summed);
}

class ProcessGroupNeuron final : public c10d::Backend {
 public:
  explicit ProcessGroupNeuron(c10::intrusive_ptr<c10d::Backend> host)
      : c10d::Backend(host->getRank(), host->getSize()), host_(std::move(host)) {}

  ~ProcessGroupNeuron() override { release_host_without_gil(host_); }

  const std::string getBackendName() const override { return "neuron"; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return host_->getBackendOptions(); }
  void setTimeout(std::chrono::milliseconds timeout) override { host_->setTimeout(timeout); }
  bool supportsCoalescing() const override { return host_->supportsCoalescing(); }
  void startCoalescing() override { host_->startCoalescing(); }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override { return host_->endCoalescing(); }
  // TORCH_DISTRIBUTED_DEBUG=DETAIL checks collectives against each other
  // (shapes included) by sequence number.
  void setSequenceNumberForGroup() override { host_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return host_->getSequenceNumberForGroup(); }
  // destroy_process_group() shuts every backend down; abort() on a failure. Gloo's must hear of it too.
  void shutdown() override { host_->shutdown(); }
  void abort() override { host_->abort(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    count("broadcast", nbytes(tensors));
    auto t = host_views(tensors);
    return traced(host_->broadcast(t, opts));
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    count("all_reduce", nbytes(tensors));
    auto t = host_views(tensors);
    return traced(in_place_reduction(t, opts, [&](auto& ts, const auto& o) { return host_->allreduce(ts, o); }));
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    count("all_reduce_coalesced", nbytes(tensors));
    auto t = host_views(tensors);
    return traced(in_place_reduction(t, opts, [&](auto& ts, const auto& o) { return host_->allreduce_coalesced(ts, o); }));
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    count("reduce", nbytes(tensors));
    auto t = host_views(tensors);
    return traced(in_place_reduction(t, opts, [&](auto& ts, const auto& o) { return host_->reduce(ts, o); }));
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    count("all_gather", nbytes(inputs) * getSize());
    auto o = host_views(outputs);
    auto i = host_views(inputs);
    return traced(host_->allgather(o, i, opts));
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    count("all_gather_into_tensor", nbytes({output}));
    auto o = flat_if_stacked(host_view(output), input);
    auto i = host_view(input);
    const int64_t n = i.numel();
    const int64_t per_piece = piece_elements(split_allgather_, nbytes({output}), i.element_size());
    if (per_piece == 0 || !i.is_contiguous() || !o.is_contiguous() || o.numel() != n * getSize()) {
      return traced(host_->_allgather_base(o, i, opts));
    }
    // Each piece gathers elements [a, b) of every rank's shard into a staging buffer, then lands in place.
    const auto flat_in = i.reshape({n});
    const auto by_rank = o.view({getSize(), n});
    c10::intrusive_ptr<c10d::Work> work;
    for (int64_t a = 0; a < n; a += per_piece) {
      const int64_t len = std::min(per_piece, n - a);
      tally("all_gather_into_tensor_pieces", len * i.element_size() * getSize());
      auto piece_in = flat_in.narrow(0, a, len);
      auto staged = at::empty({getSize() * len}, i.options());
      work = host_->_allgather_base(staged, piece_in, opts);
      work->wait();
      by_rank.narrow(1, a, len).copy_(staged.view({getSize(), len}));
    }
    return traced(work);
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    count("all_gather_coalesced", nbytes(inputs) * getSize());
    auto o = host_views(outputs);
    auto i = host_views(inputs);
    return traced(host_->allgather_coalesced(o, i, opts));
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override {
    count("all_gather_into_tensor_coalesced", nbytes(outputs));
    auto o = host_views(outputs);
    auto i = host_views(inputs);
    return traced(host_->allgather_into_tensor_coalesced(o, i, opts));
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    count("gather", nbytes(inputs));
    auto o = host_views(outputs);
    auto i = host_views(inputs);
    return traced(host_->gather(o, i, opts));
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    count("scatter", nbytes(outputs));
    auto o = host_views(outputs);
    auto i = host_views(inputs);
    return traced(host_->scatter(o, i, opts));
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    count("reduce_scatter", nbytes(outputs) * getSize());
    auto o = host_views(outputs);
    auto i = host_views(inputs);
    if (!is_premul(opts.reduceOp)) return traced(host_->reduce_scatter(o, i, opts));
    for (auto& list : i) {
      for (auto& x : list) x = premultiplied(x, opts.reduceOp);
    }
    auto op = opts;
    op.reduceOp = sum_op();
    return traced(host_->reduce_scatter(o, i, op));
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    count("reduce_scatter_tensor", nbytes({input}));
    auto o = host_view(output);
    auto i = flat_if_stacked(host_view(input), output);
    auto op = opts;
    if (is_premul(opts.reduceOp)) {
      i = premultiplied(i, opts.reduceOp);  // a host copy: the caller's input stays as it was
      op.reduceOp = sum_op();
    }
    const int64_t n = o.numel();
    const int64_t per_piece = piece_elements(split_reduce_scatter_, nbytes({input}), o.element_size());
    if (per_piece == 0 || !i.is_contiguous() || !o.is_contiguous() || i.numel() != n * getSize()) {
      return traced(host_->_reduce_scatter_base(o, i, op));
    }
    // Each piece reduces elements [a, b) of every rank's block straight into the output's elements [a, b).
    const auto by_rank = i.view({getSize(), n});
    const auto flat_out = o.view({n});
    c10::intrusive_ptr<c10d::Work> work;
    for (int64_t a = 0; a < n; a += per_piece) {
      const int64_t len = std::min(per_piece, n - a);
      tally("reduce_scatter_tensor_pieces", len * o.element_size() * getSize());
      auto staged = by_rank.narrow(1, a, len).contiguous().view({getSize() * len});
      auto piece_out = flat_out.narrow(0, a, len);
      work = host_->_reduce_scatter_base(piece_out, staged, op);
      work->wait();
    }
    return traced(work);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    count("reduce_scatter_tensor_coalesced", nbytes(inputs));
    auto o = host_views(outputs);
    auto i = host_views(inputs);
    auto op = opts;
    if (is_premul(opts.reduceOp)) {
      for (auto& x : i) x = premultiplied(x, opts.reduceOp);
      op.reduceOp = sum_op();
    }
    return traced(host_->reduce_scatter_tensor_coalesced(o, i, op));
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override {
    count("all_to_all_single", nbytes({input}));
    auto o = host_view(output);
    auto i = host_view(input);
    return traced(host_->alltoall_base(o, i, output_split_sizes, input_split_sizes, opts));
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    count("all_to_all", nbytes(inputs));
    auto o = host_views(outputs);
    auto i = host_views(inputs);
    return traced(host_->alltoall(o, i, opts));
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    count("send", nbytes(tensors));
    auto t = host_views(tensors);
    return traced(host_->send(t, dst, tag));
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    count("recv", nbytes(tensors));
    auto t = host_views(tensors);
    return traced(host_->recv(t, src, tag));
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    count("recv", nbytes(tensors));
    auto t = host_views(tensors);
    return traced(host_->recvAnysource(t, tag));
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    count("barrier", 0);
    auto o = opts;
    o.device.reset();  // Gloo synchronises hosts; any device id is the host
    o.device_ids.clear();
    return traced(host_->barrier(o));
  }

  // COLLECTIVE_BUCKETSIZE_IN_MB and the two split switches, read (and validated) by torch_neuronx.distributed.
  void set_bucketing(int64_t bucket_bytes, bool split_allgather, bool split_reduce_scatter) {
    TORCH_CHECK_VALUE(bucket_bytes > 0, "the collective bucket size must be positive, got ", bucket_bytes);
    bucket_bytes_ = bucket_bytes;
    split_allgather_ = split_allgather;
    split_reduce_scatter_ = split_reduce_scatter;
  }

  std::map<std::string, std::pair<int64_t, int64_t>> stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.clear();
  }

 private:
  // Elements of one rank's shard per piece when a collective of `total_bytes` must be split; 0: run it whole.
  int64_t piece_elements(bool enabled, int64_t total_bytes, int64_t element_size) const {
    if (!enabled || total_bytes <= bucket_bytes_ || element_size <= 0) return 0;
    return std::max<int64_t>(1, bucket_bytes_ / (element_size * getSize()));
  }

  void tally(const char* name, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& s = stats_[name];
    s.first += 1;
    s.second += bytes;
  }

  // Counts a collective, and notes it for traced() to time (when torch.profiler records device activity).
  void count(const char* name, int64_t bytes) {
    tally(name, bytes);
    t_pending = {name, bytes, device_profiling() ? profiler_now_ns() : 0};
  }

  // A collective's Work, timed as a device event on this rank's core from its start to its completion.
  c10::intrusive_ptr<c10d::Work> traced(c10::intrusive_ptr<c10d::Work> work) {
    const Pending pending = t_pending;
    if (pending.start_ns == 0 || !work) return work;
    const auto device = current_device();
    const std::string name = std::string("c10d::") + pending.name;
    auto future = work->getFuture();
    if (!future) {
      record_device_event(name, device, pending.start_ns, profiler_now_ns(), pending.bytes);
    } else {
      future->addCallback([=](c10::ivalue::Future&) {
        record_device_event(name, device, pending.start_ns, profiler_now_ns(), pending.bytes);
      });
    }
    return work;
  }

  struct Pending {
    const char* name;
    int64_t bytes;
    int64_t start_ns;
  };
  static thread_local Pending t_pending;

  c10::intrusive_ptr<c10d::Backend> host_;
  int64_t bucket_bytes_ = int64_t{512} << 20;  // TorchNeuron's default, 512 MB
  bool split_allgather_ = true;
  bool split_reduce_scatter_ = true;
  mutable std::mutex mutex_;
  std::map<std::string, std::pair<int64_t, int64_t>> stats_;  // collective -> (calls, bytes)
};

thread_local ProcessGroupNeuron::Pending ProcessGroupNeuron::t_pending{"", 0, 0};

}  // namespace

void init_distributed(pybind11::module& m) {
  namespace py = pybind11;
  py::class_<ProcessGroupNeuron, c10d::Backend, c10::intrusive_ptr<ProcessGroupNeuron>>(m, "ProcessGroupNeuron")
      .def(py::init([](const c10::intrusive_ptr<c10d::Backend>& host) {
             return c10::make_intrusive<ProcessGroupNeuron>(host);
           }),
           py::arg("host"))
      // Gloo's and NCCL's name for it: what torch.distributed's timeout setters call on a backend.
      .def("_set_default_timeout",
           [](ProcessGroupNeuron& self, std::chrono::milliseconds timeout) { self.setTimeout(timeout); },
           py::arg("timeout"))
      .def("_set_bucketing", &ProcessGroupNeuron::set_bucketing, py::arg("bucket_bytes"),
           py::arg("split_allgather"), py::arg("split_reduce_scatter"))
      .def("comm_stats", &ProcessGroupNeuron::stats)
      .def("reset_comm_stats", &ProcessGroupNeuron::reset_stats);
}

}  // namespace torch_neuronx
