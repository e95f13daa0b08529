"""The sequence-parallel Llama ``plan --measure`` runs against the unsharded model on the CPU.

Two ranks on emulated NeuronCores each hold a shard of the same seeded
model; each rank's loss and the gradients of its shards (the norms' after
their all-reduce) must equal Hugging Face's loss and the matching slices of
its gradients on the CPU. The batch hits both ends of each vocabulary shard
and has ignored labels in the middle; a sequence that does not split over the
ranks, and ids outside the vocabulary (which a sharded lookup would read as
zeros), are refused with a message.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from torch_neuronx.testing.jobs import launch

WORKER = textwrap.dedent('''
    import json, sys
    import torch
    import torch.distributed as dist
    from torch_neuronx.testing import hf
    from torch_neuronx.tools.plan.sequence_parallel import SequenceParallelLlama

    out = sys.argv[1]
    dist.init_process_group("neuron")
    torch.manual_seed(0)
    ref = hf.llama(max_positions=64, hidden=64, heads=4, kv_heads=2, vocab=256, layers=2)
    ids = torch.randint(4, 256, (2, 16))
    ids[0, :4] = torch.tensor([0, 127, 128, 255])  # both ends of both vocabulary shards
    labels = ids.clone()
    labels[1, 5:9] = -100  # ignored, as padding is
    loss = ref(input_ids=ids, labels=labels).loss
    loss.backward()

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron", torch.neuron.current_device())
    model = SequenceParallelLlama(ref).to(device)
    target = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)

    def rows(g):
        n = g.shape[0] // world
        return g[rank * n:(rank + 1) * n]

    def cols(g):
        n = g.shape[1] // world
        return g[:, rank * n:(rank + 1) * n]

    pairs = [(model.embed_tokens.weight, rows(ref.model.embed_tokens.weight.grad)),
             (model.lm_head.weight, rows(ref.lm_head.weight.grad)),
             (model.norm.weight, ref.model.norm.weight.grad)]
    for mine, theirs in zip(model.layers, ref.model.layers):
        a, m = theirs.self_attn, theirs.mlp
        pairs += [(mine.q, rows(a.q_proj.weight.grad)), (mine.k, rows(a.k_proj.weight.grad)),
                  (mine.v, rows(a.v_proj.weight.grad)), (mine.o, cols(a.o_proj.weight.grad)),
                  (mine.gate, rows(m.gate_proj.weight.grad)), (mine.up, rows(m.up_proj.weight.grad)),
                  (mine.down, cols(m.down_proj.weight.grad)),
                  (mine.input_layernorm.weight, theirs.input_layernorm.weight.grad),
                  (mine.post_attention_layernorm.weight, theirs.post_attention_layernorm.weight.grad)]
    losses, errors = [], []
    for recompute in (False, True):  # full recomputation reruns the collectives: the same numbers
        model.checkpointing = recompute
        model.zero_grad(set_to_none=True)
        got = model(ids.to(device), target.to(device))
        got.backward()
        model.all_reduce_norm_grads()
        losses.append(float(got))
        errors.append(max(float((p.grad.cpu() - g).abs().max() / g.abs().max()) for p, g in pairs))
    refused = []
    for bad_ids, bad_target in ((ids[:, :15], target[:, :15]), (ids.clamp(max=255) + 1, target),
                                (ids, target.masked_fill(target == -100, -1))):
        try:
            model(bad_ids.to(device), bad_target.to(device))
            refused.append("")
        except ValueError as e:
            refused.append(str(e))
    json.dump({"losses": losses, "reference": float(loss), "grad_errors": errors, "params": len(pairs),
               "refused": refused}, open(f"{out}/rank{rank}.json", "w"))
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    work = tmp_path_factory.mktemp("sp")
    script = work / "worker.py"
    script.write_text(WORKER)
    env = {"TORCH_NEURONX_INSTANCE_TYPE": "trn1.2xlarge", "TRANSFORMERS_VERBOSITY": "error"}
    procs = launch(script, 2, work, str(work), timeout=240, env=env)
    assert all(p.rc == 0 for p in procs), "\n".join(p.log() for p in procs)
    return [json.loads((work / f"rank{r}.json").read_text()) for r in range(2)]


def test_loss_equals_the_unsharded_model(ranks: list[dict]) -> None:
    for r in ranks:
        assert r["losses"] == pytest.approx([r["reference"]] * 2, rel=1e-5)


def test_every_shard_gradient_equals_its_slice_of_the_unsharded_one(ranks: list[dict]) -> None:
    for r in ranks:
        assert r["params"] == 3 + 2 * 9
        assert max(r["grad_errors"]) < 1e-4, r


def test_a_sequence_that_does_not_split_and_ids_outside_the_vocabulary_are_refused(ranks: list[dict]) -> None:
    short, too_large, negative = ranks[0]["refused"]
    assert "15 tokens do not divide" in short
    assert "token ids must lie in [0, 256)" in too_large and "token ids must lie in [0, 256)" in negative

