"""The planner's time and memory model against hand computation: hierarchical rings, ZeRO-1, SP, PP, autocast."""

from __future__ import annotations

import pytest

from torch_neuronx.runtime.instances import INSTANCES
from torch_neuronx.testing.plan import LLAMA3_8B, LLAMA31_70B, tiny_llama
from torch_neuronx.tools.plan import PlanError, plan
from torch_neuronx.tools.plan.memory import MICROCODE_PER_PHYSICAL_CORE, SCRATCHPAD_PAGE, layer_activations
from torch_neuronx.tools.plan.tensors import groups
from torch_neuronx.tools.plan.timing import COMM_EFFICIENCY

TRN1 = INSTANCES["trn1.32xlarge"]
# per-core bandwidths when every core communicates (AWS's figures, docs/plan.md): HBM / 2 cores, NeuronLink per chip
# / 2 cores, EFA (800 Gbit/s) / 32 cores, each at COMM_EFFICIENCY
CHIP_BW = 820 * 2**30 / 2 * COMM_EFFICIENCY  # 820 GiB/s per chip (AWS)
LINK_BW = 384e9 / 2 * COMM_EFFICIENCY
EFA_BW = 800e9 / 8 / 32 * COMM_EFFICIENCY


def _fsdp_gather(lp):  # type: ignore[no-untyped-def]
    return next(c for c in lp.comm if c.group == "fsdp" and c.collective == "all_gather_into_tensor")


def test_fsdp_ring_on_one_and_four_instances_against_hand_computed_times() -> None:
    one = plan(LLAMA3_8B, instance="trn1.32xlarge", global_batch=32, seq_len=4096, layouts=[(1, 32, 1)])
    four = plan(LLAMA3_8B, instance="trn1.32xlarge", instances=4, global_batch=128, seq_len=4096,
                layouts=[(1, 128, 1), (1, 32, 4)])
    a1, a4 = _fsdp_gather(one.best), _fsdp_gather(four.find(1, 128))
    b1, b4 = a1.bytes, a4.bytes  # bf16 gathered weights, forward + backward, one micro-batch
    # one instance: 32 cores = 2 per chip x 16 chips; the ring crosses NeuronLink for 15/32 of the buffer
    assert a1.levels == (2, 16, 1) and a1.scope_bytes == {"chip": round(b1 / 2), "neuronlink": round(b1 * 15 / 32)}
    # four instances: only 3/128 of the buffer crosses EFA per core (a ring crosses each instance boundary once)
    assert a4.levels == (2, 16, 4)
    assert a4.scope_bytes == {"chip": round(b4 / 2), "neuronlink": round(b4 * 15 / 32), "efa": round(b4 * 3 / 128)}
    t4 = b4 / 2 / CHIP_BW + b4 * 15 / 32 / LINK_BW + b4 * 3 / 128 / EFA_BW
    rs = next(c for c in four.find(1, 128).comm if c.collective == "reduce_scatter_tensor")
    t4_rs = rs.bytes / 2 / CHIP_BW + rs.bytes * 15 / 32 / LINK_BW + rs.bytes * 3 / 128 / EFA_BW
    by_scope = four.find(1, 128).time.as_dict()["comm_by_scope"]
    assert by_scope["efa"] == pytest.approx((b4 + rs.bytes) * 3 / 128 / EFA_BW)  # type: ignore[index]
    st = four.find(1, 128).time
    assert st.comm == pytest.approx(t4 + t4_rs)
    # both layouts hide their gathers behind compute (FSDP2 prefetches): no exposed communication, equal rank
    assert t4 + t4_rs < st.compute and st.exposed_comm == pytest.approx(0.0, abs=1e-9)
    other = four.find(1, 32, 4)
    assert abs(other.time.tokens_per_s / st.tokens_per_s - 1) < 0.02
    # the old flat model charged the whole ring at EFA's per-core share: 40x what the hierarchy moves
    assert (b4 * 127 / 128 / EFA_BW) / t4 > 10


def test_dp_all_reduce_across_instances_splits_by_level() -> None:
    r = plan(LLAMA3_8B, instance="trn1.32xlarge", instances=4, global_batch=128, seq_len=1024,
             layouts=[(8, 16, 1, 1), (8, 4, 4, 1)])
    dp = next(c for c in r.find(8, 4, 4).comm if c.group == "dp")
    # DP groups stride TP x FSDP = 32 cores: one member per instance, all traffic over EFA, twice for an all-reduce
    assert dp.levels == (1, 1, 4) and dp.scope_bytes == {"efa": round(2 * dp.bytes * 3 / 4)}
    tp = next(c for c in r.find(8, 4, 4).comm if c.group == "tp" and c.collective == "all_reduce")
    assert tp.levels == (2, 4, 1) and set(tp.scope_bytes) == {"chip", "neuronlink"}


