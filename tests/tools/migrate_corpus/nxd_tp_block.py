"""Corpus (torch-neuronx migrate): an NxD-style transformer block whose options are given the ways NxD's examples
give them, for the TP = 2 against TP = 1 check (`migrate --tp-invariance 2`).

- a vocabulary-parallel embedding with a padding index given positionally (its row must get no gradient; NxD
  pads only with a positive index, and does not zero the row at initialisation);
- a fused QKV projection with the output gathered (positional bias and gather_output), split into q, k, v;
- an output projection with skip_bias_add=True (NxD returns the bias for the caller to add);
- a gate/up MLP whose hidden dimension stays sharded (gather_output=False, input_is_parallel=True);
- a vocabulary head gathered for the loss.

    torchrun --nproc-per-node 2 nxd_tp_block.py --steps 3
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch_xla.core.xla_model as xm
from neuronx_distributed.parallel_layers import parallel_state
from neuronx_distributed.parallel_layers.layers import ColumnParallelLinear, ParallelEmbedding, RowParallelLinear

VOCAB, D, HEADS, HIDDEN, PAD = 16, 8, 2, 16, 1


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = ParallelEmbedding(VOCAB, D, 1)  # PAD, positionally (NxD: 0 would mean no padding)
        self.qkv = ColumnParallelLinear(D, 3 * D, False, True)
        self.o = RowParallelLinear(D, D, bias=True, input_is_parallel=False, skip_bias_add=True)
        self.gate = ColumnParallelLinear(D, HIDDEN, bias=False, gather_output=False)
        self.up = ColumnParallelLinear(D, HIDDEN, bias=False, gather_output=False)
        self.down = RowParallelLinear(HIDDEN, D, False, True)
        self.head = ColumnParallelLinear(D, VOCAB, bias=False, gather_output=True)

    def forward(self, tokens):
        x = self.embed(tokens)
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, HEADS, D // HEADS).transpose(1, 2) for t in self.qkv(x).split(D, dim=-1))
        attn = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out, bias = self.o(attn.transpose(1, 2).reshape(b, s, D))
        x = x + out + bias
        x = x + self.down(nn.functional.silu(self.gate(x)) * self.up(x))
        return self.head(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("xla")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    device = xm.xla_device()
    torch.manual_seed(0)
    model = Block().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        tokens = torch.randint(0, VOCAB, (2, 6), generator=g)
        tokens[:, -2:] = PAD  # padded tail
        optimizer.zero_grad()
        logits = model(tokens[:, :-1].to(device))
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1).to(device),
                                           ignore_index=PAD)
        loss.backward()
        optimizer.step()
        xm.mark_step()
        xm.master_print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
