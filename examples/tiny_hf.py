"""Tiny Hugging Face artefacts the HF examples make on the spot: a toy corpus, a tokenizer trained on it, a Llama.

Nothing is downloaded. Imported by the examples beside it (a script's folder is on sys.path).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel, PreTrainedTokenizerFast

WORDS = "the cat sat on mat dog ran to park bird flew over tree".split()


def corpus(n: int) -> list[str]:
    """A learnable toy language: every text walks the word cycle from another start (~25 tokens a text)."""
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(24)) for i in range(n)]


def tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer trained on `corpus`; ids 0-3 are [PAD], [UNK], [BOS], [EOS]."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus(len(WORDS)), trainers.WordLevelTrainer(
        special_tokens=["[PAD]", "[UNK]", "[BOS]", "[EOS]"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                   bos_token="[BOS]", eos_token="[EOS]")


def llama(max_positions: int, hidden: int = 64, heads: int = 4, kv_heads: int = 2) -> PreTrainedModel:
    """A random 2-layer Llama over the tokenizer's ids (seeded: every call gives the same weights)."""
    config = LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=max_positions, pad_token_id=0, bos_token_id=2, eos_token_id=3)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def save_checkpoint(path: str | Path, max_positions: int = 256, **llama_sizes: int) -> None:
    """The tokenizer and a tiny Llama saved to `path`, as a Hub checkpoint would be."""
    tokenizer().save_pretrained(path)
    llama(max_positions, **llama_sizes).save_pretrained(path)
