"""Read the model to plan: a Hugging Face config.json or model directory, a config object, or ``module:function``.

The planner needs shapes, not weights: hidden size, layers, heads and KV
heads (GQA), MLP width, vocabulary, experts (MoE) and whether the embeddings
are tied. ``module:function`` builds the model (on the meta device, so a
70B model costs nothing) and reads its config and parameter count.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import asdict, dataclass, replace
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
    max_positions: int = 0  # max_position_embeddings: the longest sequence it serves (0: the config does not say)
    config: Any = None  # the transformers config, when there is one (for --measure)
    raw: Any = None  # the config.json's fields, when read without transformers (for --measure)

    def kv_replication(self, tp: int) -> int:
        """How many TP ranks hold each key/value head: 1 when TP divides the KV heads, else TP / KV heads.

        NeuronX Distributed (and Megatron) replicate KV heads when TP exceeds their number: each rank holds the one
        KV head its query heads use (``GQAQKVColumnParallelLinear(kv_size_multiplier=...)``,
        aws-neuron/neuronx-distributed src/neuronx_distributed/modules/qkv_linear.py: the K and V weights repeated
        ``kv_size_multiplier`` times before the TP split, the gradients of their outputs all-reduced over the
        "KV shared group" in backward)."""
        return tp // self.kv_heads if tp > self.kv_heads and tp % self.kv_heads == 0 else 1

    def replicated(self, tp: int) -> ModelSpec:
        """The shapes one TP group runs at degree `tp`: the KV heads repeated :meth:`kv_replication` times (what
        each rank stores, computes and saves for backward is then the replicated model's 1/TP)."""
        k = self.kv_replication(tp)
        return self if k == 1 else replace(self, kv_heads=self.kv_heads * k)

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
    _check_dimensions_given(c)
    _check_boolean(c, "tie_word_embeddings")
    model_type = c.get("model_type")
    if model_type and model_type not in MODELLED_TYPES:
        raise ValueError(f"model_type {model_type!r} is not a model the planner models: it counts decoder-only "
                         "transformers with a gated (SwiGLU) MLP and RMSNorm, the model types "
                         f"{', '.join(MODELLED_TYPES)}; its figures for another architecture would be wrong")
    if not (c.get("num_local_experts") or c.get("num_experts")) and c.get("intermediate_size") is None:
        # no guess: a 4 x hidden MLP would make a Llama-2-7B shape 8.85B parameters
        raise ValueError("the model config has no intermediate_size (the MLP width) and no model_type whose "
                         "default Transformers would fill in: add intermediate_size (or model_type)")
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
        intermediate=0 if experts else _count(c, "intermediate_size"), experts=experts,
        experts_per_token=_count(c, "num_experts_per_tok", 0), expert_intermediate=expert_width,
        tied_embeddings=c.get("tie_word_embeddings") is True, max_positions=_max_positions(c),
        config=config if hasattr(config, "to_dict") else None, raw=raw,
    )
    if spec.total_params > MAX_PARAMETERS:
        raise ValueError(f"the model config describes {spec.total_params:.3g} parameters, more than the planner's "
                         f"limit of {MAX_PARAMETERS:.0e} (100x the largest published model): check the sizes")
    if experts and not (1 <= spec.experts_per_token <= experts and expert_width >= 1):
        raise ValueError(f"the MoE config needs 1 <= num_experts_per_tok <= {experts} experts and an expert width "
                         f"(moe_intermediate_size or intermediate_size); it has num_experts_per_tok="
                         f"{spec.experts_per_token}, width {expert_width}")
    return spec


# The architectures whose shapes ModelSpec counts right: decoder-only, SwiGLU MLP (3 matrices), RMSNorm, no shared
# experts. GPT-NeoX (2-matrix GELU MLP, LayerNorm with biases) would count 27.2B for its 20.55B; BERT 434M for 335M.
MODELLED_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe")

