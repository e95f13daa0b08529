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
#include "../neuron.h"

#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_native.h>

namespace torch_neuronx {
namespace {

int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  return at::native::_fused_sdp_choice_cpp(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace
}  // namespace torch_neuronx

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_neuronx::fused_sdp_choice)
}  // namespace at::native
