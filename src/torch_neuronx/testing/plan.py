"""Model configs the planner's tests and docs share: tiny GQA decoders that run in seconds, and Llama-3-8B's shape.

The tiny ones are small enough to run one real training step per layout on
four emulated cores (``torch-neuronx plan --measure``) yet large enough
that weights, optimizer state and activations all count in the peak.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Llama-3-8B's published shape (meta-llama/Meta-Llama-3-8B config.json): GQA, 32 query and 8 key/value heads.
LLAMA3_8B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
             "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "max_position_embeddings": 8192, "rope_theta": 500000.0, "tie_word_embeddings": False}
# Llama-3.1-70B's (meta-llama/Llama-3.1-70B config.json): 80 layers, hidden 8192, 64 query and 8 key/value heads.
LLAMA31_70B = {**LLAMA3_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
               "num_attention_heads": 64, "max_position_embeddings": 131072}


def tiny_llama() -> Any:
    """Llama, 2 layers, hidden 128, 4 query / 2 key-value heads (GQA), vocabulary 256."""
    from torch_neuronx.testing import hf

    return hf.llama_config(max_positions=64, layers=2, hidden=128, heads=4, kv_heads=2, vocab=256)


def tiny_mistral() -> Any:
    """Mistral (another GQA decoder), 2 layers, hidden 128, 8 query / 4 key-value heads."""
    from transformers import MistralConfig

    return MistralConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=64, pad_token_id=0,
                         bos_token_id=2, eos_token_id=3)


# The example outputs of docs/plan.md: each "$ torch-neuronx plan ..." block there is the tool's own output, which
# tests/tools/test_plan_docs.py regenerates from these inputs (the measured lines of a --measure example come from a
# real run and are kept as they are: measuring is a multi-process run, too slow for the example test).
EXAMPLE_MODELS = {"Meta-Llama-3-8B": LLAMA3_8B, "Llama-3.1-70B": LLAMA31_70B}


def example_lengths(n: int = 10_000, seed: int = 0) -> list[int]:
    """A length distribution for the padding example: log-normal, median 666 tokens, capped at 4096."""
    import math
    import random

    rng = random.Random(seed)
    return [max(1, min(4096, round(math.exp(rng.gauss(math.log(666), 0.8))))) for _ in range(n)]


def cli(main: Callable[[list[str]], int | None], argv: list[str], capsys: Any) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of the command line `main` (``torch_neuronx.tools.cli.main``, passed in:
    testing sits below tools) run in this process with `argv`, argparse's exits included; `capsys` is pytest's."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code or 0, out, err


def assert_refused(code: int, out: str, err: str, message: str) -> None:
    """What docs/plan.md promises for bad input: exit 2, nothing on stdout, one line on stderr naming `message`."""
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith("torch-neuronx plan: error: ") and err.count("\n") == 1 and message in err, err
