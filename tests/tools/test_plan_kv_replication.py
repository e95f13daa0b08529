"""KV heads replicated over TP (TP above their number, as NxD does it) against the unsharded model, and the plan.

NeuronX Distributed's ``GQAQKVColumnParallelLinear(kv_size_multiplier=TP / KV heads)`` repeats each KV head over
the ranks whose query heads read it and sums the gradients of its K and V outputs over them in backward
(aws-neuron/neuronx-distributed, src/neuronx_distributed/modules/qkv_linear.py). The planner models that in memory,
FLOPs and collectives; ``SequenceParallelLlama`` (what ``plan --measure`` runs) does it for real. One launch of
four ranks on emulated cores: a tiny Llama with 8 query and 2 KV heads at TP 4 must give Hugging Face's loss and
every shard's gradient (the replicated K and V equal to the whole head's), and each collective the step runs must
match the plan's calls and bytes. In process: AWS's Llama-3-70B recipe on 16 x trn2.48xlarge (TP 32 x PP 4) and
Llama-3-8B at TP 32 plan and fit.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from torch_neuronx.testing.jobs import launch
from torch_neuronx.testing.plan import LLAMA3_8B, LLAMA31_70B
from torch_neuronx.tools.plan import plan
from torch_neuronx.tools.plan.layouts import PlanError
from torch_neuronx.tools.plan.model import from_config

WORKER = textwrap.dedent('''
    import json, sys
    import torch
    import torch.distributed as dist
    import torch_neuronx.distributed as nd
    from torch_neuronx.testing import hf
    from torch_neuronx.tools.plan import evaluate
    from torch_neuronx.tools.plan.layouts import Layout, hardware
    from torch_neuronx.tools.plan.measure import group_label
    from torch_neuronx.tools.plan.model import from_config
    from torch_neuronx.tools.plan.sequence_parallel import SequenceParallelLlama

    out = sys.argv[1]
    dist.init_process_group("neuron")
    torch.manual_seed(0)
    ref = hf.llama(max_positions=64, hidden=64, heads=8, kv_heads=2, vocab=256, layers=2)
    ids = torch.randint(4, 256, (2, 16))
    labels = ids.clone()
    labels[1, 5:9] = -100
    loss = ref(input_ids=ids, labels=labels).loss
    loss.backward()

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron", torch.neuron.current_device())
    model = SequenceParallelLlama(ref).to(device)
    target = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
    d, kv = 8, 2
    head, block = rank % kv, rank // kv  # NxD: KV head rank mod KV; that head's query heads in blocks
    queries = [head * 4 + block * 2 + i for i in range(2)]

    def heads(g, hs, dim=0):
        index = torch.cat([torch.arange(h * d, (h + 1) * d) for h in hs])
        return g.index_select(dim, index)

    pairs = []
    for mine, theirs in zip(model.layers, ref.model.layers):
        a = theirs.self_attn
        pairs += [(mine.q, heads(a.q_proj.weight.grad, queries)), (mine.k, heads(a.k_proj.weight.grad, [head])),
                  (mine.v, heads(a.v_proj.weight.grad, [head])), (mine.o, heads(a.o_proj.weight.grad, queries, 1)),
                  (mine.input_layernorm.weight, theirs.input_layernorm.weight.grad)]
    groups = [pg for pg in dist.distributed_c10d._world.pg_group_ranks
              if isinstance(pg, dist.ProcessGroup) and pg.size() > 1]
    losses, errors, measured = [], [], {}
    for recompute in (False, True):
        model.checkpointing = recompute
        model.zero_grad(set_to_none=True)
        for pg in groups:
            nd.reset_comm_stats(pg)
        got = model(ids.to(device), target.to(device))
        got.backward()
        model.all_reduce_norm_grads()
        losses.append(float(got))
        errors.append(max(float((p.grad.cpu() - g).abs().max() / g.abs().max()) for p, g in pairs))
        if not recompute:
            for pg in groups:
                label = group_label(sorted(dist.get_process_group_ranks(pg)), world, 1)
                for name, st in nd.comm_stats(pg).items():
                    if st["calls"]:
                        row = measured.setdefault(f"{label} {name}", [0, 0])
                        row[0] += st["calls"]
                        row[1] += st["bytes"]
    hw = hardware("trn2.3xlarge")
    lp = evaluate(from_config(ref.config), hw, Layout(4, 1, 1), precision="fp32", global_batch=2, seq_len=16,
                  micro_batch=2, checkpointing="none", capacity=hw.hbm_per_core, sequence_parallel=True)
    analytic = {}
    for c in lp.comm:
        row = analytic.setdefault(f"{c.group} {c.collective}", [0, 0])
        row[0] += c.calls
        row[1] += c.bytes
    json.dump({"losses": losses, "reference": float(loss), "grad_errors": errors, "measured": measured,
               "analytic": analytic}, open(f"{out}/rank{rank}.json", "w"))
    dist.destroy_process_group()
''')


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    work = tmp_path_factory.mktemp("kv")
    script = work / "worker.py"
    script.write_text(WORKER)
    env = {"TORCH_NEURONX_INSTANCE_TYPE": "trn2.3xlarge", "TRANSFORMERS_VERBOSITY": "error"}
    procs = launch(script, 4, work, str(work), timeout=240, env=env)
    assert all(p.rc == 0 for p in procs), "\n".join(p.log() for p in procs)
    return [json.loads((work / f"rank{r}.json").read_text()) for r in range(4)]


def test_replicated_kv_heads_train_as_the_unsharded_model(ranks: list[dict]) -> None:
    for r in ranks:
        assert r["losses"] == pytest.approx([r["reference"]] * 2, rel=1e-5)
        assert max(r["grad_errors"]) < 1e-4, r  # with and without recomputation


def test_the_kv_all_reduces_and_every_other_collective_match_the_plan(ranks: list[dict]) -> None:
    for r in ranks:
        assert r["measured"] == r["analytic"], r
    # 2 layers x (K, V) all-reduces of 2 x 16 tokens x one head of 8, fp32, on top of the norms' and the loss's
    norms_and_loss = 1 + 3
    assert ranks[0]["analytic"]["tp all_reduce"] == [norms_and_loss + 4, 5 * 64 * 4 + 3 * 32 * 4 + 4 * 32 * 8 * 4]


def test_twin_without_replication_has_no_kv_all_reduce() -> None:
    from torch_neuronx.tools.plan import evaluate
    from torch_neuronx.tools.plan.layouts import Layout, hardware

    hw = hardware("trn2.3xlarge")
    spec = from_config({"model_type": "llama", "vocab_size": 256, "hidden_size": 128, "intermediate_size": 256,
                        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2})
    kv = {}
    for tp in (2, 4):
        lp = evaluate(spec, hw, Layout(tp, 4 // tp, 1), precision="fp32", global_batch=4, seq_len=16, micro_batch=1,
                      checkpointing="none", capacity=hw.hbm_per_core)
        kv[tp] = [c for c in lp.comm if c.group == "tp" and c.group_size != tp]  # a group inside TP: the KV one
    assert kv[2] == []
    assert len(kv[4]) == 1 and kv[4][0].group_size == 2 and kv[4][0].calls == 2 * 2 * 4  # 2 layers x K, V x 4 micro
    assert kv[4][0].bytes == 2 * 2 * 4 * 16 * 32 * 4  # tokens x one head of 32 (hidden 128 / 4 heads), fp32


def _published(config: dict, **kw: object):  # noqa: ANN202
    return plan(from_config(config), **kw)


def test_aws_llama3_70b_recipe_plans_fits_and_ranks_by_its_time() -> None:
    # NxD Training's Llama-3-70B recipe: 16 x trn2.48xlarge, TP 32 x PP 4, sequence 8192, global batch 1024,
    # sequence parallelism, ZeRO-1, selective recomputation (aws-neuron/neuronx-distributed-training,
    # examples/conf/hf_llama3_70B_config.yaml)
    kw = dict(instance="trn2.48xlarge", instances=16, global_batch=1024, seq_len=8192, checkpointing="selective",
              zero1=True, sequence_parallel=True)
    result = _published(LLAMA31_70B, **kw)
    recipe = result.find(32, 1, 8, pp=4)
    assert recipe.fits and recipe.memory.reserved + recipe.memory.reserve <= recipe.memory.capacity
    # its rank is where its estimated time puts it among the fitting layouts
    fitting = [lp for lp in result.layouts if lp.fits]
    assert fitting == sorted(fitting, key=lambda lp: -lp.time.tokens_per_s)
    assert recipe in fitting
    # replication shows in every figure: 1 KV head per rank (x4 over the 8), its all-reduces, more FLOPs than
    # the unreplicated split would need
    spec = from_config(LLAMA31_70B)
    assert spec.kv_replication(32) == 4 and spec.replicated(32).kv_heads == 32
    kv = [c for c in recipe.comm if c.group == "tp" and c.group_size == 4]
    assert len(kv) == 1 and kv[0].calls == 2 * 20 * recipe.micro_steps  # 80 layers / PP 4, K and V
    assert any("replicated" in n for n in result.notes)


def test_llama3_8b_at_tp32_plans() -> None:
    # the NxD pretraining script's default for Llama-3-8B: TP 32 on trn1.32xlarge (8 KV heads, replicated x4)
    result = _published(LLAMA3_8B, instance="trn1.32xlarge", instances=4, global_batch=1024, seq_len=8192,
                        checkpointing="selective", zero1=True, sequence_parallel=True, layouts=[(32, 1, 4)])
    lp = result.best
    assert lp.layout.tp == 32 and lp.fits


def test_kv_heads_that_neither_divide_nor_are_divided_by_tp_are_refused() -> None:
    spec = {**LLAMA3_8B, "num_attention_heads": 24, "num_key_value_heads": 6, "hidden_size": 3072}
    with pytest.raises(PlanError, match=r"key/value heads \(6\) neither divisible by TP=4"):
        plan(from_config(spec), instance="trn1.32xlarge", global_batch=32, seq_len=1024, layouts=[(4, 8, 1)])
