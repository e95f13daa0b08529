"""Tiny configs for every causal-LM architecture in transformers: generic tiny sizes, applied where a config has
the attribute, plus per-architecture overrides where the generic ones do not build."""

from __future__ import annotations

from typing import Any

# Representative families: Llama-likes (RoPE, GQA, RMSNorm), learned/ALiBi
# positions, parallel attention/MLP blocks, partial rotary, tied embeddings.
CI_SUBSET = ["llama", "mistral", "mixtral", "qwen2", "gpt2", "gpt_neox", "phi", "gemma", "opt", "bloom"]

VOCAB = 256

# Generic tiny sizes. A key is applied only where the architecture's config
# has that attribute (directly or through its attribute_map), so one table
# serves naming schemes from GPT-2 (n_embd) to DeepSeek (kv_lora_rank).
GENERIC: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "n_positions": 256,
    # encoder-decoder families used as decoder-only causal LMs
    "d_model": 64,
    "decoder_layers": 2,
    "encoder_layers": 2,
    "decoder_attention_heads": 4,
    "encoder_attention_heads": 4,
    "decoder_ffn_dim": 128,
    "encoder_ffn_dim": 128,
    "ffn_dim": 128,
    "d_ff": 128,
    "n_inner": 128,
    # mixture of experts
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    # multi-head latent attention
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    # state-space / recurrent blocks
    "state_size": 8,
    "mamba_d_state": 8,
    "mamba_n_heads": 4,
    "mamba_d_head": 32,
    "mamba_head_dim": 32,
    "ssm_state_size": 8,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "attention_hidden_size": 64,
    "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": 16,
    "rotary_dim": 8,
    "partial_rotary_factor": 0.5,
    "sliding_window": 32,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# Architecture-specific tiny settings, applied over GENERIC; None removes a
# generic key for that architecture (its config derives the value itself).
OVERRIDES: dict[str, dict[str, Any]] = {
    "mamba": {"head_dim": None},
    "mamba2": {"num_heads": 4, "head_dim": 32, "n_groups": 1, "expand": 2},
    "falcon_mamba": {"head_dim": None},
    "falcon_h1": {"mamba_d_ssm": 128, "mamba_chunk_size": 16},
    "reformer": {"axial_pos_shape": [16, 16], "axial_pos_embds_dim": [32, 32], "attn_layers": ["local", "lsh"],
                 "local_attn_chunk_length": 8, "lsh_attn_chunk_length": 8, "num_buckets": 4, "hidden_size": 64,
                 "feed_forward_size": 128, "attention_head_size": 16, "max_position_embeddings": 256,
                 "is_decoder": True},
    "xlnet": {"d_head": 16, "max_position_embeddings": None},  # no length limit: setting it raises
    "prophetnet": {"num_hidden_layers": None, "num_encoder_layers": 2, "num_decoder_layers": 2},
    "ctrl": {"n_embd": 64, "dff": 128},
    "bigbird_pegasus": {"attention_type": "original_full"},
    "big_bird": {"attention_type": "original_full"},
    "recurrent_gemma": {"lru_width": 64, "block_types": ["recurrent", "attention"], "attention_window_size": 32},
    "xmod": {"default_language": "en_XX"},
    "xlstm": {"embedding_dim": 64, "num_blocks": 2, "num_heads": 4, "chunk_size": 8, "qk_dim_factor": 1.0},
    # Hybrid stacks: the two tiny layers must include an attention layer.
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "bamba": {"attn_layer_indices": [1]},
    "zamba": {"num_hidden_layers": 4, "attn_layer_period": 2, "attn_layer_offset": 1, "attention_hidden_size": 128,
              "attention_head_dim": 32, "mamba_expand": 2},
    "zamba2": {"hybrid_layer_ids": [1], "attention_hidden_size": 128, "attention_head_dim": 32},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    "zaya": {"num_experts_per_tok": 1},
    "gemma3n_text": {"num_kv_shared_layers": 0, "vocab_size_per_layer_input": VOCAB,
                     "hidden_size_per_layer_input": 16},
    "gemma4_assistant": {"hidden_size_per_layer_input": 0},
    "cohere_compass_text": {"partial_rotary_factor": None,
                            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    # Sparse-attention indexers; their attention wants as many KV heads as query heads.
    "deepseek_v32": {"index_head_dim": 16, "index_n_heads": 4, "index_topk": 8, "num_key_value_heads": 4},
    "glm_moe_dsa": {"index_head_dim": 16, "index_n_heads": 4, "index_topk": 8, "num_key_value_heads": 4},
    "axk2": {"index_head_dim": 16, "index_n_heads": 4, "index_topk": 8, "num_key_value_heads": 4},
    "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8,
                       "indexer_compress_ratio": 2},
    "dots3_note_text": {"num_key_value_heads": 4},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    "musicgen": {"num_codebooks": 2},
    "musicgen_melody": {"num_codebooks": 2},
    "dbrx": {"d_model": 64, "n_heads": 4, "n_layers": 2, "max_seq_len": 256,
             "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
             "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2}},
    "blt": {"encoder_hash_byte_group_vocab": 512, "max_position_embeddings": 256},
}


def tiny_config(model_type: str) -> Any:
    """A tiny config of `model_type`: GENERIC sizes (where the config has the attribute) plus OVERRIDES."""
    # The causal-LM class's own config class: for composite families (MusicGen)
    # it is the decoder's config, not the one AutoConfig returns for the type.
    explicit = OVERRIDES.get(model_type, {})
    config_class = model_class(model_type).config_class
    try:
        default = config_class()
    except Exception:  # a few defaults do not validate on their own (gemma4_assistant)
        default = config_class(**explicit)
    kwargs = _size_kwargs(default, explicit)
    # Composite configs (text + vision/audio towers, DBRX's attn/ffn parts): the
    # towers are built with the model even when only text is fed, so shrink them too.
    for name in getattr(default, "sub_configs", {}) or {}:
        sub = getattr(default, name, None)
        if sub is not None and name not in explicit:
            kwargs[name] = _shrink_sub(sub)
    return _build(type(default), kwargs, default)


def model_class(model_type: str) -> Any:
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])


