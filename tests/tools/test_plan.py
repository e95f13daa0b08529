"""The planner's analytic side against references: brute force, the allocator, documented facts, and clear refusals."""

from __future__ import annotations

import argparse
import itertools
import json
import random
from pathlib import Path

import pytest
import torch

from torch_neuronx.compile.bucketing import bucket_length, pad_batch
from torch_neuronx.testing.plan import LLAMA3_8B, tiny_llama
from torch_neuronx.tools.plan import PlanError, plan
from torch_neuronx.tools.plan import cli as plan_cli
from torch_neuronx.tools.plan.model import load
from torch_neuronx.tools.plan.padding import policies
from torch_neuronx.tools.plan.tensors import allocated, groups


@pytest.fixture()
def llama3_8b(tmp_path: Path) -> Path:
    path = tmp_path / "Meta-Llama-3-8B"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(LLAMA3_8B))
    return path


def brute_force_waste(lengths: list[int], max_graphs: int) -> int:
    """Least padded tokens over every set of at most `max_graphs` buckets drawn from the lengths (longest included)."""
    distinct = sorted(set(lengths))
    best = None
    for k in range(1, max_graphs + 1):
        for rest in itertools.combinations(distinct[:-1], k - 1):
            buckets = [*rest, distinct[-1]]
            padded = sum(bucket_length(n, buckets=buckets) for n in lengths)
            best = padded if best is None else min(best, padded)
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(12))
def test_optimal_buckets_match_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.randint(1, 300) for _ in range(rng.randint(1, 14))]
    graphs = rng.randint(1, 4)
    optimal = next(p for p in policies(lengths, graphs) if p["name"].startswith("optimal"))
    assert optimal["padded_tokens"] == brute_force_waste(lengths, graphs)
    assert optimal["graphs"] <= graphs
    # the buckets are what pad_batch takes: every sequence pads to a bucket
    batch = pad_batch([[1] * n for n in lengths], buckets=optimal["buckets"])
    assert batch.input_ids.shape[1] in optimal["buckets"]


def test_padding_policies_report_waste_graphs_and_throughput() -> None:
    lengths = [100] * 50 + [900] * 2
    by_name = {p["name"]: p for p in policies(lengths, 2)}
    assert by_name["pad to max"] == {**by_name["pad to max"], "buckets": [900], "graphs": 1,
                                     "padded_tokens": 52 * 900}
    assert by_name["multiple of 128"]["buckets"] == [128, 1024]
    assert by_name["multiple of 128"]["padded_tokens"] == 50 * 128 + 2 * 1024
    assert by_name["optimal 2 buckets"]["buckets"] == [100, 900]
    assert by_name["optimal 2 buckets"]["waste"] == 0.0 and by_name["optimal 2 buckets"]["throughput_factor"] == 1.0
    assert by_name["pad to max"]["throughput_factor"] == pytest.approx(6800 / (52 * 900))


def test_lengths_from_a_dataset_column_and_tokenizer() -> None:
    from datasets import Dataset

    from torch_neuronx.testing import hf
    from torch_neuronx.tools.plan.padding import lengths_from_dataset

    tok = hf.tokenizer()
    data = Dataset.from_dict({"text": ["the cat sat", "dog ran to park over tree", "bird"]})
    assert lengths_from_dataset(data, "text", tok, batch_size=2) == [3, 6, 1]  # word-level: one token a word
    with pytest.raises(ValueError, match=r"no column 'prompt'; its columns are \['text'\]"):
        lengths_from_dataset(data, "prompt", tok)


@pytest.mark.parametrize("nbytes", [1, 256, 257, 4096, 5000, 1 << 20, (1 << 20) + 1, 3_000_000, 17 << 20])
def test_size_classes_match_the_allocator(nbytes: int) -> None:
    torch.neuron.synchronize()
    before = torch.neuron.memory_allocated()
    t = torch.empty(nbytes, dtype=torch.uint8, device="neuron")
    assert torch.neuron.memory_allocated() - before == allocated(nbytes)
    del t


