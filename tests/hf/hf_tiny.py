"""Tiny Hugging Face artefacts made on the spot: a tokenizer, a Llama config, a learnable text corpus.

Nothing is downloaded: the tokenizer is trained in memory with `tokenizers`,
models are random-initialised from configs, datasets are in-memory lists.
"""

from __future__ import annotations

from typing import Any

WORDS = "the cat sat on mat dog ran to park bird flew over tree".split()
SPECIALS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]  # ids 0..3, matching the config below


def corpus(n: int, words_per_text: int = 24) -> list[str]:
    """A learnable toy language: each text walks the word cycle from a different start."""
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(words_per_text)) for i in range(n)]


def tokenizer() -> Any:
    """A word-level tokenizer trained on `corpus`, wrapped as a transformers tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus(len(WORDS)), trainers.WordLevelTrainer(special_tokens=SPECIALS))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                   bos_token="[BOS]", eos_token="[EOS]")


def llama_config(max_positions: int = 256, layers: int = 2) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                       pad_token_id=0, bos_token_id=2, eos_token_id=3)


def llama(max_positions: int = 256, seed: int = 0, layers: int = 2) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(llama_config(max_positions, layers))


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