def _size_kwargs(config: Any, explicit: dict[str, Any]) -> dict[str, Any]:
    wanted = {**GENERIC, **explicit}
    # Read-only properties (FalconConfig.head_dim) are derived: setting them raises.
    kwargs = {k: v for k, v in wanted.items()
              if v is not None and (k in explicit or (_has(config, k) and not _is_property(config, k)))}
    # Multi-head latent attention: the rotary part of a head is qk_rope_head_dim wide.
    if "qk_rope_head_dim" in kwargs and "head_dim" in kwargs and "head_dim" not in explicit:
        kwargs["head_dim"] = kwargs["qk_rope_head_dim"]
    return kwargs


def _shrink_sub(sub: Any) -> Any:
    # Start from the composite's own defaults for the tower (image size, patch
    # size, projector shapes must stay consistent), change only the sizes.
    depth = getattr(sub, "num_hidden_layers", None)
    base = {k: v for k, v in sub.to_dict().items() if k not in ("model_type", "transformers_version", "architectures")}
    base = {k: v for k, v in base.items() if not (isinstance(v, list) and isinstance(depth, int) and len(v) == depth)}
    kwargs = _size_kwargs(sub, OVERRIDES.get(getattr(sub, "model_type", ""), {}))
    try:
        return type(sub)(**{**base, **kwargs})
    except Exception:
        return _build(type(sub), kwargs, sub)


def _build(cls: Any, kwargs: dict[str, Any], default: Any) -> Any:
    try:
        layers = getattr(default, "num_hidden_layers", None)
    except RuntimeError:
        layers = None
    # Per-layer lists of the default depth (layer_types, MLP kinds, block
    # patterns) are cut to the tiny depth keeping one layer of each kind: a
    # list recomputed for 2 layers would often keep only the linear/SSM kind.
    cuts = {k: v for k, v in _cut_layer_lists(default, layers, kwargs.get("num_hidden_layers")).items()
            if k not in kwargs}
    for attempt in ({**kwargs, **cuts}, kwargs):
        try:
            return cls(**attempt)
        except Exception as exc:
            error = exc
    raise error


def _has(config: Any, name: str) -> bool:
    try:
        getattr(config, name)
    except AttributeError:
        return False
    except RuntimeError:
        # Per-layer configs (heterogeneous stacks) refuse a global read of a
        # per-layer attribute: it exists, and a global value sets every layer.
        return True
    return True


def _is_property(config: Any, name: str) -> bool:
    attr = getattr(type(config), name, None)
    return isinstance(attr, property) and attr.fset is None


def _cut_layer_lists(config: Any, old: int | None, new: int | None) -> dict[str, Any]:
    if not isinstance(old, int) or not isinstance(new, int):
        return {}
    return {k: _sample_pattern(v, new) for k, v in vars(config).items()
            if isinstance(v, list) and len(v) == old and k != "architectures"}


def _sample_pattern(values: list[Any], n: int) -> list[Any]:
    """n entries of a per-layer list keeping its variety (a hybrid stack keeps one layer of each kind)."""
    distinct: list[Any] = []
    for v in values:
        if v not in distinct:
            distinct.append(v)
    if len(distinct) >= n:
        return distinct[:n]
    return values[: n - len(distinct)] + distinct
