"""Corpus (torch-neuronx migrate): data parallel through xmp.spawn and xm.optimizer_step, XLA style.

xm.optimizer_step all-reduces the gradients and averages them over the processes before stepping.
"""
import argparse
import json
import os

import torch
import torch.nn as nn
import torch_xla.core.xla_model as xm
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr
from _data import MLP, loader


def _mp_fn(index, args):
    device = xm.xla_device()
    rank, world_size = xm.get_ordinal(), xr.world_size()
    torch.manual_seed(0)  # the same initial weights in every process
    model = MLP().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in loader(args.steps, rank, world_size):
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        xm.optimizer_step(optimizer)  # all-reduce + average the gradients, then step
        losses.append(loss.item())
    xm.rendezvous("training_done")
    xm.save(model.state_dict(), os.path.join(args.out, "checkpoint.pt"))  # the master writes
    with open(os.path.join(args.out, f"losses_rank{rank}.json"), "w") as f:
        json.dump(losses, f)
    if xm.is_master_ordinal():
        xm.master_print(f"done: {len(losses)} steps on {world_size} processes")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default="out")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    xmp.spawn(_mp_fn, args=(args,))
