"""Corpus (torch-neuronx migrate): data parallel under torchrun with the 'xla' process group and MpDeviceLoader."""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.xla_backend  # noqa: F401  (registers the 'xla' backend)
import torch_xla.runtime as xr
from _data import MLP, loader

dist.init_process_group("xla", init_method="xla://")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default="out")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    device = torch_xla.device()
    rank = xr.global_ordinal()
    torch.manual_seed(0)
    model = MLP().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader = pl.MpDeviceLoader(loader(args.steps, rank, xr.world_size()), device)
    losses = []
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        xm.optimizer_step(optimizer)
        losses.append(loss.item())
    xm.save(model.state_dict(), os.path.join(args.out, "checkpoint.pt"))
    with open(os.path.join(args.out, f"losses_rank{rank}.json"), "w") as f:
        json.dump(losses, f)


if __name__ == "__main__":
    main()
