// The kernels the device needs of its own (as in PyTorch's OpenReg backend):
// allocation, copies across the device boundary, resizing, metadata views.
// Every other op reaches the boxed fallback.
#include "aten.h"
#include "../runtime/profiler.h"

#include <ATen/EmptyTensor.h>
#include <ATen/Dispatch.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/unfold_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace torch_neuronx {
namespace {

c10::DeviceIndex target_index(std::optional<c10::Device> device) {
  const auto index = device && device->has_index() ? device->index() : current_device();
  check_index(index);
  return index;
}

const c10::DispatchKeySet kDeviceKeys(c10::DispatchKey::PrivateUse1);

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool>, std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout || *layout == c10::kStrided, "neuron supports only strided (dense) tensors, got layout ",
              *layout);
  const auto type = c10::dtype_or_default(dtype);
  check_dtype(type);
  c10::DeviceGuard guard(c10::Device(kNeuron, target_index(device)));
  return at::detail::empty_generic(size, device_allocator(), kDeviceKeys, type, memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool>) {
  TORCH_CHECK(!layout || *layout == c10::kStrided, "neuron supports only strided (dense) tensors, got layout ",
              *layout);
  const auto type = c10::dtype_or_default(dtype);
  check_dtype(type);
  c10::DeviceGuard guard(c10::Device(kNeuron, target_index(device)));
  return at::detail::empty_strided_generic(size, stride, device_allocator(), kDeviceKeys, type);
}

// Copies between host and device, or between cores: both sides are host
// memory, so the CPU copy kernel does it (dtype conversion, broadcasting,
// and the conjugate/negative bits included).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  const auto on_device = [](const at::Tensor& t) { return t.device().type() == kNeuron; };
  TORCH_CHECK(on_device(self) || self.is_cpu(), "copy between neuron and ", self.device(), " is not supported");
  TORCH_CHECK(on_device(dst) || dst.is_cpu(), "copy between neuron and ", dst.device(), " is not supported");
  static const std::string kName = "aten::_copy_from";
  DeviceEventScope event(kName, on_device(dst) ? dst.device().index() : self.device().index());
  // A conversion on the device to or from float64 or complex is host work, as on TorchNeuron (a plain
  // transfer between host and device is not).
  const bool converts = (on_device(dst) && on_device(self)) || dst.scalar_type() != self.scalar_type();
  const HostReason host = !converts ? HostReason::kNone
                                    : stronger(on_device(dst) ? dtype_reason(dst.scalar_type()) : HostReason::kNone,
                                               on_device(self) ? dtype_reason(self.scalar_type()) : HostReason::kNone);
  if (C10_UNLIKELY(host != HostReason::kNone)) {
    static OpEntry& entry = entry_named(kName);
    entry.executed.fetch_add(1, std::memory_order_relaxed);
    note_fallback(entry, host);
  }
  HostAliases aliases;  // source and destination views of one storage share one alias: overlap is detected
  at::Tensor src = on_device(self) ? aliases(self) : self;
  at::Tensor out = on_device(dst) ? aliases(dst) : dst;
  out.copy_(src, non_blocking);
  return dst;
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(self.device());  // growth allocates on the tensor's own core
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize_(dst, self.sym_sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(offset));
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) { return at::native::view(self, size); }

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

at::Tensor unfold(const at::Tensor& self, int64_t dim, int64_t size, int64_t step) {
  return at::native::unfold(self, dim, size, step);
}

at::Tensor& set_storage(at::Tensor& self, at::Storage storage, int64_t offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  TORCH_CHECK(!storage.data_ptr() || storage.device().type() == kNeuron,
              "set_: expected a neuron storage, got one on ", storage.device());
  return at::cpu::set_(self, storage, offset, size, stride);
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage storage) { return at::native::set_(self, storage); }

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, device_allocator(), true);
  return at::native::set_(self, empty);
}

