"""Read the model to plan: a Hugging Face config.json or model directory, a config object, or ``module:function``.

The planner needs shapes, not weights: hidden size, layers, heads and KV
heads (GQA), MLP width, vocabulary, experts (MoE) and whether the embeddings
are tied. ``module:function`` builds the model (on the meta device, so a
70B model costs nothing) and reads its config and parameter count.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width (0 when every layer is MoE)
    experts: int = 0  # routed experts per MoE layer
    experts_per_token: int = 0
    expert_intermediate: int = 0
    tied_embeddings: bool = False
    config: Any = None  # the transformers config, when there is one (for --measure)
    raw: Any = None  # the config.json's fields, when read without transformers (for --measure)

    @property
    def attention_params(self) -> int:
        q_o = 2 * self.hidden * self.heads * self.head_dim
        return q_o + 2 * self.hidden * self.kv_heads * self.head_dim

    @property
    def mlp_params(self) -> int:
        """Parameters of one layer's MLP (all experts and the router, for MoE)."""
        if self.experts:
            return self.experts * 3 * self.hidden * self.expert_intermediate + self.hidden * self.experts
        return 3 * self.hidden * self.intermediate

    @property
    def layer_params(self) -> int:
        return self.attention_params + self.mlp_params + 2 * self.hidden  # two RMSNorm weights

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        head = 0 if self.tied_embeddings else self.embedding_params
        return self.layers * self.layer_params + self.embedding_params + head + self.hidden

    def transformers_config(self) -> Any:
        """The transformers config (built from the config.json's fields when the plan did not need transformers)."""
        if self.config is None and self.raw is not None:
            return _transformers_config(self.raw)
        return self.config

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("config", "raw")}
        d["parameters"] = self.total_params
        return d


def from_config(config: Any, name: str | None = None, raw: dict[str, Any] | None = None) -> ModelSpec:
    """A spec from a transformers config (Llama, Mistral, Qwen2/3, Mixtral, Qwen-MoE and alike) or its dict."""
    if not hasattr(config, "to_dict") and not isinstance(config, dict):
        raise ValueError(f"the model config is a {type(config).__name__}, not a mapping of config fields: pass a "
                         "Hugging Face config.json (a JSON object)")
    c = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size") if k not in c]
    if missing:
        raise ValueError(f"the model config lacks {', '.join(missing)}: the planner reads decoder-only transformer "
                         "configs (Llama, Mistral, Qwen, Mixtral); pass one with these fields")
    heads = _count(c, "num_attention_heads")
    hidden = _count(c, "hidden_size")
    experts = _count(c, "num_local_experts", 0) or _count(c, "num_experts", 0)
    kv_heads = _count(c, "num_key_value_heads", heads) or heads
    head_dim = _count(c, "head_dim", 0) or hidden // heads
    if heads % kv_heads:
        raise ValueError(f"the model config has num_attention_heads={heads} not a multiple of "
                         f"num_key_value_heads={kv_heads}: grouped-query attention needs whole groups; fix the config")
    if not c.get("head_dim") and hidden % heads:
        raise ValueError(f"the model config has hidden_size={hidden} not divisible by num_attention_heads={heads} "
                         "and no head_dim: give head_dim or fix the sizes")
    expert_width = (_count(c, "moe_intermediate_size", 0) or _count(c, "intermediate_size", 0)) if experts else 0
    spec = ModelSpec(
        name=name or (c.get("_name_or_path") or c.get("model_type") or "model"),
        vocab=_count(c, "vocab_size"), hidden=hidden, layers=_count(c, "num_hidden_layers"), heads=heads,
        kv_heads=kv_heads, head_dim=head_dim,
        intermediate=0 if experts else (_count(c, "intermediate_size", 0) or 4 * hidden), experts=experts,
        experts_per_token=_count(c, "num_experts_per_tok", 0), expert_intermediate=expert_width,
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        config=config if hasattr(config, "to_dict") else None, raw=raw,
    )
    if experts and not (1 <= spec.experts_per_token <= experts and expert_width >= 1):
        raise ValueError(f"the MoE config needs 1 <= num_experts_per_tok <= {experts} experts and an expert width "
                         f"(moe_intermediate_size or intermediate_size); it has num_experts_per_tok="
                         f"{spec.experts_per_token}, width {expert_width}")
    return spec


_LIMIT = 1 << 40  # no real model has a dimension near this; beyond it the arithmetic only produces nonsense


def _count(c: dict[str, Any], key: str, default: int | None = None) -> int:
    """A whole, positive dimension from a config (`default` when absent or null; 0 allowed only as the default)."""
    value = c.get(key)
    if value is None:
        if default is None:
            raise ValueError(f"the model config lacks {key}")
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= _LIMIT \
            or value != int(value):
        raise ValueError(f"the model config has {key}={value!r}: it must be a whole number between 1 and 2**40")
    return int(value)


def _self_contained(data: dict[str, Any]) -> bool:
    """Whether a config.json names every field the planner reads (else transformers' defaults fill them in)."""
    needed = ["model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "tie_word_embeddings"]
    needed.append("intermediate_size" if not (data.get("num_local_experts") or data.get("num_experts"))
                  else "num_experts_per_tok")
    return all(k in data for k in needed)


def _transformers_config(data: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    data = dict(data)
    model_type = data.pop("model_type", None)
    if model_type is None:
        return None
    return AutoConfig.for_model(model_type, **data)


def load(spec: str | Path | Any) -> ModelSpec:
    """Read a model spec: a config object, a config.json, a model directory, or ``module:function``."""
    if not isinstance(spec, str | Path):
        return from_config(spec)
    text = str(spec)
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
        if not path.exists():
            raise ValueError(f"{spec} is a directory without config.json: pass a Hugging Face model directory")
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise ValueError(f"no such config file: {path}")
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"cannot read the model config {path} as JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} holds a JSON {type(data).__name__}, not a config object")
        name = path.parent.name if path.name == "config.json" else path.stem
        if _self_contained(data):  # every field the planner reads is there: no need to import transformers (slow)
            return from_config(data, name=name, raw=data)
        return from_config(_transformers_config(data) or data, name=name)
    if ":" in text:
        return _from_builder(text)
    raise ValueError(f"cannot read model {spec!r}: pass a config.json, a model directory, or 'module:function'")


def _from_builder(text: str) -> ModelSpec:
    module_name, _, fn_name = text.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), fn_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {text!r} ({exc}): give 'package.module:function' on the Python path") from exc
    import torch

    with torch.device("meta"):
        built = fn()
    config = getattr(built, "config", built)
    if not hasattr(config, "to_dict") and not isinstance(config, dict):
        raise ValueError(f"{text} returned {type(built).__name__}, which has no Hugging Face config: return a model "
                         "with .config, or a config")
    return from_config(config, name=text)
