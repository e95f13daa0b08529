"""Corpus (torch-neuronx migrate): the hand-written native version of xla_spawn.py / xla_torchrun.py (torchrun,
DDP on the neuron process group), the reference of the 2-rank test."""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from _data import MLP, loader
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default="out")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dist.init_process_group("neuron")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron")
    torch.manual_seed(0)
    model = DDP(MLP().to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in loader(args.steps, rank, world_size):
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    if rank == 0:
        torch.save({k: v.cpu() for k, v in model.module.state_dict().items()}, os.path.join(args.out, "checkpoint.pt"))
    with open(os.path.join(args.out, f"losses_rank{rank}.json"), "w") as f:
        json.dump(losses, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