// Autograd returns these for gradients known to be zero (e.g. sgn of real
// inputs): a tensor with no memory behind it, marked ZeroTensor.
at::Tensor efficientzerotensor(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout>, std::optional<c10::Device> device, std::optional<bool>) {
  const auto type = c10::dtype_or_default(dtype);
  check_dtype(type);
  at::native::ZeroTensorAllocator allocator(c10::Device(kNeuron, target_index(device)));
  return at::detail::empty_generic(size, &allocator, kDeviceKeys | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor),
                                   type, std::nullopt);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) { return at::_local_scalar_dense(cpu_alias(self)); }

at::Tensor alias_or_undefined(const std::optional<at::Tensor>& t) {
  return t && t->defined() ? cpu_alias(*t) : at::Tensor();
}

at::Tensor contiguous_or_undefined(const at::Tensor& t) { return t.defined() ? t.contiguous() : t; }

// PrivateUse1 convolutions dispatch to the *_overrideable ops, which have no
// CPU kernel to fall back to: run the CPU convolution on aliases instead.
// Results are contiguous whatever the input's layout: that is the memory
// format PyTorch declares for the overrideable backend, which FakeTensor (and
// so torch.compile) assumes; the CPU kernel's channels_last result would
// contradict the compiled graph's stride checks.
at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                                    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                                    c10::IntArrayRef output_padding, int64_t groups) {
  const auto index = input.device().index();
  KernelAllocationScope scope(index);
  static const std::string kName = "aten::convolution_overrideable";
  DeviceEventScope event(kName, index);
  auto out = at::convolution(cpu_alias(input), cpu_alias(weight), alias_or_undefined(bias), stride, padding,
                             dilation, transposed, output_padding, groups);
  return to_device(out.contiguous(), index);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  const auto index = input.device().index();
  KernelAllocationScope scope(index);
  static const std::string kName = "aten::convolution_backward_overrideable";
  DeviceEventScope event(kName, index);
  const int64_t out_channels = transposed ? weight.size(1) * groups : weight.size(0);
  const std::vector<int64_t> bias_sizes{out_channels};
  auto [gi, gw, gb] = at::convolution_backward(
      cpu_alias(grad_output), cpu_alias(input), cpu_alias(weight),
      output_mask[2] ? at::OptionalIntArrayRef(bias_sizes) : at::OptionalIntArrayRef(), stride, padding, dilation,
      transposed, output_padding, groups, output_mask);
  return {to_device(contiguous_or_undefined(gi), index), to_device(contiguous_or_undefined(gw), index),
          to_device(gb, index)};
}

// Dropout as the CPU computes it. PyTorch sends accelerators (PrivateUse1
// included) to the fused native_dropout, which draws a boolean mask and so
// other random numbers than the CPU path; the emulator promises the CPU's
// numbers for the same seed, so neuron takes the CPU's path.
at::Tensor dropout(const at::Tensor& input, double p, bool train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (p == 0 || !train || input.sym_numel() == 0) return input;
  if (p == 1) return input * at::zeros({}, input.options());
  auto noise = at::empty_like(input).bernoulli_(1 - p);
  noise.div_(1 - p);
  return input * noise;
}

at::Tensor& dropout_(at::Tensor& input, double p, bool train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (p == 0 || !train || input.sym_numel() == 0) return input;
  if (p == 1) return input.mul_(at::zeros({}, input.options()));
  auto noise = at::empty_like(input).bernoulli_(1 - p);
  noise.div_(1 - p);
  return input.mul_(noise);
}

