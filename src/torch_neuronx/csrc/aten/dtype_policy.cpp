// The hardware's dtype policy, and what the emulator does where the host's
// kernels cover fewer dtypes than the device.
//
// Trainium has no FP64 units and NeuronCores take no complex dtypes: as on
// TorchNeuron, such tensors live on the device but their ops run on the CPU,
// and count as CPU fallbacks (op_table.cpp, note_fallback). Quantized tensors
// and the fnuz float8 encodings are refused, as TorchNeuron's table does.
// Reduced-precision ops that an accelerator computes natively but whose CPU
// kernel lacks the dtype run in float32 and are cast back to
// the dtype PyTorch's promotion rules give the result (what CUDA returns);
// Trainium computes them on a core, so they are no fallback: the op tracker
// counts them apart (widened).
#include "aten.h"

#include <torch/library.h>

namespace torch_neuronx {
namespace {

// The result dtypes the op's meta kernel computes from the original inputs;
// an entry is Undefined where it cannot say (no meta kernel, not a tensor).
std::vector<c10::ScalarType> meta_result_dtypes(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args) {
  const size_t nret = op.schema().returns().size();
  std::vector<c10::ScalarType> out(nret, c10::ScalarType::Undefined);
  torch::jit::Stack meta;
  meta.reserve(args.size());
  for (const auto& a : args) {
    if (a.isTensor() && a.toTensor().defined()) {
      const auto& t = a.toTensor();
      meta.emplace_back(at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta)));
    } else if (a.isTensorList() || a.isList() || a.isGenerator()) {
      return out;  // rare on this path: keep the plain rule
    } else {
      meta.push_back(a);
    }
  }
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  } catch (const std::exception&) {
    return out;
  }
  for (size_t i = 0; i < nret && i < meta.size(); ++i) {
    const auto& v = meta[meta.size() - nret + i];
    if (v.isTensor() && v.toTensor().defined()) out[i] = v.toTensor().scalar_type();
  }
  return out;
}

// Without a meta kernel: float32 results go back to the reduced dtype, and
// complex64 results to its complex counterpart where one exists (complex32
// for float16; bfloat16 has none, so complex64 stays).
c10::ScalarType narrowed(c10::ScalarType widened, c10::ScalarType low) {
  if (widened == at::kFloat) return low;
  if (widened == at::kComplexFloat && low == at::kHalf) return at::kComplexHalf;
  return widened;
}

constexpr const char* kNoQuantized =
    "neuron does not support quantized tensors: keep quantized work on the CPU, or store the values as int8 / "
    "float8 neuron tensors with their scales alongside.";

[[noreturn]] void refuse_quantized(c10::ScalarType dtype) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, kNoQuantized, " (got ", c10::toString(dtype), ")");
}

// Quantized tensors never exist on the device; an op that would make one
// (quantize_per_tensor of a neuron tensor, say) stops here, with the way out.
void refuse_quantized_op(const c10::OperatorHandle& op, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, kNoQuantized, " (", op.schema().name(), ")");
}

}  // namespace

bool is_low_precision(c10::ScalarType t) {
  return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2;
}

void check_dtype(c10::ScalarType dtype) {
  if (C10_UNLIKELY(c10::isQIntType(dtype))) refuse_quantized(dtype);
  // The "fnuz" float8 variants are AMD's encodings: the Neuron compiler rejects them (NCC_EVRF005).
  TORCH_CHECK_TYPE(dtype != at::kFloat8_e4m3fnuz && dtype != at::kFloat8_e5m2fnuz,
                   "neuron does not support ", c10::toString(dtype),
                   " (the Neuron compiler rejects the fnuz float8 encodings, NCC_EVRF005): use torch.float8_e4m3fn "
                   "or torch.float8_e5m2");
}

bool run_widened(const c10::OperatorHandle& op, OpEntry& e, torch::jit::Stack* stack,
                 const std::vector<c10::IValue>& args, c10::ScalarType low, const c10::Error& original) {
  const auto wanted = meta_result_dtypes(op, args);
  const size_t begin = stack->size();
  for (const auto& a : args) {
    if (a.isTensor() && a.toTensor().defined() && is_low_precision(a.toTensor().scalar_type())) {
      stack->emplace_back(a.toTensor().to(at::kFloat));
    } else {
      stack->push_back(a);
    }
  }
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  } catch (const c10::Error&) {
    // Not a dtype gap of the host but an op the dtype cannot take at all
    // (bitwise ops on floats, say): the original error is the answer.
    stack->resize(begin);
    return false;
  }
  const size_t nret = wanted.size();
  for (size_t i = 0; i < nret; ++i) {
    auto& v = (*stack)[stack->size() - nret + i];
    if (!v.isTensor() || !v.toTensor().defined()) continue;
    const auto have = v.toTensor().scalar_type();
    const auto want = wanted[i] != c10::ScalarType::Undefined ? wanted[i] : narrowed(have, low);
    if (have != want) v = v.toTensor().to(want);
  }
  note_fallback(e, HostReason::kWidened);
  return true;
}

}  // namespace torch_neuronx

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&torch_neuronx::refuse_quantized_op>());
}
