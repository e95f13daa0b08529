"""What FlexAttention costs on neuron, as ratios to SDPA on the same shapes and the same device.

Causal attention, B=2, H=8, D=64, float32, at two sequence lengths. For each path:
a training step (forward + backward) and an inference forward, timed side by
side with neuron SDPA in alternating rounds (medians), and the peak device
memory the call adds (``torch.neuron.max_memory_allocated`` after a reset),
also as a ratio to SDPA's:

* eager flex: PyTorch's dense implementation of the HOP (full scores);
* compiled flex, training: the dense rewrite (compile/flex.py), fused by Inductor;
* compiled flex, inference: CPU's C++ flash template, block-sparse.

    python benchmarks/bench_attention.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import torch_neuronx  # noqa: F401
from torch_neuronx.testing.bench import interleaved, medians, report

B, H, D = 2, 8, 64


def causal(b: object, h: object, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    return q >= kv


def peak_bytes(fn: Callable[[], object]) -> int:
    torch.neuron.synchronize()
    base = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    fn()
    return torch.neuron.max_memory_allocated() - base


def case(seq: int, quick: bool) -> dict[str, dict[str, float]]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, seq, D, generator=g).to("neuron").requires_grad_() for _ in range(3))
    block_mask = create_block_mask(causal, None, None, seq, seq, device="neuron")
    compiled = torch.compile(flex_attention)

    def train(attn: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def step() -> None:
            attn().sum().backward()
            q.grad = k.grad = v.grad = None
        return step

    def infer(attn: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def step() -> None:
            with torch.no_grad():
                attn()
        return step

    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    eager = lambda: flex_attention(q, k, v, block_mask=block_mask)  # noqa: E731
    comp = lambda: compiled(q, k, v, block_mask=block_mask)  # noqa: E731
    rounds, inner = (3, 1) if quick else (7, 2)
    results: dict[str, dict[str, float]] = {}
    for mode, wrap in (("train", train), ("inference", infer)):
        steps = {"sdpa": wrap(sdpa), "flex eager": wrap(eager), "flex compiled": wrap(comp)}
        times = medians(interleaved(steps, rounds, inner))
        peaks = {name: peak_bytes(step) for name, step in steps.items()}
        for name in steps:
            results[f"seq {seq}, {mode}, {name}"] = {
                "ms": times[name] * 1e3, "time_vs_sdpa": times[name] / times["sdpa"],
                "peak_mib": peaks[name] / 2**20, "memory_vs_sdpa": peaks[name] / max(peaks["sdpa"], 1)}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
    torch.set_num_threads(1)
    results: dict[str, dict[str, float]] = {}
    for seq in (512,) if args.quick else (512, 2048):
        results.update(case(seq, args.quick))
    print(f"{'case':44} {'ms':>9} {'x SDPA':>7} {'peak MiB':>9} {'x SDPA':>7}")
    for name, r in results.items():
        print(f"{name:44} {r['ms']:9.2f} {r['time_vs_sdpa']:7.2f} {r['peak_mib']:9.1f} {r['memory_vs_sdpa']:7.2f}")
    report(results, args.json, show=False)


if __name__ == "__main__":
    main()
