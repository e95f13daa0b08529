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

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "config"}
        d["parameters"] = self.total_params
        return d


def from_config(config: Any, name: str | None = None) -> ModelSpec:
    """A spec from a transformers config (Llama, Mistral, Qwen2/3, Mixtral, Qwen-MoE and alike) or its dict."""
    c = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size") if k not in c]
    if missing:
        raise ValueError(f"the model config lacks {', '.join(missing)}: the planner reads decoder-only transformer "
                         "configs (Llama, Mistral, Qwen, Mixtral); pass one with these fields")
    heads = int(c["num_attention_heads"])
    hidden = int(c["hidden_size"])
    experts = int(c.get("num_local_experts") or c.get("num_experts") or 0)
    expert_width = int(c.get("moe_intermediate_size") or c.get("intermediate_size") or 0) if experts else 0
    return ModelSpec(
        name=name or (c.get("_name_or_path") or c.get("model_type") or "model"),
        vocab=int(c["vocab_size"]), hidden=hidden, layers=int(c["num_hidden_layers"]), heads=heads,
        kv_heads=int(c.get("num_key_value_heads") or heads), head_dim=int(c.get("head_dim") or hidden // heads),
        intermediate=0 if experts else int(c.get("intermediate_size") or 4 * hidden), experts=experts,
        experts_per_token=int(c.get("num_experts_per_tok") or 0), expert_intermediate=expert_width,
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        config=config if hasattr(config, "to_dict") else None,
    )


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
        data = json.loads(path.read_text())
        name = path.parent.name if path.name == "config.json" else path.stem
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
