"""The main job on its built-in default: train a tiny transformer on the emulated neuron device.

    python examples/train_tiny.py [--steps 20] [--device neuron] [--compare-cpu]

The model and data are made on the spot (nothing is downloaded). With
--compare-cpu the same run repeats on CPU and the losses are compared.
"""

from __future__ import annotations

import argparse
import time

import torch

import torch_neuronx  # noqa: F401  (also autoloaded by `import torch`)


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4, layers: int = 2, seq: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Parameter(torch.zeros(seq, dim))
        layer = torch.nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.body = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(dim, vocab)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        h = self.embed(ids) + self.pos[:n]
        return self.head(self.body(h, mask=self.mask[:n, :n], is_causal=True))


def make_batches(steps: int, batch: int = 8, seq: int = 64, vocab: int = 256) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    # A learnable toy language: each token is the previous one plus a small step.
    start = torch.randint(0, vocab, (steps, batch, 1), generator=g)
    step = torch.randint(1, 4, (steps, batch, 1), generator=g)
    return list((start + step * torch.arange(seq)) % vocab)


def train(device: str, steps: int) -> list[float]:
    torch.manual_seed(0)
    model = TinyLM().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for ids in make_batches(steps):
        ids = ids.to(device)
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="neuron")
    parser.add_argument("--compare-cpu", action="store_true")
    args = parser.parse_args()
    t0 = time.perf_counter()
    losses = train(args.device, args.steps)
    secs = time.perf_counter() - t0
    print(f"device {args.device} ({torch.neuron.get_device_name() if args.device.startswith('neuron') else 'cpu'})")
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {args.steps} steps in {secs:.1f}s")
    if args.device.startswith("neuron"):
        print(f"peak device memory {torch.neuron.max_memory_allocated() / 2**20:.1f} MiB of "
              f"{torch.neuron.get_device_properties().total_memory / 2**30:.0f} GiB")
    if args.compare_cpu:
        ref = train("cpu", args.steps)
        diff = max(abs(a - b) for a, b in zip(losses, ref, strict=True))
        print(f"CPU reference loss {ref[0]:.4f} -> {ref[-1]:.4f}; max |difference| {diff:.2e}")


if __name__ == "__main__":
    main()
