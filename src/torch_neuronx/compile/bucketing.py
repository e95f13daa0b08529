"""Shape bucketing: pad variable-length batches to a few fixed sizes.

Neuron graphs have static shapes, so every distinct sequence length compiles
a new graph. Padding each batch up to a multiple of 128 (what TRL does on
Neuron) or to the nearest of a few bucket lengths bounds the number of graphs;
:func:`propose_buckets` picks the bucket lengths that waste the least padding
for a given number of graphs, from the lengths of your data set.

    >>> batch = pad_batch([[5, 6, 7], [8, 9]], pad_to_multiple_of=4)
    >>> batch.input_ids.shape, batch.attention_mask.tolist()
    (torch.Size([2, 4]), [[1, 1, 1, 0], [1, 1, 0, 0]])
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

DEFAULT_MULTIPLE = 128  # TRL's pad_to_multiple_of on Neuron


class PaddedBatch(NamedTuple):
    input_ids: torch.Tensor  # (batch, padded length)
    attention_mask: torch.Tensor  # 1 for real tokens, 0 for padding

    def as_dict(self) -> dict[str, torch.Tensor]:
        """For ``model(**batch.as_dict())``."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}


def bucket_length(length: int, *, pad_to_multiple_of: int | None = DEFAULT_MULTIPLE,
                  buckets: Sequence[int] | None = None) -> int:
    """The padded length for `length`: the smallest bucket that fits, or the next multiple."""
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    if buckets:
        ordered = sorted(buckets)
        i = bisect.bisect_left(ordered, length)
        if i == len(ordered):
            raise ValueError(
                f"sequence length {length} exceeds the largest bucket {ordered[-1]}: add a larger bucket "
                "or truncate the inputs"
            )
        return ordered[i]
    if pad_to_multiple_of is None or pad_to_multiple_of <= 1:
        return length
    return max(pad_to_multiple_of, -(-length // pad_to_multiple_of) * pad_to_multiple_of)


def pad_batch(sequences: Sequence[Sequence[int]] | torch.Tensor, *,
              pad_to_multiple_of: int | None = DEFAULT_MULTIPLE, buckets: Sequence[int] | None = None,
              pad_token_id: int = 0, attention_mask: torch.Tensor | None = None, padding_side: str = "right",
              device: torch.device | str | None = None) -> PaddedBatch:
    """Pad a batch to a bucketed length; returns ``input_ids`` and ``attention_mask``.

    `sequences` is a list of token-id lists, or a 2-D tensor (with its
    `attention_mask`, if it is already padded). With `buckets`, the length is
    the smallest bucket that fits the longest sequence; otherwise the next
    multiple of `pad_to_multiple_of`. `padding_side` is "right" (training) or
    "left" (generation).
    """
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    if isinstance(sequences, torch.Tensor):
        if sequences.dim() != 2:
            raise ValueError(f"expected a 2-D tensor (batch, length), got shape {tuple(sequences.shape)}")
        ids = sequences
        mask = attention_mask if attention_mask is not None else torch.ones_like(ids)
        device = ids.device if device is None else device
        rows = [(ids[i][mask[i].bool()].tolist()) for i in range(ids.shape[0])] if attention_mask is not None \
            else None
        if rows is None:
            target = bucket_length(ids.shape[1], pad_to_multiple_of=pad_to_multiple_of, buckets=buckets)
            extra = target - ids.shape[1]
            pad = (extra, 0) if padding_side == "left" else (0, extra)
            return PaddedBatch(
                torch.nn.functional.pad(ids, pad, value=pad_token_id).to(device),
                torch.nn.functional.pad(mask.to(torch.long), pad, value=0).to(device),
            )
        sequences = rows
    lengths = [len(s) for s in sequences]
    target = bucket_length(max(lengths, default=0), pad_to_multiple_of=pad_to_multiple_of, buckets=buckets)
    ids = torch.full((len(sequences), target), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), target), dtype=torch.long)
    for row, (seq, n) in enumerate(zip(sequences, lengths, strict=True)):
        span = slice(target - n, target) if padding_side == "left" else slice(0, n)
        ids[row, span] = torch.as_tensor(list(seq), dtype=torch.long)
        mask[row, span] = 1
    return PaddedBatch(ids.to(device), mask.to(device))


