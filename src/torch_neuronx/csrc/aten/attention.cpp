// Which fused kernel scaled_dot_product_attention uses on neuron tensors.
//
// SDPA asks a per-device dispatch stub for its backend; a PrivateUse1 device
// that fills in none gets the unfused "math" path, which materialises the
// S x S score matrix (O(S^2) memory, ~18x slower than CPU at S = 2048). The
// device runs CPU kernels on host memory, so it makes the CPU's choice for
// the same tensors: where CPU picks its flash kernel, SDPA calls
// _scaled_dot_product_flash_attention_for_cpu (and its backward), which the
// boxed fallback runs on the aliased memory; elsewhere it takes the math path
// as CPU does. Results therefore equal CPU's bit for bit. The choice reads
// only metadata, so it also answers for FakeTensors while compiling.
//
// The flash kernel is reached under the name of "efficient attention"
// (aten::_scaled_dot_product_efficient_attention and its backward), the
// accelerator op that SDPA calls for any device: for a PrivateUse1 device
// SDPA's flash branch always calls the CPU op by its CPU name, and DTensor's
// sharding rules and context parallelism's ring attention know only the
// accelerator ops (flash, efficient, cuDNN). Efficient attention carries its
// log-sum-exp padded to a multiple of 32 queries, as CUDA's does; the
// kernels below run CPU's flash kernel and pad or trim it. Cases the
// efficient op cannot express (dropout, whose RNG it models with a Philox
// seed, and a mask that needs a gradient) keep CPU's op.
#include "../neuron.h"

#include <ATen/OpMathType.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <torch/library.h>

namespace torch_neuronx {
namespace {

constexpr int64_t kLseAlignment = 32;  // CUDA's efficient kernel pads the log-sum-exp to this many queries

int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  const int64_t choice =
      at::native::_fused_sdp_choice_cpp(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
  const bool mask_needs_grad = attn_mask.has_value() && attn_mask->defined() && attn_mask->requires_grad();
  // float64 keeps CPU's flash op, whose log-sum-exp is float64 too (efficient attention's is float32, as on CUDA,
  // where float64 takes the math path): gradients equal CPU's bit for bit and gradcheck holds.
  if (choice == static_cast<int64_t>(sdp::SDPBackend::flash_attention) && dropout_p == 0.0 && !enable_gqa &&
      !mask_needs_grad && query.scalar_type() != at::kDouble) {
    return static_cast<int64_t>(sdp::SDPBackend::efficient_attention);
  }
  return choice;
}

// The layout efficient attention promises (its meta function): (B, L, H, D) memory, seen as (B, H, L, D).
at::Tensor in_efficient_layout(const at::Tensor& out) {
  const auto bhld = out.sizes();
  if (out.transpose(1, 2).is_contiguous()) return out;
  auto result = at::empty({bhld[0], bhld[2], bhld[1], bhld[3]}, out.options()).transpose(1, 2);
  result.copy_(out);
  return result;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> efficient_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& attn_bias, bool compute_log_sumexp, double dropout_p, bool is_causal,
    std::optional<double> scale) {
  TORCH_CHECK(dropout_p == 0.0,
              "neuron: _scaled_dot_product_efficient_attention runs without dropout only (got dropout_p=", dropout_p,
              "); call F.scaled_dot_product_attention, which takes another kernel for dropout");
  auto [out, lse] =
      at::_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, attn_bias, scale);
  const int64_t queries = query.size(2);
  const int64_t padded = compute_log_sumexp ? (queries + kLseAlignment - 1) / kLseAlignment * kLseAlignment : 0;
  auto lse_out = at::zeros({query.size(0), query.size(1), padded}, query.options().dtype(at::kFloat));
  if (compute_log_sumexp) lse_out.narrow(2, 0, queries).copy_(lse);
  auto philox = at::empty({}, at::TensorOptions().dtype(at::kLong));  // no dropout: nothing to replay
  return {in_efficient_layout(out), lse_out, philox, philox.clone()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> efficient_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& attn_bias, const at::Tensor& out, const at::Tensor& logsumexp, const at::Tensor& /*seed*/,
    const at::Tensor& /*offset*/, double dropout_p, std::array<bool, 4> grad_input_mask, bool is_causal,
    std::optional<double> scale) {
  TORCH_CHECK(dropout_p == 0.0, "neuron: efficient attention's backward runs without dropout only");
  TORCH_CHECK(!grad_input_mask[3], "neuron: efficient attention gives no gradient for attn_bias; ",
              "pass a mask that does not require grad");
  const int64_t queries = query.size(2);
  TORCH_CHECK(logsumexp.dim() == 3 && logsumexp.size(2) >= queries,
              "neuron: efficient attention's backward needs the forward's log-sum-exp (compute_log_sumexp=True)");
  std::optional<at::Tensor> mask;
  if (attn_bias.defined()) mask = attn_bias;
  auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad_out, query, key, value, out,
      // CPU's flash backward wants the log-sum-exp in the accumulation type of the inputs (float64 for float64);
      // efficient attention's is float32 whatever the inputs.
      logsumexp.narrow(2, 0, queries).to(at::toOpMathType(query.scalar_type())).contiguous(), dropout_p, is_causal,
      mask, scale);
  return {gq, gk, gv, at::Tensor()};
}

}  // namespace
}  // namespace torch_neuronx

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_neuronx::fused_sdp_choice)
}  // namespace at::native

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_sdp_choice", &torch_neuronx::fused_sdp_choice);  // the op answers as SDPA's stub does
  m.impl("_scaled_dot_product_efficient_attention", &torch_neuronx::efficient_attention);
  m.impl("_scaled_dot_product_efficient_attention_backward", &torch_neuronx::efficient_attention_backward);
}
