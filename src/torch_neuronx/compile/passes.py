"""Rewrites of Dynamo graphs before Inductor sees them.

Scaled dot-product attention: PyTorch picks the fused attention kernel per
device type through a C++ dispatch stub that PrivateUse1 devices must fill
in; ours is empty (see the core's TODO), so on neuron tensors SDPA takes the
slow unfused "math" path, in eager and when traced for compilation. The host
can run CPU's fused flash-attention kernel on device memory, so where CPU
would pick it for the same shapes and options, the graph calls it directly.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

_FLASH = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION.value)
_SDPA_TARGETS = (F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention)
_ARG_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")


def flash_attention_host(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                         scale: float | None = None) -> torch.Tensor:
    """SDPA through CPU's fused flash-attention kernel (callable on neuron tensors: host memory)."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        # As SDPA does before its fused kernels: True keeps a position, False adds -inf.
        attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(~attn_mask, float("-inf"))
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
    )[0]


def _host_proxy(value: Any) -> Any:
    """An uninitialised CPU tensor shaped like a graph value (pages untouched, so nearly free)."""
    if not isinstance(value, torch.Tensor):
        return value
    return torch.empty_strided(tuple(value.shape), value.stride(), dtype=value.dtype, device="cpu")


def _example(arg: Any) -> Any:
    return arg.meta.get("example_value") if isinstance(arg, torch.fx.Node) else arg


def use_host_flash_attention(gm: torch.fx.GraphModule) -> int:
    """Route eligible SDPA calls on neuron tensors to CPU's flash kernel; returns how many."""
    rewritten = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _SDPA_TARGETS:
            continue
        if node.kwargs.get("enable_gqa", False) or len(node.args) > len(_ARG_NAMES):
            continue
        bound = dict(zip(_ARG_NAMES, node.args, strict=False)) | dict(node.kwargs)
        examples = {name: _example(arg) for name, arg in bound.items()}
        query = examples.get("query")
        if not isinstance(query, torch.Tensor) or query.device.type != "neuron":
            continue
        if any(isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in v.shape)
               for v in examples.values()):
            continue  # symbolic shapes: the choice depends on sizes not known yet
        if any(isinstance(v, torch.fx.Node) for name, v in bound.items() if name in ("dropout_p", "is_causal",
                                                                                      "scale")):
            continue
        try:
            choice = torch.ops.aten._fused_sdp_choice(
                *(_host_proxy(examples[n]) for n in ("query", "key", "value")),
                attn_mask=_host_proxy(examples.get("attn_mask")),
                dropout_p=examples.get("dropout_p", 0.0) or 0.0,
                is_causal=bool(examples.get("is_causal", False)),
                scale=examples.get("scale"),
            )
        except Exception:  # an unusual call: keep PyTorch's own path
            continue
        if choice != _FLASH:
            continue
        node.target = flash_attention_host
        node.args, node.kwargs = (), {k: v for k, v in bound.items()}
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten
