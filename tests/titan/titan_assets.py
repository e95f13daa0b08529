"""The two asset folders TorchTitan's llama3 debugmodel reads, made on the spot (nothing is downloaded).

``llama3_debugmodel`` reads ``./tests/assets/tokenizer`` (``tokenizer.json`` + ``tokenizer_config.json``) and the
``c4_test`` dataset at ``./tests/assets/c4_test``, both relative to the working directory and neither shipped in
the torchtitan wheel. This writes them under ``ROOT``:

* a word-level tokenizer over ``w0`` ... ``w199`` plus ``<pad> <unk> <bos> <eos>`` (204 ids, within the
  debugmodel's vocabulary of 2048);
* ``steps x global_batch`` documents of ``seq_len - 1`` random words. TorchTitan wraps each in ``<bos>``/``<eos>``
  and packs the stream into samples of ``seq_len`` inputs, so each document is exactly one sample. The data
  file is ordered for the data-parallel degree ``dp`` so that every run of the same global batch size sees the
  same global batches whatever ``dp`` is: ``datasets.distributed.split_dataset_by_node`` gives DP rank ``r``
  the ``r``-th contiguous chunk of the file, and step ``s`` takes the next ``local_batch`` samples of it.

Usage: ``python tests/titan/titan_assets.py ROOT --seq-len 256 --global-batch 4 --steps 3 --dp 2``
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

WORDS = [f"w{i}" for i in range(200)]
SPECIALS = ["<pad>", "<unk>", "<bos>", "<eos>"]


def write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=SPECIALS))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def global_batches(seq_len: int, global_batch: int, steps: int, seed: int = 0) -> list[list[str]]:
    """``steps`` global batches of ``global_batch`` documents, each ``seq_len - 1`` words."""
    rng = random.Random(seed)
    return [[" ".join(rng.choice(WORDS) for _ in range(seq_len - 1)) for _ in range(global_batch)]
            for _ in range(steps)]


def dataset_order(batches: list[list[str]], dp: int) -> list[str]:
    """The file order in which DP rank ``r`` reads, at step ``s``, its slice ``r`` of global batch ``s``."""
    global_batch = len(batches[0])
    if global_batch % dp:
        raise ValueError(f"global batch {global_batch} is not divisible by dp {dp}")
    local = global_batch // dp
    return [doc for r in range(dp) for batch in batches for doc in batch[r * local:(r + 1) * local]]


def write_assets(root: Path, seq_len: int, global_batch: int, steps: int, dp: int, seed: int = 0) -> Path:
    """Writes ``root/tests/assets/{tokenizer,c4_test}``; returns ``root``, the working directory to train in."""
    assets = Path(root) / "tests" / "assets"
    write_tokenizer(assets / "tokenizer")
    docs = dataset_order(global_batches(seq_len, global_batch, steps, seed), dp)
    (assets / "c4_test").mkdir(parents=True, exist_ok=True)
    with open(assets / "c4_test" / "data.json", "w") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}) + "\n")
    return Path(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--global-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write_assets(args.root, args.seq_len, args.global_batch, args.steps, args.dp, args.seed)


if __name__ == "__main__":
    main()