# Sizes beyond these describe no trainable model: refused, so the arithmetic never prints nonsense (2^40 everywhere
# would be 9.3e27 parameters). The largest published dense and MoE models are about 2e12 parameters.
MAX_PARAMETERS = 10 ** 14
MAX_CONFIG_BYTES = 64 << 20  # config.json files are a few KiB
_LIMIT = 1 << 40  # no real model has a dimension near this; beyond it the arithmetic only produces nonsense


def _count(c: dict[str, Any], key: str, default: int | None = None) -> int:
    """A whole, positive dimension from a config (`default` when absent or null; 0 allowed only as the default)."""
    value = c.get(key)
    if value is None:
        if default is None:
            raise ValueError(f"the model config lacks {key}")
        return default
    high = _BOUNDS.get(key, _LIMIT)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= high \
            or value != int(value):
        raise ValueError(f"the model config has {key}={value!r}: it must be a whole number between 1 and {high:,}")
    return int(value)


# Per-dimension bounds, each far above every published model (Llama-3.1-405B: 126 layers, hidden 16,384, MLP 53,248;
# Gemma: vocabulary 256,000) and below where the figures stop meaning anything (2^40 layers of hidden 1 plan as
# 9.9e12 parameters under MAX_PARAMETERS)
_BOUNDS = {"num_hidden_layers": 10_000, "hidden_size": 1 << 20, "vocab_size": 1 << 24, "intermediate_size": 1 << 22,
           "moe_intermediate_size": 1 << 22, "num_attention_heads": 1 << 14, "num_key_value_heads": 1 << 14,
           "head_dim": 1 << 14, "num_local_experts": 1 << 14, "num_experts": 1 << 14, "num_experts_per_tok": 1 << 14}


# Where configs keep their longest sequence: Llama/Mistral/Qwen (max_position_embeddings), GPT-2 (n_positions),
# others (max_sequence_length, seq_length)
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
# Integer fields checked before transformers sees a config: it divides by some (0 heads -> ZeroDivisionError)
# and rejects strings with a many-line traceback
_INTEGER_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "intermediate_size", "num_local_experts", "num_experts", "num_experts_per_tok",
                 "moe_intermediate_size", *_POSITION_KEYS)


def _max_positions(c: dict[str, Any]) -> int:
    """The longest sequence (prompt + output) the model's position embeddings cover; 0 when the config does not
    say."""
    for key in _POSITION_KEYS:
        if c.get(key) is not None:
            return _count(c, key)
    return 0


def check_fields(data: dict[str, Any]) -> None:
    """Raise ValueError (one line) for a config field the planner reads that is not a whole positive number, or a
    head count that does not divide, or a flag that is not a JSON boolean; before transformers builds a config from
    it."""
    for key in _INTEGER_KEYS:
        if data.get(key) is not None and not (key in ("num_local_experts", "num_experts") and data[key] == 0):
            _count(data, key)
    for key in _BOOLEAN_KEYS:
        _check_boolean(data, key)


# The dimensions a config.json must name itself: Transformers' config classes would fill in defaults of their own
# (LlamaConfig: hidden 4096, 32 layers, 32 heads, vocabulary 32000), which are another model's sizes (NxD's
# Llama-3-70B config.json without hidden_size would plan as 32.26B parameters)
REQUIRED_DIMENSIONS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# Flags the planner reads: a string such as "false" is truthy in Python, so only JSON booleans are accepted
_BOOLEAN_KEYS = ("tie_word_embeddings",)


def _check_dimensions_given(c: dict[str, Any]) -> None:
    """Raise ValueError naming the dimensions the config lacks (absent or null)."""
    missing = [k for k in REQUIRED_DIMENSIONS if c.get(k) is None]
    if c.get("num_local_experts") or c.get("num_experts"):
        if c.get("num_experts_per_tok") is None:
            missing.append("num_experts_per_tok")
    if missing:
        raise ValueError(f"the model config lacks {', '.join(missing)}: the planner reads decoder-only transformer "
                         "configs (Llama, Mistral, Qwen, Mixtral) and fills in no sizes; add these fields")