def test_zero1_shards_the_optimizer_over_dp_and_reduces_once_per_step() -> None:
    base = plan(LLAMA3_8B, instance="trn1.32xlarge", global_batch=64, seq_len=2048, layouts=[(8, 1, 4)])
    zero = plan(LLAMA3_8B, instance="trn1.32xlarge", global_batch=64, seq_len=2048, layouts=[(8, 1, 4)], zero1=True)
    b, z = base.best, zero.best
    assert z.memory.params == b.memory.params and z.memory.grads == b.memory.grads
    # a flat fp32 master shard and AdamW's two moments of it: 3 x 1/4 of the parameters' bytes
    assert z.memory.optimizer == pytest.approx(3 * b.memory.params / 4, rel=0.01)
    full = -(-sum(g.count * g.padded_numel(1) for g in groups(zero.model, z.layout)) // 4) * 4  # padded to DP
    dp = {c.collective: c for c in z.comm if c.group == "dp"}
    assert dp["reduce_scatter_tensor"].bytes == full * 4 and dp["reduce_scatter_tensor"].calls == 1
    assert dp["all_gather_into_tensor"].bytes == full * 4 and not dp["all_gather_into_tensor"].per_micro_batch
    assert not any(c.group == "fsdp" for c in z.comm)
    with pytest.raises(PlanError, match="ZeRO-1 shards the optimizer over DP in place of FSDP"):
        plan(LLAMA3_8B, instance="trn1.32xlarge", global_batch=64, seq_len=2048, layouts=[(8, 4, 1)], zero1=True)
    every = plan(LLAMA3_8B, instance="trn1.32xlarge", global_batch=64, seq_len=2048, zero1=True, pipeline=False)
    assert all(lp.layout.fsdp == 1 for lp in every.layouts)


def test_sequence_parallel_collectives_and_activations() -> None:
    kw = {"instance": "trn1.32xlarge", "global_batch": 4, "seq_len": 4096, "layouts": [(8, 4, 1)]}
    plain, sp = plan(LLAMA3_8B, **kw).best, plan(LLAMA3_8B, sequence_parallel=True, **kw).best  # type: ignore[arg-type]
    tokens, hidden, layers = 4096, 4096, 32
    act = tokens * hidden * 2  # bf16 tokens x hidden
    tp = {(c.collective, c.per_micro_batch): c for c in sp.comm if c.group == "tp"}
    # per layer: 2 gathers + 2 reduce-scatters forward, their mirrors backward, 2 re-gathers for weight gradients;
    # + the embedding's scatter (its gradient gathered), the final norm's gather for the LM head, gathered again for
    # the head's weight gradient (its input gradient reduce-scattered)
    assert tp["all_gather_into_tensor", True].calls == 6 * layers + 3
    assert tp["reduce_scatter_tensor", True].calls == 4 * layers + 2
    assert tp["all_gather_into_tensor", True].bytes == (6 * layers + 3) * act
    # vocabulary-parallel cross-entropy: three fp32 numbers per token, no gathered logits
    assert tp["all_reduce", True].bytes == 3 * tokens * 4 and tp["all_reduce", True].calls == 3
    # the replicated norms' gradients (2 per layer and the final one, fp32: bf16-mixed) summed once per step, as
    # this rank's FSDP shard of each (FSDP = 4)
    assert tp["all_reduce", False].bytes == (2 * layers + 1) * hidden // 4 * 4
    assert tp["all_reduce", False].calls == 1
    assert ("all_gather_into_tensor_coalesced", True) not in tp
    # an all-gather / reduce-scatter pair moves what one all-reduce moves: SP's TP traffic is ~6/7 of the plain one
    ring = sum(sum(c.scope_bytes.values()) for c in sp.comm if c.group == "tp")
    plain_ring = sum(sum(c.scope_bytes.values()) for c in plain.comm if c.group == "tp")
    assert 0.5 < ring / plain_ring < 1.0
    # the token-wise activations (norms, residual) are split 8 ways; the loss keeps only the vocabulary slice
    per_layer = layer_activations(sp_model := plan(LLAMA3_8B, **kw).model, 8, tokens, 2, "none").total  # type: ignore[arg-type]
    per_layer_sp = layer_activations(sp_model, 8, tokens, 2, "none", sp=True).total
    assert per_layer_sp < per_layer and sp.memory.activations == layers * per_layer_sp
    assert sp.memory.buffers < plain.memory.buffers / 4


def test_pipeline_1f1b_bubble_stage_memory_and_sends() -> None:
    kw = {"instance": "trn1.32xlarge", "global_batch": 32, "seq_len": 2048, "checkpointing": "full"}
    one = plan(LLAMA3_8B, layouts=[(8, 4, 1, 1)], **kw).best  # type: ignore[arg-type]
    pp = plan(LLAMA3_8B, layouts=[(8, 1, 1, 4)], **kw).best  # type: ignore[arg-type]
    assert pp.layout.pp == 4 and pp.micro_steps == 32
    t = pp.time
    slot = (t.total - t.optimizer) / (32 + 4 - 1)  # no DP: the step is (m + p - 1) slots of the slowest stage
    assert t.bubble == pytest.approx(3 * slot)
    # stage 0 keeps 4 micro-batches in flight, each of its 8 layers' inputs, and recomputes one layer at a time: the
    # whole model's worth of saved activations, as without pipelining; the last stage peaks either in a layer's
    # backward (its one micro-batch and a recomputed layer) or in the loss's (before any recomputation)
    m = plan(LLAMA3_8B, layouts=[(8, 1, 1, 4)], **kw).model  # type: ignore[arg-type]
    saved = layer_activations(m, 8, 2048, 2, "full").total
    one_layer = layer_activations(m, 8, 2048, 2, "none").total
    assert pp.memory.stage in (0, 3)
    first = 4 * 8 * saved + one_layer
    assert pp.memory.activations in (first, 8 * saved + one_layer, 8 * saved)
    assert pp.memory.params < one.memory.params * 4 / 3.5  # a quarter of the layers, unsharded
    sends = {c.collective: c for c in pp.comm if c.group == "pp"}
    assert sends["send"].bytes == 32 * 2048 * 4096 * 2 and sends["send"].calls == 32  # stage 0: activations out
    assert sends["send"].scope == "neuronlink"  # stages 8 cores apart on one instance
    with pytest.raises(PlanError, match="PP=64 stages but the model has 32 decoder layers"):
        plan(LLAMA3_8B, instance="trn1.32xlarge", instances=2, global_batch=64, seq_len=128, layouts=[(1, 1, 1, 64)])


def test_pipeline_needed_for_70b_on_trn1() -> None:
    # Llama-3.1-70B as AWS trains it on 32 trn1.32xlarge (its 8 KV heads replicated x4 over TP=32, as NxD does)
    big = {**LLAMA3_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
           "num_attention_heads": 64, "num_key_value_heads": 8}
    r = plan(big, instance="trn1.32xlarge", instances=32, global_batch=1024, seq_len=8192, checkpointing="selective",
             zero1=True, sequence_parallel=True, layouts=[(32, 1, 32, 1), (32, 1, 4, 8)])
    assert not r.find(32, 1, 32).fits and r.find(32, 1, 4, 8).fits


def test_fp32_matmuls_cast_to_bf16_by_default() -> None:
    kw = {"instance": "trn1.32xlarge", "global_batch": 32, "seq_len": 2048, "precision": "fp32",
          "layouts": [(1, 32, 1)]}
    cast, none = plan(LLAMA3_8B, **kw), plan(LLAMA3_8B, autocast="none", **kw)  # type: ignore[arg-type]
    # the matmul class changes (Trn1's BF16 / FP32 peaks) and the cast adds its operand casts (timing.cast_bytes);
    # the other memory-bound classes are the same FP32 bytes
    cast_classes, none_classes = dict(cast.best.time.by_class), dict(none.best.time.by_class)
    assert none_classes["matmul"] / cast_classes["matmul"] == pytest.approx(190 / 47.5)
    assert cast_classes["autocast"] > 0 and "autocast" not in none_classes
    assert {k: v for k, v in none_classes.items() if k != "matmul"} == \
        {k: v for k, v in cast_classes.items() if k not in ("matmul", "autocast")}
    assert any("--auto-cast matmult" in n for n in cast.notes)
    with pytest.raises(PlanError, match="autocast 'fp8'"):
        plan(LLAMA3_8B, autocast="fp8", **kw)  # type: ignore[arg-type]


def test_runtime_reserve_and_reserved_bytes_decide_fits() -> None:
    r = plan(LLAMA3_8B, instance="trn1.32xlarge", global_batch=32, seq_len=4096, checkpointing="full",
             layouts=[(8, 4, 1)])
    mem = r.best.memory
    assert mem.reserve == MICROCODE_PER_PHYSICAL_CORE + SCRATCHPAD_PAGE == r.settings["hbm_reserve"]
    assert mem.total <= mem.reserved < mem.total * 1.05  # large tensors: rounding to 2 MiB segments is small
    d = r.best.as_dict()["memory_per_core"]
    assert d["needed"] == d["reserved"] + d["fragmentation_margin"] + d["runtime_reserve"]
    # a reserve that leaves less than the estimate refuses the layout, and says so
    tight = 16 * (1 << 30) - mem.reserved + 1
    r2 = plan(LLAMA3_8B, instance="trn1.32xlarge", global_batch=32, seq_len=4096, checkpointing="full",
              layouts=[(8, 4, 1)], hbm_reserve=tight)
    assert not r2.best.fits and "for the Neuron runtime" in r2.best.reason
    trn2 = plan(tiny_llama(), instance="trn2.3xlarge", global_batch=4, seq_len=32, layouts=[(1, 4, 1)])
    assert trn2.best.memory.reserve == 2 * MICROCODE_PER_PHYSICAL_CORE + SCRATCHPAD_PAGE  # LNC=2: two physical
    with pytest.raises(PlanError, match="--hbm-reserve"):
        plan(tiny_llama(), instance="trn2.3xlarge", global_batch=4, seq_len=32, hbm_reserve=-1)


def test_16_trn2_instances_plan_8b_and_70b_with_pipelines() -> None:
    for model in (LLAMA3_8B, LLAMA31_70B):
        r = plan(model, instance="trn2.48xlarge", instances=16, global_batch=1024, seq_len=8192,
                 checkpointing="full")
        assert r.hardware.world == 1024 and any(lp.layout.pp > 1 for lp in r.layouts)
        assert r.best.fits and r.best.time.total > 0
        for lp in r.layouts:  # every figure finite, non-negative and below the peak
            t = lp.time
            assert 0 < t.total < 1e6 and t.exposed_comm >= 0 and t.bubble >= 0
            flops = 1024 * 8192 * 6 * r.model.total_params / 1024
            assert flops / t.total < 667e12 / 4  # never above Trn2's dense BF16 peak per logical core


# ---- hostile config.json files: one-line errors from the shared reader, for `plan` and `plan --serve` alike -------

HOSTILE = {
    "zero_heads": ({"num_attention_heads": 0, "num_key_value_heads": 0}, "num_attention_heads=0"),
    "string_hidden": ({"hidden_size": "4096"}, "hidden_size='4096'"),
    "float_layers": ({"num_hidden_layers": 2.5}, "num_hidden_layers=2.5"),
    "bad_positions": ({"max_position_embeddings": -1}, "max_position_embeddings=-1"),
    "bad_model_type": ({"model_type": 7}, "model_type=7"),
}


def _config_dir(tmp_path, name: str, fields: dict) -> str:  # type: ignore[no-untyped-def]
    import json

    # without tie_word_embeddings the reader hands the fields to transformers (which divides by the heads)
    data = {k: v for k, v in LLAMA3_8B.items() if k != "tie_word_embeddings"}
    data.update(fields)
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(data))
    return str(folder)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_configs_exit_2_in_plan_and_serve(name: str, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from torch_neuronx.tools.cli import main

    fields, message = HOSTILE[name]
    model = _config_dir(tmp_path, name, fields)
    for argv in (["plan", model, "--instance", "trn1.32xlarge", "--global-batch", "8", "--seq-len", "128"],
                 ["plan", model, "--serve", "--instance", "inf2.48xlarge", "--input-len", "10", "--output-len", "10"]):
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1 and message in err, (argv, err)


def test_a_sound_config_through_transformers_reads_max_positions(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from torch_neuronx.tools.plan.model import load

    spec = load(_config_dir(tmp_path, "sound", {}))  # the correct twin of the hostile ones: the same path
    assert (spec.heads, spec.hidden, spec.max_positions) == (32, 4096, 8192)  # Llama-3-8B's config.json
    assert load(_config_dir(tmp_path, "gpt2", {"max_position_embeddings": None, "n_positions": 1024,
                                               "model_type": None})).max_positions == 1024
    assert "max_positions" in spec.as_dict()


def test_a_config_that_is_not_a_regular_json_file_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os

    from torch_neuronx.tools.plan.model import load

    deep = tmp_path / "deep" / "config.json"
    deep.parent.mkdir()
    deep.write_text("[" * 5000 + "]" * 5000)  # json.loads raises RecursionError, not ValueError
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # reading it would block forever
    for path, message in ((deep.parent, "RecursionError"), (fifo, "not a regular file")):
        with pytest.raises(ValueError, match=message):
            load(str(path))
