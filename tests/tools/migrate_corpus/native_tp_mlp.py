"""Corpus (torch-neuronx migrate): the hand-written native version of nxd_tp_mlp.py (DTensor tensor parallel on a
("dp", "tp") neuron mesh), the reference of the 2-rank test."""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class TPMLP(nn.Module):
    def __init__(self, d=32, hidden=64, classes=8):
        super().__init__()
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default="out")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dist.init_process_group("neuron")
    mesh = init_device_mesh("neuron", (dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "tp"))
    device = torch.device("neuron")
    torch.manual_seed(0)
    model = parallelize_module(TPMLP().to(device), mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(args.steps):
        x, y = torch.randn(8, 32, generator=g), torch.randint(0, 8, (8,), generator=g)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    with open(os.path.join(args.out, f"losses_rank{mesh['tp'].get_local_rank()}.json"), "w") as f:
        json.dump(losses, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
