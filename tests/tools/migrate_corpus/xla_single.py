"""Corpus (torch-neuronx migrate): a single-device PyTorch/XLA training script, in the style of the XLA era.

It needs torch_xla only to run on XLA; the migration reads it statically. Synthetic data, a tiny MLP; the
losses go to OUT/losses_rank0.json and the model to OUT/checkpoint.pt (through xm.save).
"""
import argparse
import json
import os

import torch
import torch.nn as nn
import torch_xla.core.xla_model as xm
from torch_xla.amp import syncfree


class MLP(nn.Module):
    def __init__(self, d_in=32, hidden=64, classes=10):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def batches(steps, batch=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        yield torch.randn(batch, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)


def log_step(step, loss):
    if step % 2 == 0:
        print(f"step {step} loss {loss.item():.4f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default="out")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    torch.manual_seed(0)
    device = xm.xla_device()  # XLA: the NeuronCore
    model = MLP().to(device)
    optimizer = syncfree.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step, (x, y) in enumerate(batches(args.steps)):
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        xm.add_step_closure(log_step, args=(step, loss))
        xm.mark_step()  # XLA: cut the graph and run it
        losses.append(loss.item())

    xm.wait_device_ops()
    xm.master_print(f"final loss {losses[-1]:.4f}")
    # xm.save moves the tensors to the CPU before saving
    xm.save({"model": model.state_dict()}, os.path.join(args.out, "checkpoint.pt"))
    with open(os.path.join(args.out, "losses_rank0.json"), "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
