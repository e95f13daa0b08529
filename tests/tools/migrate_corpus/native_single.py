"""Corpus (torch-neuronx migrate): the hand-written native version of xla_single.py, the reference of the test."""
import argparse
import json
import os

import torch
import torch.nn as nn


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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default="out")
    parser.add_argument("--device", default="neuron")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    torch.manual_seed(0)
    device = torch.device(args.device)
    model = MLP().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x, y in batches(args.steps):
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    torch.save({"model": {k: v.cpu() for k, v in model.state_dict().items()}}, os.path.join(args.out, "checkpoint.pt"))
    with open(os.path.join(args.out, "losses_rank0.json"), "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
