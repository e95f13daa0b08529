"""Shape bucketing helpers: padding and the bucket proposal (exact against brute force)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from torch_neuronx.compile import bucketing


def test_pad_lists_to_multiple() -> None:
    batch = bucketing.pad_batch([[5, 6, 7], [8, 9]], pad_to_multiple_of=4, pad_token_id=-1)
    assert batch.input_ids.tolist() == [[5, 6, 7, -1], [8, 9, -1, -1]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert bucketing.pad_batch([[1] * 130]).input_ids.shape == (1, 256)  # default: multiple of 128


def test_pad_to_bucket_left() -> None:
    batch = bucketing.pad_batch([[5, 6, 7]], buckets=[2, 8, 4], padding_side="left")
    assert batch.input_ids.tolist() == [[0, 5, 6, 7]]
    assert batch.attention_mask.tolist() == [[0, 1, 1, 1]]
    with pytest.raises(ValueError, match="exceeds the largest bucket 8"):
        bucketing.pad_batch([[1] * 9], buckets=[2, 8])


def test_pad_tensor(dev: torch.device) -> None:
    ids = torch.tensor([[1, 2, 0], [3, 0, 0]], device=dev)
    batch = bucketing.pad_batch(ids, attention_mask=torch.tensor([[1, 1, 0], [1, 0, 0]], device=dev),
                                pad_to_multiple_of=4)
    assert batch.input_ids.device == dev
    assert batch.input_ids.tolist() == [[1, 2, 0, 0], [3, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]
    unmasked = bucketing.pad_batch(torch.ones(2, 5, dtype=torch.long), pad_to_multiple_of=8)
    assert unmasked.input_ids.shape == (2, 8) and unmasked.attention_mask.sum().item() == 10
    assert set(unmasked.as_dict()) == {"input_ids", "attention_mask"}


def test_propose_buckets_is_optimal() -> None:
    rng = random.Random(0)
    for _ in range(150):
        lengths = [rng.randint(1, 40) for _ in range(rng.randint(1, 12))]
        budget = rng.randint(1, 4)
        plan = bucketing.propose_buckets(lengths, budget)
        distinct = sorted(set(lengths))
        best = min(
            bucketing.evaluate_buckets(lengths, [*inner, distinct[-1]]).padded_tokens
            for k in range(min(budget, len(distinct)))
            for inner in itertools.combinations(distinct[:-1], k)
        )
        assert plan.graphs <= budget and plan.padded_tokens == best
        assert plan.padded_tokens == bucketing.evaluate_buckets(lengths, plan.buckets).padded_tokens


def test_plan_reports_waste() -> None:
    plan = bucketing.propose_buckets([10, 10, 20, 30], max_graphs=2)
    assert plan.buckets == (10, 30) and plan.waste_tokens == 10
    assert plan.waste_pct == pytest.approx(100 * 10 / 80)
    assert "2 graph(s) [10, 30]: 10 padding tokens" in str(plan)
    aligned = bucketing.propose_buckets([10, 20, 30], max_graphs=8, multiple_of=16)
    assert aligned.buckets == (16, 32)
    table = bucketing.bucket_table(range(1, 101), (1, 2, 4))
    assert [p.graphs for p in table] == [1, 2, 4]
    assert table[0].waste_pct > table[1].waste_pct > table[2].waste_pct
    assert bucketing.evaluate_multiple([100, 200], 128).buckets == (128, 256)