def test_tp_that_does_not_divide_the_heads_is_refused() -> None:
    # Transformers itself would fail later inside attention with a reshape error; TP 4 over 2 KV heads replicates
    # them (NxD's kv_size_multiplier, tests/tools/test_plan_kv_replication.py), TP 8 over 4 query heads cannot run
    with pytest.raises(PlanError, match=r"attention heads \(4\) not divisible by TP=8.*Valid TP degrees: \[1, 2, 4\]"):
        plan(tiny_llama(), instance="trn1.32xlarge", global_batch=32, seq_len=32, layouts=[(8, 4, 1)])


def test_world_the_instances_cannot_host_is_refused() -> None:
    with pytest.raises(PlanError, match=r"= 8 but 1 x trn2.3xlarge at LNC=2 has 4 NeuronCores"):
        plan(tiny_llama(), instance="trn2.3xlarge", global_batch=8, seq_len=32, layouts=[(2, 4, 1)])
    with pytest.raises(PlanError, match="spans instances"):
        plan(tiny_llama(), instance="trn1.32xlarge", instances=2, global_batch=64, seq_len=32, layouts=[(64, 1, 1)])
    with pytest.raises(PlanError, match="has no EFA network"):
        plan(tiny_llama(), instance="trn2.3xlarge", instances=2, global_batch=8, seq_len=32)
    with pytest.raises(PlanError, match="only Trn2 takes 2"):
        plan(tiny_llama(), instance="trn1.32xlarge", lnc=2, global_batch=8, seq_len=32)
    with pytest.raises(PlanError, match="unknown instance type 'trn9'"):
        plan(tiny_llama(), instance="trn9", global_batch=8, seq_len=32)
    with pytest.raises(PlanError, match="not a multiple of micro-batch 1 x 4"):
        plan(tiny_llama(), instance="trn2.3xlarge", global_batch=6, seq_len=32, layouts=[(1, 4, 1)])


def test_bad_model_specs_say_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="directory without config.json"):
        load(tmp_path)
    with pytest.raises(ValueError, match="cannot import 'no_such_module:build'"):
        load("no_such_module:build")
    (tmp_path / "c.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ValueError, match="lacks num_hidden_layers, num_attention_heads, vocab_size"):
        load(tmp_path / "c.json")


def test_builder_spec_reads_the_built_models_config() -> None:
    spec = load("torch_neuronx.testing.plan:tiny_llama")
    assert (spec.heads, spec.kv_heads, spec.layers, spec.hidden) == (4, 2, 2, 128)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_llama())
    assert spec.total_params == sum(p.numel() for p in model.parameters())


def test_llama3_8b_parameters_and_layouts(llama3_8b: Path) -> None:
    result = plan(llama3_8b, instance="trn1.32xlarge", global_batch=32, seq_len=4096, checkpointing="full")
    assert result.model.total_params == 8_030_261_248  # Meta-Llama-3-8B's published parameter count
    names = {(lp.layout.tp, lp.layout.fsdp, lp.layout.dp) for lp in result.layouts}
    # TP up to 32 (the instance): above the 8 KV heads they are replicated (NxD), and the plan says so
    assert (8, 4, 1) in names and (32, 1, 1) in names and all(tp <= 32 for tp, _, _ in names)
    assert any("above the 8 key/value heads" in n for n in result.notes)
    four_by_eight = result.find(8, 4)
    assert four_by_eight.fits and four_by_eight.memory.total < 16 << 30
    scopes = {(c.group, c.collective): c.scope for c in four_by_eight.comm}
    # TP=8 spans 4 Trainium chips (2 cores each): NeuronLink; the FSDP group spans the instance
    assert scopes == {("tp", "all_reduce"): "neuronlink", ("tp", "all_gather_into_tensor_coalesced"): "neuronlink",
                      ("fsdp", "all_gather_into_tensor"): "neuronlink", ("fsdp", "reduce_scatter_tensor"): "neuronlink"}
    # replicating all state on every core cannot fit 8B parameters in 16 GiB
    pure_dp = result.find(1, 1, 32)
    assert not pure_dp.fits and "per core, the core has 16.00 GiB" in pure_dp.reason
    assert result.layouts.index(pure_dp) > max(result.layouts.index(lp) for lp in result.layouts if lp.fits)


