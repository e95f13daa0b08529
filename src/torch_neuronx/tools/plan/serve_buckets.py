"""Choose context-encoding and token-generation buckets for a traffic mix, and give every request its bucket.

Why it exists: Neuron's inference stacks compile one graph per bucket; a
request is padded to the smallest bucket that holds it and pays that
bucket's latency. The buckets that waste least are chosen by the training
planner's exact optimiser (``compile.bucketing.propose_buckets``): the
context buckets over the prompt lengths, the token-generation buckets over
prompt + output lengths (the cache a request fills).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from torch_neuronx.compile.bucketing import propose_buckets


@dataclass(frozen=True)
class Buckets:
    context: tuple[int, ...]
    generation: tuple[int, ...]
    why: str

    @property
    def compile_count(self) -> int:
        """Graphs per (batch size, TP degree): one per context bucket, one per token-generation bucket."""
        return len(self.context) + len(self.generation)


def choose(traffic: Sequence[tuple[int, int]], max_buckets: int) -> Buckets:
    """At most `max_buckets` context and `max_buckets` token-generation buckets with the least padding."""
    prompts = [p for p, _ in traffic]
    totals = [p + o for p, o in traffic]
    ctx = propose_buckets(prompts, max_buckets).buckets
    gen = propose_buckets(totals, max_buckets).buckets
    why = (f"auto: the <= {max_buckets} context buckets that pad the {len(prompts)} prompts least, and the "
           f"<= {max_buckets} token-generation buckets that pad their prompt + output lengths least (exact "
           "dynamic programme, compile.bucketing.propose_buckets)")
    return Buckets(tuple(ctx), tuple(gen), why)


def given(lengths: Sequence[int], traffic: Sequence[tuple[int, int]]) -> Buckets:
    """User-given bucket lengths, used for both phases (as ``n_positions`` / NxDI's bucket lists); only the buckets
    some request lands in are compiled. Raises ValueError when a request is longer than the largest."""
    ordered = sorted(set(lengths))
    longest = max(p + o for p, o in traffic)
    if longest > ordered[-1]:
        raise ValueError(f"--buckets: a request needs {longest} tokens (prompt + output) but the largest bucket is "
                         f"{ordered[-1]}; add a bucket >= {longest}")
    ctx = sorted({pick(ordered, p) for p, _ in traffic})
    gen = sorted({pick(ordered, p + o) for p, o in traffic})
    return Buckets(tuple(ctx), tuple(gen), f"given: {ordered} (each request padded to the smallest that holds it)")


def pick(buckets: Sequence[int], length: int) -> int:
    """The smallest bucket >= length (buckets sorted)."""
    return buckets[bisect.bisect_left(buckets, length)]


def padding_waste(traffic: Sequence[tuple[int, int]], b: Buckets) -> dict[str, float]:
    """Share of padded tokens that are padding: of the prompts in context encoding, of the cache in generation."""
    prompts = sum(p for p, _ in traffic)
    padded_prompts = sum(pick(b.context, p) for p, _ in traffic)
    totals = sum(p + o for p, o in traffic)
    padded_totals = sum(pick(b.generation, p + o) for p, o in traffic)
    return {"context": 1 - prompts / padded_prompts, "generation": 1 - totals / padded_totals}


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile: a value some request actually paid (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]
