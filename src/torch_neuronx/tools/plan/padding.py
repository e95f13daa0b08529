"""Padding policies for a length distribution: pad to the longest, to a multiple of 128, or to optimal buckets.

The lengths come from a file (``--lengths``) or from a dataset's text column
and a tokenizer (:func:`lengths_from_dataset`).

Every distinct padded length is one compiled graph on Neuron; every padding
token is compute spent on nothing. The optimal buckets come from
``torch_neuronx.compile.bucketing.propose_buckets`` (an exact dynamic program
over the sorted lengths); the result is in the form ``pad_batch(buckets=...)``
takes. The throughput effect is the share of real tokens in what is computed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch_neuronx.compile.bucketing import (
    DEFAULT_MULTIPLE,
    BucketPlan,
    evaluate_buckets,
    evaluate_multiple,
    propose_buckets,
)

MAX_LENGTHS_BYTES = 256 << 20  # 256 MiB: tens of millions of lengths, far more than a plan needs


def read_lengths(path: str | Path) -> list[int]:
    """Sequence lengths from a file: one integer per line or whitespace/comma separated, or a flat JSON list."""
    file = Path(path)
    try:
        # a FIFO or a device would block or never end: only a regular file of bounded size is read
        if file.exists() and not file.is_file():
            raise ValueError(f"--lengths {path}: not a regular file; give a file of sequence lengths")
        if file.exists() and file.stat().st_size > MAX_LENGTHS_BYTES:
            raise ValueError(f"--lengths {path}: over {MAX_LENGTHS_BYTES >> 20} MiB; give at most a few million "
                             "lengths (a sample of the data set plans the same)")
        text = file.read_text()
    except FileNotFoundError:
        raise ValueError(f"--lengths {path}: no such file; give a file of sequence lengths") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        text = str(path)
        shown = text if len(text) <= 120 else f"{text[:60]}...{text[-40:]} ({len(text):,} characters)"
        raise ValueError(f"--lengths {shown}: cannot read it as text ({why})") from None
    if text.lstrip()[:1] in ("[", "{"):
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"--lengths {path}: not a valid JSON list ({exc})") from None
        if not isinstance(raw, list):
            raise ValueError(f"--lengths {path}: a JSON {type(raw).__name__}, not a list of lengths like [512, 1024]")
    else:
        raw = text.replace(",", " ").split()
    values: list[int] = []
    for v in raw if isinstance(raw, list) else [raw]:
        n = _whole(v)
        if n is None:
            raise ValueError(f"--lengths {path}: {v!r} is not a whole sequence length; give positive integers, one "
                             "per line or a flat JSON list like [512, 1024]")
        values.append(n)
    if not values or min(values) < 1:
        raise ValueError(f"--lengths {path}: needs at least one length, every length >= 1")
    return values


def _whole(v: object) -> int | None:
    """`v` as an int when it is one exactly (an int, an integral float, or a string of digits), else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v) if math.isfinite(v) and v.is_integer() else None
    if isinstance(v, str) and v.strip().lstrip("+-").isdigit():
        return int(v)
    return None


def lengths_from_dataset(dataset: Any, column: str, tokenizer: Any, batch_size: int = 1000) -> list[int]:
    """Token counts of a text column (a ``datasets.Dataset`` or a list of dicts) under `tokenizer`."""
    names = getattr(dataset, "column_names", None) or (list(dataset[0]) if len(dataset) else [])
    if column not in names:
        raise ValueError(f"the dataset has no column {column!r}; its columns are {names}")
    texts = dataset[column] if hasattr(dataset, "column_names") else [row[column] for row in dataset]
    lengths: list[int] = []
    for start in range(0, len(texts), batch_size):
        encoded = tokenizer(list(texts[start:start + batch_size]), add_special_tokens=True)["input_ids"]
        lengths.extend(len(ids) for ids in encoded)
    return lengths


def lengths_from_files(dataset: str | Path, column: str, tokenizer: str | Path) -> list[int]:
    """:func:`lengths_from_dataset` for a data set on disk (a ``save_to_disk`` directory, or a .json, .jsonl,
    .csv or .parquet file) and a tokenizer directory (``AutoTokenizer.from_pretrained``)."""
    import datasets
    from transformers import AutoTokenizer

    path = Path(dataset)
    if path.is_dir():
        data = datasets.load_from_disk(str(path))
    else:
        kinds = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
        if path.suffix not in kinds or not path.is_file():
            raise ValueError(f"--dataset {dataset}: give a save_to_disk directory or a .json, .jsonl, .csv or "
                             ".parquet file")
        data = datasets.load_dataset(kinds[path.suffix], data_files=str(path), split="train")
    if isinstance(data, datasets.DatasetDict):
        data = data["train"] if "train" in data else next(iter(data.values()))
    try:
        tok = AutoTokenizer.from_pretrained(str(tokenizer))
    except (OSError, ValueError) as exc:
        raise ValueError(f"--tokenizer {tokenizer}: no tokenizer there ({exc})") from None
    return lengths_from_dataset(data, column, tok)


def _policy(name: str, plan: BucketPlan) -> dict[str, Any]:
    return {"name": name, "buckets": list(plan.buckets), "graphs": plan.graphs, "real_tokens": plan.real_tokens,
            "padded_tokens": plan.padded_tokens, "waste": plan.waste_tokens / plan.padded_tokens if plan.padded_tokens
            else 0.0, "throughput_factor": plan.real_tokens / plan.padded_tokens if plan.padded_tokens else 1.0}


def policies(lengths: Sequence[int], max_graphs: int, multiple: int = DEFAULT_MULTIPLE) -> list[dict[str, Any]]:
    """The three policies, each with its buckets, graph count, padded tokens and waste (share of padded tokens).

    ``throughput_factor`` multiplies the useful tokens per second of a step that computes every padded token.
    """
    lengths = list(lengths)
    longest = max(lengths)
    return [
        _policy("pad to max", evaluate_buckets(lengths, [longest])),
        _policy(f"multiple of {multiple}", evaluate_multiple(lengths, multiple)),
        _policy(f"optimal {max_graphs} buckets", propose_buckets(lengths, max_graphs)),
    ]