// CUDA counts integer tensors too, into a histogram of the input's dtype; the
// CPU kernel takes floating types only. MoE routers depend on it
// (transformers' grouped_mm experts run histc on int32 expert ids off CPU).
// CUDA's arithmetic: bounds truncated to the type, min == max means the
// data's range, a bin is (v - min) * bins / (max - min) in integers, max
// falls in the last bin. The product is formed in 128 bits, so int64 values
// over a wide range cannot overflow it, and the bin is clamped.
template <typename T>
at::Tensor histc_integral(const at::Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max) {
  const at::Tensor data = cpu_alias(self).contiguous();
  T lo = min.to<T>(), hi = max.to<T>();
  if (lo == hi && data.numel() > 0) {
    lo = data.min().item<T>();
    hi = data.max().item<T>();
  }
  if (lo == hi) {
    lo = static_cast<T>(lo - 1);
    hi = static_cast<T>(hi + 1);
  }
  TORCH_CHECK(lo < hi, "max must be larger than min");
  at::Tensor hist = at::zeros({bins}, data.options());
  T* counts = hist.data_ptr<T>();
  const T* values = data.const_data_ptr<T>();
  const __int128 low = lo, high = hi, width = high - low;
  for (int64_t i = 0, n = data.numel(); i < n; ++i) {
    const __int128 v = values[i];
    if (v < low || v > high) continue;
    const __int128 bin = (v - low) * bins / width;
    ++counts[static_cast<int64_t>(std::min<__int128>(bin, bins - 1))];
  }
  return hist;
}

at::Tensor histc_kernel(const at::Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max) {
  TORCH_CHECK(bins > 0, "bins must be > 0, but got ", bins);
  const auto index = self.device().index();
  KernelAllocationScope scope(index);
  if (!c10::isIntegralType(self.scalar_type(), /*includeBool=*/false)) {
    return to_device(at::histc(cpu_alias(self), bins, min, max), index);
  }
  at::Tensor hist;
  AT_DISPATCH_INTEGRAL_TYPES(self.scalar_type(), "histc",
                             [&] { hist = histc_integral<scalar_t>(self, bins, min, max); });
  return to_device(hist, index);
}

at::Tensor& histc_out(const at::Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max,
                      at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == self.scalar_type(), "torch.histc: input tensor and hist tensor should have the "
              "same dtype, but got input ", self.scalar_type(), " and hist ", out.scalar_type());
  const at::Tensor hist = histc_kernel(self, bins, min, max);
  at::native::resize_output(out, hist.sizes());
  out.copy_(hist);
  return out;
}

// Tensor.record_stream: the storage's block is not reused by its own stream
// until the other stream is done with it (the caching allocator's rule).
void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kNeuron, "record_stream: expected a neuron stream, got one on ",
              stream.device());
  device_allocator()->recordStream(self.storage().data_ptr(), stream);
}

// c10 treats CPU and CUDA tensors as interchangeable behind one Variable
// (`param.data = other`) but knows no PrivateUse1 backend, so without this
// module.to("neuron") would replace every Parameter instead of swapping its
// data, and an optimizer built before the move would keep training the
// stale CPU copies (Accelerate's documented prepare() order).
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  static const c10::DispatchKeySet dense_backends({c10::BackendComponent::CPUBit, c10::BackendComponent::CUDABit,
                                                   c10::BackendComponent::PrivateUse1Bit});
  const auto dense = [](c10::DispatchKeySet ks) {
    return ks.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && ks.has_any(dense_backends);
  };
  const auto a = self.key_set(), b = from.key_set();
  return (dense(a) && dense(b)) || self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(b);
}

}  // namespace

}  // namespace torch_neuronx

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("dropout", torch_neuronx::dropout);
  m.impl("dropout_", torch_neuronx::dropout_);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace torch_neuronx;
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("resize_", resize_);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("unfold", unfold);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("_efficientzerotensor", efficientzerotensor);
  m.impl("convolution_overrideable", convolution_overrideable);
  m.impl("convolution_backward_overrideable", convolution_backward_overrideable);
  m.impl("histc", histc_kernel);
  m.impl("histc.out", histc_out);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("record_stream", record_stream);
}

// Copies resolve the conjugate and negative bits themselves (the CPU copy
// kernel reads them off the aliases). Without these fallthroughs the math
// fallbacks would materialise the source with clone(), which copies again.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