def test_llama3_8b_on_trn2_keeps_tp8_inside_two_chips(llama3_8b: Path) -> None:
    result = plan(llama3_8b, instance="trn2.48xlarge", global_batch=32, seq_len=4096, checkpointing="full",
                  layouts=[(8, 4, 2), (8, 8, 1), (4, 16, 1)])
    tp8 = result.find(8, 8)
    assert result.hardware.world == 64 and result.hardware.hbm_per_core == 24 << 30
    assert {c.scope for c in tp8.comm if c.group == "tp"} == {"neuronlink"}  # 4 logical cores per chip at LNC=2
    assert result.find(4, 16).comm[-1].scope == "chip"
    gathered = next(c for c in tp8.comm if c.collective == "all_gather_into_tensor")
    # bf16 weights gathered in forward and backward, once per micro-batch: 4 micro-steps of 1 sequence
    assert gathered.bytes == 4 * 2 * sum(g.count * g.padded_numel(8) * (2 if g.reshard else 1)
                                         for g in groups(result.model, tp8.layout))


def test_cli_writes_table_json_and_plots(tmp_path: Path, llama3_8b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    plan_cli.add_parser(parser.add_subparsers(dest="command"))
    (tmp_path / "lengths.txt").write_text("\n".join(str(n) for n in [300, 1200, 4000, 800, 2500] * 10))
    args = parser.parse_args(["plan", str(llama3_8b), "--instance", "trn1.32xlarge", "--global-batch", "32",
                              "--lengths", str(tmp_path / "lengths.txt"), "--max-graphs", "3", "--checkpointing",
                              "full", "--json", str(tmp_path / "plan.json"), "--plots", str(tmp_path / "plots")])
    assert plan_cli.run(args) == 0
    out = capsys.readouterr().out
    assert "8x1x4x1" in out and "roofline estimate" in out and "optimal 3 buckets" in out
    data = json.loads((tmp_path / "plan.json").read_text())
    first = data["layouts"][0]
    assert {"layout", "tp", "pp", "fsdp", "dp", "fits", "memory_per_core", "comm_per_step", "step_time_s"} <= set(first)
    assert {"params", "grads", "optimizer", "activations", "total", "reserved", "runtime_reserve", "needed",
            "capacity", "stage"} <= set(first["memory_per_core"])
    assert {"collective", "bytes", "scope", "levels", "scope_bytes"} <= set(first["comm_per_step"][0])
    assert {"compute", "comm", "total", "pipeline_bubble", "comm_by_scope"} <= set(first["step_time_s"])
    assert data["settings"]["hbm_reserve"] > 0 and data["settings"]["pipeline_schedule"] == "1F1B"
    assert data["settings"]["seq_len"] == 4000
    assert [p["buckets"] for p in data["padding"]["policies"]][2] == [1200, 2500, 4000]
    for name in ("memory.png", "step_time.png", "padding.png", "plan.html"):
        assert (tmp_path / "plots" / name).stat().st_size > 1000
    assert "data:image/png;base64," in (tmp_path / "plots" / "plan.html").read_text()


def test_cli_reports_bad_input_with_exit_status_2(llama3_8b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    plan_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["plan", str(llama3_8b), "--instance", "trn1.32xlarge", "--global-batch", "32",
                              "--seq-len", "4096", "--layout", "3x2"])
    assert plan_cli.run(args) == 2
    assert "attention heads (32) not divisible by TP=3" in capsys.readouterr().err


def test_cli_takes_lengths_from_a_dataset_on_disk(tmp_path: Path, llama3_8b: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from torch_neuronx.testing import hf

    hf.tokenizer().save_pretrained(tmp_path / "tok")
    texts = ["the cat sat", "dog ran to park over tree", "bird", "the cat sat on mat dog ran"]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps({"prompt": t}) for t in texts))
    parser = argparse.ArgumentParser()
    plan_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["plan", str(llama3_8b), "--instance", "trn1.32xlarge", "--global-batch", "32",
                              "--dataset", str(tmp_path / "data.jsonl"), "--column", "prompt", "--tokenizer",
                              str(tmp_path / "tok"), "--max-graphs", "2", "--layout", "8x4",
                              "--json", str(tmp_path / "plan.json")])
    assert plan_cli.run(args) == 0
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["settings"]["seq_len"] == 7  # the longest text: one token a word
    optimal = data["padding"]["policies"][2]
    assert optimal["buckets"] == [3, 7] and optimal["real_tokens"] == 3 + 6 + 1 + 7
    args.column = "text"
    assert plan_cli.run(args) == 2 and "no column 'text'" in capsys.readouterr().err