def _check_boolean(c: dict[str, Any], key: str) -> None:
    value = c.get(key)
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"the model config has {key}={value!r}: it must be true or false (a JSON boolean)")


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
    if not isinstance(model_type, str):
        raise ValueError(f"the model config has model_type={model_type!r}: it must be a name such as 'llama'")
    try:
        return AutoConfig.for_model(model_type, **data)
    except Exception as exc:  # transformers' own checks: unknown model_type, bad field values; one line
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ValueError(f"transformers cannot build a {model_type} config from it ({type(exc).__name__}: "
                         f"{first[:200]})") from None


def load(spec: str | Path | Any) -> ModelSpec:
    """Read a model spec: a config object, a config.json, a model directory, or ``module:function``."""
    if isinstance(spec, ModelSpec):
        return spec
    if not isinstance(spec, str | Path):
        return from_config(spec)
    text = str(spec)
    if not text.strip():
        raise ValueError("MODEL is empty: give a config.json, a model directory or module:function")
    path = Path(text)
    try:
        path.stat()  # a path the system refuses (longer than PATH_MAX, a symlink loop) says so here, in one line
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:
        shown = text if len(text) <= 120 else f"{text[:60]}...{text[-40:]} ({len(text):,} characters)"
        raise ValueError(f"cannot read MODEL {shown}: {exc.strerror or exc}") from None
    if path.is_dir():
        path = path / "config.json"
        if not path.exists():
            raise ValueError(f"{spec} is a directory without config.json: pass a Hugging Face model directory")
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            raise ValueError(f"no such config file: {path}")
        if not path.is_file() or path.stat().st_size > MAX_CONFIG_BYTES:  # a FIFO or /dev/zero would never end
            raise ValueError(f"{path} is not a config.json (not a regular file, or over "
                             f"{MAX_CONFIG_BYTES >> 20} MiB)")
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise ValueError(f"cannot read the model config {path} as JSON ({type(exc).__name__}: "
                             f"{(str(exc).splitlines() or [''])[0][:200]})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} holds a JSON {type(data).__name__}, not a config object")
        check_fields(data)
        _check_dimensions_given(data)  # before transformers fills in its defaults, which are another model's
        moe = data.get("num_local_experts") or data.get("num_experts")
        if data.get("model_type") in MODELLED_TYPES and not moe and data.get("intermediate_size") is None:
            # Transformers would fill in its default (LlamaConfig: 11008, a Llama-3.1-70B would plan as 35.8B)
            raise ValueError(f"{path} has no intermediate_size (the MLP width): Transformers would fill in its "
                             f"{data['model_type']} default, which is another model's; add intermediate_size")
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
    except (Exception, SystemExit) as exc:  # the module itself fails: raises at import, a SyntaxError, sys.exit()
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"cannot import {text!r}: importing {module_name} raised {type(exc).__name__}"
                         f"{': ' + first if first else ''}") from None
    if not callable(fn):
        raise ValueError(f"{text} is a {type(fn).__name__}, not a function: give 'package.module:function' naming a "
                         "function that returns a model or a config")
    import torch

    try:
        with torch.device("meta"):
            built = fn()
    except SystemExit as exc:  # sys.exit() / exit() inside the builder: it must not end the planner with status 0
        raise ValueError(f"{text}() raised SystemExit({exc.code!r}): a builder must return a model or a config, "
                         "not exit") from None
    except Exception as exc:  # the user's builder: whatever it raises, in one line
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"{text}() raised {type(exc).__name__}{': ' + first if first else ''}") from None
    config = getattr(built, "config", built)
    if not hasattr(config, "to_dict") and not isinstance(config, dict):
        raise ValueError(f"{text} returned {type(built).__name__}, which has no Hugging Face config: return a model "
                         "with .config, or a config")
    return from_config(config, name=text)
