"""FlexAttention in compiled graphs on neuron: what Inductor runs for it.

Inductor lowers ``torch.ops.higher_order.flex_attention`` to a C++ template
on "cpu" and to Triton templates on every other device, and its backward
only to Triton. Neuron runs Inductor's C++ backend, so:

* inference that needs no log-sum-exp (``OUTPUT_LOGSUMEXP`` false: grad
  mode off, no ``return_lse``), with mods that read no tensors of their own,
  takes CPU's C++ flash template, which streams over key blocks and skips
  the blocks the mask empties;
* everything else (training, ``return_lse``/``return_aux``, mods that
  capture tensors, a host without the template's AVX2) is rewritten, before AOTAutograd, into the dense
  math PyTorch's eager flex runs (``math_attention``): AOTAutograd then
  differentiates plain aten ops and Inductor fuses them, forward and
  backward. It materialises the B·H·L·S scores, as eager flex does.

The rewrite is an Inductor pre-grad custom pass (with ``uuid()``, so the
FX graph cache stays on), added next to any pass the user set;
:func:`install` puts it there the first time Dynamo traces a flex call on
neuron tensors (see ``patches.patch_flex_attention``), so processes that
never use flex never load any of this. The lowering's device routing is
``patches.patch_flex_lowering``.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

DEVICE = "neuron"
_install_lock = threading.Lock()


def dense_flex(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, score_mod: Any, block_mask: tuple,
               scale: float, kernel_options: dict[str, Any], score_mod_other_buffers: tuple = (),
               mask_mod_other_buffers: tuple = ()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The flex HOP's own dense implementation (its CompositeExplicitAutograd kernel), as a traceable function."""
    from torch._higher_order_ops.flex_attention import _permute_strides, math_attention

    out, lse, max_scores = math_attention(query, key, value, score_mod, block_mask, scale, kernel_options,
                                          score_mod_other_buffers, mask_mod_other_buffers)
    return _permute_strides(out, query.stride()), lse, max_scores


def _example(node: Any) -> Any:
    return node.meta.get("example_value", node.meta.get("val")) if isinstance(node, torch.fx.Node) else None


def needs_dense(kernel_options: dict[str, Any], captures: bool) -> bool:
    """Whether a neuron flex call must take the dense path rather than CPU's inference-only C++ template.

    `captures`: the score_mod or mask_mod reads tensors of its own (a document map, a padding mask). The
    template's indirect loads of those fail to generate on neuron (and some on CPU too, in torch 2.13), so
    such calls take the dense path.
    """
    from torch._inductor.kernel.flex.flex_cpu import check_cpu_supported

    # flex_attention sets OUTPUT_LOGSUMEXP on non-CPU devices whenever the LSE is asked for or grad mode is
    # on (a backward needs it): false means an inference call.
    return bool(kernel_options.get("OUTPUT_LOGSUMEXP", True)) or captures or not check_cpu_supported()


class DenseFlexOnNeuron(CustomGraphPass):
    """Pre-grad pass: neuron flex calls that need the log-sum-exp or gradients become :func:`dense_flex`."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        hop = torch.ops.higher_order.flex_attention
        for node in graph.nodes:
            if node.op != "call_function" or node.target is not hop:
                continue
            query = _example(node.args[0])
            if not isinstance(query, torch.Tensor) or query.device.type != DEVICE:
                continue
            args = list(node.args) + [None] * (9 - len(node.args))
            kernel_options = args[6] if args[6] is not None else node.kwargs.get("kernel_options", {})
            captures = bool(args[7] or node.kwargs.get("score_mod_other_buffers")) or bool(
                args[8] or node.kwargs.get("mask_mod_other_buffers"))
            if needs_dense(kernel_options, captures):
                node.target = dense_flex

    def uuid(self) -> bytes:
        # Inductor's FX graph cache keys on this: a hash of this file, so that any change to the pass is a miss.
        from torch._inductor.custom_graph_pass import get_hash_for_files

        return get_hash_for_files((__file__,), torch.__version__)


PASS = DenseFlexOnNeuron()


def installed() -> bool:
    """Whether Inductor's pre-grad passes include the neuron flex rewrite."""
    import torch._inductor.config as inductor_config
    from torch._inductor.custom_graph_pass import get_custom_graph_passes

    return any(isinstance(p, DenseFlexOnNeuron) for p in get_custom_graph_passes(inductor_config.pre_grad_custom_pass))


def install() -> bool:
    """Add the rewrite to Inductor's pre-grad passes, after the user's (idempotent); route the lowering."""
    import torch._inductor.config as inductor_config

    from torch_neuronx import patches

    with _install_lock:
        patches.patch_flex_lowering()
        if not installed():
            current = inductor_config.pre_grad_custom_pass
            if current is None:
                inductor_config.pre_grad_custom_pass = PASS
            else:
                user = list(current) if isinstance(current, (list, tuple)) else [current]
                inductor_config.pre_grad_custom_pass = [*user, PASS]
    return True
