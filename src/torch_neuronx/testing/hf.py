"""Tiny Hugging Face artefacts made on the spot: a toy corpus, a tokenizer trained on it, Llama models, a Flux pipeline.

Nothing is downloaded: the tokenizer is trained in memory with ``tokenizers``,
models are random-initialised (seeded) from configs, datasets are in-memory
lists. The tests, the examples, the benchmarks and the tools all build their
models here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

WORDS = "the cat sat on mat dog ran to park bird flew over tree".split()
SPECIALS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]  # ids 0..3, matching the configs below


def corpus(n: int, words_per_text: int = 24) -> list[str]:
    """A learnable toy language: each text walks the word cycle from a different start (~25 tokens a text)."""
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(words_per_text)) for i in range(n)]


def tokenizer() -> Any:
    """A word-level tokenizer trained on :func:`corpus`, as a transformers tokenizer; ids 0-3 are the specials."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus(len(WORDS)), trainers.WordLevelTrainer(special_tokens=SPECIALS))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                   bos_token="[BOS]", eos_token="[EOS]")


def llama_config(max_positions: int = 256, layers: int = 2, hidden: int = 64, heads: int = 4,
                 kv_heads: int = 2, vocab: int = 256) -> Any:
    """A tiny Llama (GQA: 4 query heads, 2 key/value heads) over the tokenizer's ids."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=max_positions, pad_token_id=0, bos_token_id=2, eos_token_id=3)


def llama(max_positions: int = 256, seed: int = 0, **sizes: int) -> Any:
    """A random tiny Llama (seeded: every call with the same arguments gives the same weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(llama_config(max_positions, **sizes))


def save_checkpoint(path: str | Path, max_positions: int = 256, **sizes: int) -> Path:
    """The tokenizer and a tiny Llama saved to `path`, as a Hub checkpoint would be."""
    tokenizer().save_pretrained(path)
    llama(max_positions, **sizes).save_pretrained(path)
    return Path(path)


def flux_parts() -> dict[str, Any]:
    """The components of a tiny FluxPipeline: MMDiT transformer, CLIP and T5 text encoders, VAE, flow-match scheduler.

    Both tokenizers are the word-level one above, sized to what the pipeline pads to.
    """
    import diffusers
    import torch
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    torch.manual_seed(0)
    transformer = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8])
    clip = CLIPTextModel(CLIPTextConfig(
        vocab_size=256, hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
        projection_dim=32, max_position_embeddings=77, pad_token_id=0, bos_token_id=2, eos_token_id=3))
    t5 = T5EncoderModel(T5Config(vocab_size=256, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                                 pad_token_id=0, eos_token_id=3, decoder_start_token_id=0))
    vae = diffusers.AutoencoderKL(
        sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1, latent_channels=1,
        norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035)
    clip_tokenizer, t5_tokenizer = tokenizer(), tokenizer()
    clip_tokenizer.model_max_length, t5_tokenizer.model_max_length = 77, 32
    return {"transformer": transformer.eval(), "text_encoder": clip.eval(), "text_encoder_2": t5.eval(),
            "vae": vae.eval(), "tokenizer": clip_tokenizer, "tokenizer_2": t5_tokenizer,
            "scheduler": diffusers.FlowMatchEulerDiscreteScheduler()}


FLUX_CALL = {"prompt": ["the cat sat on the mat", "a dog ran to the park"], "height": 32, "width": 32,
             "num_inference_steps": 3, "guidance_scale": 3.5, "max_sequence_length": 32}