@dataclass(frozen=True)
class BucketPlan:
    """Bucket lengths for a data set and the padding they cost."""

    buckets: tuple[int, ...]
    real_tokens: int
    padded_tokens: int  # tokens after padding every sequence to its bucket

    @property
    def graphs(self) -> int:
        return len(self.buckets)

    @property
    def waste_tokens(self) -> int:
        return self.padded_tokens - self.real_tokens

    @property
    def waste_pct(self) -> float:
        """Padding as a share of the padded tokens (compute spent on padding)."""
        return 100.0 * self.waste_tokens / self.padded_tokens if self.padded_tokens else 0.0

    def __str__(self) -> str:
        return (f"{self.graphs} graph(s) {list(self.buckets)}: {self.waste_tokens} padding tokens "
                f"({self.waste_pct:.1f}% of {self.padded_tokens})")


def evaluate_buckets(lengths: Iterable[int], buckets: Sequence[int]) -> BucketPlan:
    """The padding cost of padding each length to the smallest bucket that fits (only buckets used count)."""
    lengths = list(lengths)
    ordered = sorted(set(buckets))
    used = sorted({bucket_length(n, buckets=ordered) for n in lengths})
    padded = sum(bucket_length(n, buckets=ordered) for n in lengths)
    return BucketPlan(tuple(used), sum(lengths), padded)


def evaluate_multiple(lengths: Iterable[int], multiple: int = DEFAULT_MULTIPLE) -> BucketPlan:
    """The padding cost (and number of graphs) of padding to a multiple, as ``pad_to_multiple_of`` does."""
    lengths = list(lengths)
    padded = [bucket_length(n, pad_to_multiple_of=multiple) for n in lengths]
    return BucketPlan(tuple(sorted(set(padded))), sum(lengths), sum(padded))


def propose_buckets(lengths: Iterable[int], max_graphs: int, *, multiple_of: int = 1) -> BucketPlan:
    """The at most `max_graphs` bucket lengths with the least padding for these sequence lengths.

    Exact: dynamic programming over the sorted distinct lengths (each bucket
    ends at a length of the data, the last at the longest). `multiple_of`
    restricts buckets to multiples of it (e.g. 8 or 128, for hardware-friendly tiles).
    """
    if max_graphs < 1:
        raise ValueError(f"max_graphs must be >= 1, got {max_graphs}")
    lengths = list(lengths)
    if not lengths:
        return BucketPlan((), 0, 0)
    step = max(1, multiple_of)
    groups = Counter(-(-n // step) * step for n in lengths)
    values = np.array(sorted(groups), dtype=np.int64)
    counts = np.array([groups[v] for v in values], dtype=np.int64)
    m, k_max = len(values), min(max_graphs, len(values))
    count_prefix = np.concatenate(([0], np.cumsum(counts)))
    # cost[k][j]: least padded tokens covering values[:j+1] with k+1 buckets, the last at values[j].
    # A bucket at values[j] serving values[i+1..j] pads them to values[j] * (their count).
    inf = np.iinfo(np.int64).max // 4
    cost = np.full((k_max, m), inf, dtype=np.int64)
    choice = np.zeros((k_max, m), dtype=np.int64)
    cost[0] = values * count_prefix[1:]
    for k in range(1, k_max):
        for j in range(k, m):
            i = np.arange(k - 1, j)  # previous bucket at values[i]
            candidates = cost[k - 1, i] + values[j] * (count_prefix[j + 1] - count_prefix[i + 1])
            best = int(np.argmin(candidates))
            cost[k, j], choice[k, j] = candidates[best], i[best]
    k_best = int(np.argmin(cost[:, m - 1]))
    buckets, j = [], m - 1
    for k in range(k_best, -1, -1):
        buckets.append(int(values[j]))
        j = int(choice[k, j])
    return BucketPlan(tuple(sorted(buckets)), sum(lengths), int(cost[k_best, m - 1]))


def bucket_table(lengths: Iterable[int], max_graphs: Sequence[int] = (1, 2, 4, 8, 16), *,
                 multiple_of: int = 1) -> list[BucketPlan]:
    """:func:`propose_buckets` for each graph budget, to choose the trade-off."""
    lengths = list(lengths)
    return [propose_buckets(lengths, k, multiple_of=multiple_of) for k in max_graphs]
