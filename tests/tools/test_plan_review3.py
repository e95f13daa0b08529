"""``torch-neuronx plan`` against the defects the third review of issue 30 found (rv30): each is a test that failed
before its fix, beside a correct twin that must keep planning.

In process and cheap: the CLI's ``main`` with an argv, or the planner's functions on published shapes. The two
defects that need a real multi-process step (the comm count of a later layout of one launch, the memory bound under
TP) are checked in tests/tools/test_plan_measure.py, in one launch.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torch_neuronx.testing.plan import assert_refused as _refused
from torch_neuronx.testing.plan import cli
from torch_neuronx.tools.cli import main

# NxD Training's Llama-3-70B config.json (aws-neuron/neuronx-distributed-training examples, conf/hf_llama3_70B_config):
# the fields the planner reads
NXD_LLAMA3_70B = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 8192, "intermediate_size": 28672,
                  "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                  "max_position_embeddings": 8192, "rope_theta": 500000.0, "tie_word_embeddings": False}
ARGS = ["--instance", "trn1.32xlarge", "--instances", "16", "--global-batch", "1024", "--seq-len", "8192",
        "--layout", "32x8x1x2"]


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return cli(main, argv, capsys)


def _config(tmp_path: Path, data: dict[str, object]) -> str:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(data))
    return str(folder)


# 1. a config.json without a dimension the planner reads was filled in with LlamaConfig's defaults (hidden 4096,
# 32 layers, 32 heads, vocabulary 32000): the 70B without hidden_size planned as 32.26B parameters, exit 0
@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"])
def test_a_config_json_missing_a_dimension_is_refused_naming_it(field: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    data = {k: v for k, v in NXD_LLAMA3_70B.items() if k != field}
    _refused(*_main(["plan", _config(tmp_path, data), *ARGS], capsys), f"lacks {field}")


def test_a_moe_config_json_without_experts_per_token_is_refused(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # Mixtral-8x7B's shape (mistralai/Mixtral-8x7B-v0.1 config.json) without num_experts_per_tok (MixtralConfig: 2)
    mixtral = {**NXD_LLAMA3_70B, "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
               "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000, "num_local_experts": 8}
    _refused(*_main(["plan", _config(tmp_path, mixtral), *ARGS[:-2]], capsys), "lacks num_experts_per_tok")


@pytest.mark.parametrize("value", ["false", "true", 0, 1, "no"])
def test_a_tie_word_embeddings_that_is_not_a_json_boolean_is_refused(value: object, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # "false" is a true string: it planned the 70B with tied embeddings (1.05B parameters fewer)
    data = {**NXD_LLAMA3_70B, "tie_word_embeddings": value}
    _refused(*_main(["plan", _config(tmp_path, data), *ARGS], capsys),
             f"tie_word_embeddings={value!r}: it must be true or false")


def test_the_complete_config_twins_plan_with_their_published_counts(tmp_path: Path) -> None:
    from torch_neuronx.tools.plan.model import from_config, load

    # the same file complete: Llama-3-70B's published 70.55B parameters, untied; with true, the LM head shared
    spec = load(_config(tmp_path, NXD_LLAMA3_70B))
    assert (spec.total_params, spec.tied_embeddings) == (70_553_706_496, False)
    tied = from_config({**NXD_LLAMA3_70B, "tie_word_embeddings": True})
    assert spec.total_params - tied.total_params == 128256 * 8192
    # without tie_word_embeddings (not a size) the model type's default holds, as Transformers loads it: untied
    untied = {k: v for k, v in NXD_LLAMA3_70B.items() if k != "tie_word_embeddings"}
    (tmp_path / "model" / "config.json").write_text(json.dumps(untied))
    assert load(str(tmp_path / "model")).total_params == 70_553_706_496
    # a builder's PretrainedConfig is complete by construction: Transformers' defaults are its own
    assert load("torch_neuronx.testing.plan:tiny_llama").hidden == 128


# 7. --json /dev/full passed the write probe (only opened for appending): the --measure run (about 35 s) came
# first, the exit 2 after it
def test_a_json_path_that_is_not_a_regular_file_is_refused_before_measuring(monkeypatch: pytest.MonkeyPatch,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from torch_neuronx.tools.plan import measure

    def must_not_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("--measure ran before the --json path was refused")

    monkeypatch.setattr(measure, "measure_layouts", must_not_run)
    argv = ["plan", "torch_neuronx.testing.plan:tiny_llama", "--instance", "trn2.3xlarge", "--global-batch", "8",
            "--micro-batch", "2", "--seq-len", "32", "--precision", "fp32", "--layout", "1x4", "--measure", "1"]
    for device in ("/dev/full", "/dev/null"):
        _refused(*_main([*argv, "--json", device], capsys), f"--json {device} is not a regular file")


def test_a_json_path_that_is_a_regular_file_is_still_written(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    existing = tmp_path / "plan.json"
    existing.write_text("old")
    argv = ["plan", "torch_neuronx.testing.plan:tiny_llama", "--instance", "trn2.3xlarge", "--global-batch", "8",
            "--seq-len", "32", "--layout", "1x4", "--json", str(existing)]
    code, out, _ = _main(argv, capsys)
    assert code == 0 and json.loads(existing.read_text())["layouts"][0]["fsdp"] == 4
    assert not list(tmp_path.glob(".plan-probe-*"))  # the probe beside it leaves nothing


# 8. --help scoped --calibration to SDK 2.14-2.28; the table covers every release its rows name
def test_calibration_help_names_the_releases_the_table_covers(capsys: pytest.CaptureFixture[str]) -> None:
    import re

    from torch_neuronx.tools.plan.calibration import results

    code, out, _ = _main(["plan", "--help"], capsys)
    assert code == 0
    text = " ".join(out.split())
    scope = re.search(r"--calibration print the time model .*?\(SDK ([0-9.]+)-([0-9.]+);", text)
    assert scope is not None, text
    releases = sorted({tuple(int(x) for x in str(r["sdk"]).split(".")[:2]) for r in results()})
    assert (scope.group(1), scope.group(2)) == tuple(".".join(map(str, v)) for v in (releases[0], releases[-1]))


# 9. an unknown option printed the top-level parser's usage and error (two lines); docs/plan.md promises one line
@pytest.mark.parametrize("argv", [
    ["plan", "model", "--instance", "trn1.32xlarge", "--foo"],
    ["plan", "--foo", "1"],
])
def test_an_unknown_plan_option_is_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _refused(*_main(argv, capsys), "unrecognized arguments: --foo")


def test_an_unknown_option_of_another_subcommand_names_that_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    # the twin: migrate keeps argparse's usage and error, now its own (not the top level's)
    code, out, err = _main(["migrate", "x.py", "--foo"], capsys)
    assert code == 2 and out == ""
    assert err.startswith("usage: torch-neuronx migrate") and err.endswith("error: unrecognized arguments: --foo\n")


# 4. the KV-replication all-reduce was planned in the compute dtype over ranks KV heads apart; NxD sums the gradients
# in float32 (qkv_linear_utils.py: grad_output_k/v .to(ctx.reduce_dtype), qkv_linear.py: reduce_dtype=torch.float32)
# and on Trn2 puts a head's replicas on adjacent ranks (parallel_state.py arrange_kv_groups)
def _kv_all_reduce(lp: object, tp: int) -> object:
    rows = [c for c in lp.comm if c.group == "tp" and c.collective == "all_reduce" and c.group_size != tp]  # type: ignore[attr-defined]
    assert len(rows) == 1
    return rows[0]


def test_nxd_llama3_70b_trn2_recipe_plans_its_kv_all_reduce_in_fp32_inside_a_chip() -> None:
    from torch_neuronx.tools.plan import plan
    from torch_neuronx.tools.plan.model import from_config

    # NxD Training's hf_llama3_70B_trn2_config.yaml: 8 x trn2.48xlarge, TP 32 x PP 4, ZeRO-1, sequence parallel,
    # selective recomputation, 1024 x 8192 tokens (DP 4: 256 micro-batches per step)
    result = plan(from_config(NXD_LLAMA3_70B), instance="trn2.48xlarge", instances=8, global_batch=1024,
                  seq_len=8192, checkpointing="selective", zero1=True, sequence_parallel=True,
                  layouts=[(32, 1, 4, 4)])
    lp = result.best
    kv = _kv_all_reduce(lp, 32)
    assert lp.micro_steps == 256 and kv.group_size == 4
    # 8192 tokens x one head of 128 x 4 bytes, K and V, 20 layers per stage, every micro-batch: twice the bf16 bytes
    assert kv.bytes == 8192 * 128 * 4 * 2 * 20 * 256
    assert kv.scope == "chip" and kv.levels[0] == 4  # 4 adjacent logical cores: one Trn2 chip at LNC=2


def test_the_trn1_twin_keeps_nxd_interleaved_kv_groups_over_neuronlink() -> None:
    from torch_neuronx.testing.plan import LLAMA3_8B
    from torch_neuronx.tools.plan import plan
    from torch_neuronx.tools.plan.model import from_config

    # Llama-3-8B at TP 32 on trn1.32xlarge (the NxD pretraining script's default): each head's 4 replicas are
    # 8 ranks apart, two cores per chip: the group spans chips
    result = plan(from_config(LLAMA3_8B), instance="trn1.32xlarge", instances=4, global_batch=1024, seq_len=8192,
                  checkpointing="selective", zero1=True, sequence_parallel=True, layouts=[(32, 1, 4)])
    lp = result.best
    kv = _kv_all_reduce(lp, 32)
    assert kv.scope == "neuronlink" and kv.levels[0] == 1 and kv.levels[1] == 4
    assert kv.bytes == 8192 * 128 * 4 * 2 * 32 * lp.micro_steps  # fp32 here too (bf16-mixed compute)


# 5. Inf2's HBM bandwidth: AWS states 820 GiB/s (about-neuron/arch/neuron-hardware/inferentia2.rst), as for Trn1
def test_inf2_hbm_bandwidth_is_820_gib_per_second() -> None:
    from torch_neuronx.runtime.instances import INF2, TRN1

    assert INF2.hbm_bandwidth_gbps * 1e9 == pytest.approx(820 * 2 ** 30)
    assert INF2.hbm_bandwidth_gbps == TRN1.hbm_bandwidth_gbps  # the same HBM figure on both NeuronCore-v2 chips
    hardware = (Path(__file__).resolve().parents[2] / "docs" / "hardware.md").read_text()
    row = next(line for line in hardware.splitlines() if line.startswith("| HBM bandwidth |"))
    assert row.split("|")[3].strip().startswith("820 GiB/s (880.5 GB/s")


# 6. LoRA (frozen base weights) is not modelled: docs/plan.md says so, with the figures the tool gives for Optimum
# Neuron's Llama-3.1-8B LoRA tutorial (trn1.32xlarge, TP 8 x DP 4, micro-batch 1, 2048 tokens, bf16)
def test_the_docs_name_lora_as_unmodelled_with_the_tutorials_figures() -> None:
    from torch_neuronx.testing.plan import LLAMA3_8B
    from torch_neuronx.tools.plan import plan
    from torch_neuronx.tools.plan.model import from_config

    lp = plan(from_config(LLAMA3_8B), instance="trn1.32xlarge", global_batch=64, seq_len=2048, precision="bf16",
              layouts=[(8, 1, 4)]).best
    gib = 2 ** 30
    figures = (f"{lp.memory.reserved / gib:.2f} GiB reserved per core", f"{lp.memory.grads / gib:.2f} GiB of",
               f"{lp.memory.optimizer / gib:.2f} GiB of AdamW state")
    assert not lp.fits and lp.memory.grads == lp.memory.params  # bf16: a gradient per weight, as full fine-tuning
    docs = (Path(__file__).resolve().parents[2] / "docs" / "plan.md").read_text()
    section = docs[docs.index("## What the planner does not model"):]
    text = " ".join(section.split())
    assert "LoRA and other frozen-base fine-tuning (PEFT) is planned as full fine-tuning" in text
    assert all(f in text for f in figures), figures
