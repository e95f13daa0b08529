"""The time model against AWS's published Trainium training results: held-out rows within 25% or explained."""

from __future__ import annotations

from pathlib import Path

import pytest

from torch_neuronx.tools.plan import calibration as cal
from torch_neuronx.tools.plan.timing import COMPUTE_EFFICIENCY, HBM_EFFICIENCY

DOCS = Path(__file__).resolve().parents[2] / "docs" / "plan.md"


def test_every_held_out_row_is_within_25_percent_or_its_miss_is_explained() -> None:
    rows = cal.results()
    assert len(rows) == len(cal.ROWS) >= 80  # every published row, every SDK release
    held = [e for e in rows if e["role"] == "held out"]
    assert len(held) >= 50
    for e in held:
        config = (e["model"], e["dtype"], e["nodes"], e["topology"], e["global_batch"])
        assert 0.75 <= e["ratio"] <= 1.25 or config in cal.MISSES, e
    # the explained misses are what they claim, and every reason is used
    used = {(e["model"], e["dtype"], e["nodes"], e["topology"], e["global_batch"]) for e in held
            if not 0.75 <= e["ratio"] <= 1.25}
    assert used == set(cal.MISSES)
    # every NxD row (the recipe PyTorch's FSDP/TP/PP/ZeRO-1 layouts correspond to) is within 25%
    assert all(0.75 <= e["ratio"] <= 1.25 for e in held if e["source"] == "NxD")


def test_fitted_rows_and_leave_one_out() -> None:
    fitted = [e for e in cal.results() if e["role"] == "fitted"]
    assert {(e["model"], e["dtype"], e["nodes"], e["topology"], e["global_batch"]) for e in fitted} == cal.FITTED
    for e in fitted:  # the fit without the row's configuration still predicts it within 0.5-2x
        assert 0.5 <= e["leave_one_out"] <= 2.0, e
    # the shipped factors are what the fit returns on the fitted rows (rounded to two places)
    fitted_rows = tuple(r for r in cal.ROWS if cal.is_fitted(r))
    assert not any(r in cal.OLDER_ROWS for r in fitted_rows)  # the earlier tables never enter the fit
    compute, hbm = cal.fit(fitted_rows)
    assert (round(compute, 2), round(hbm, 2)) == (COMPUTE_EFFICIENCY, HBM_EFFICIENCY)


def test_held_out_and_fitted_rows_are_reported_apart_and_none_is_outside_half_to_double() -> None:
    s = cal.summary()
    held, fitted = s["held out"], s["fitted"]
    assert held["rows"] + fitted["rows"] + s["not_planned"] + s["as_fitted"] == len(cal.ROWS)
    assert fitted["rows"] == sum(1 for r in cal.ROWS if cal.is_fitted(r))
    assert held["outside_half_to_double"] == 0 and 0.5 <= held["min_ratio"] and held["max_ratio"] <= 2.0
    # the honest figures against the goal of 90%: 51 of 58 held-out rows of the current tables within +-25% and 86 of
    # 101 with the earlier tables (NeMo's GPT-3 23B and 46B planned from AWS's recipe shapes, NeMo's scores timed in
    # HBM); every miss explained above. With NeMo's scores kept on chip instead, 91 of 101: the count hangs on a fact
    # no published source gives, and docs/plan.md says so
    current, earlier = held["tables 2.14-2.28"], held["tables 2.5-2.15"]
    assert current["rows"] + earlier["rows"] == held["rows"] and earlier["rows"] >= 40
    assert current["within_25_percent"] / current["rows"] >= 0.87
    assert held["within_25_percent"] / held["rows"] >= 0.85
    on_chip = held["NeMo scores kept on chip"]
    assert on_chip["rows"] == held["rows"] and on_chip["within_25_percent"] > held["within_25_percent"]
    assert on_chip["outside_half_to_double"] == 0
    assert sum(on_chip[f"tables {t}"]["rows"] for t in ("2.14-2.28", "2.5-2.15")) == on_chip["rows"]
    assert fitted["leave_one_out_within_25_percent"] >= 22  # was 4 of 28 before the terms above
    table = cal.calibration_table()
    assert f"held out: {held['within_25_percent']} of {held['rows']} rows within +-25%" in table
    assert f"fitted: {fitted['within_25_percent']} of {fitted['rows']} rows within +-25%" in table
    assert "Not covered: the tables of SDK 2.3 and 2.4" in table
    assert f"kept on chip by the compiler (no published source says whether neuronx-cc does): " \
           f"{on_chip['within_25_percent']} of {on_chip['rows']}" in table


def test_memory_bound_classes_move_fp32_twice_the_bf16_bytes_and_cost_bytes_over_bandwidth() -> None:
    from torch_neuronx.tools.plan.layouts import Layout, hardware
    from torch_neuronx.tools.plan.model import from_config
    from torch_neuronx.tools.plan.precision import precision
    from torch_neuronx.tools.plan.timing import stage_classes, vector_bytes

    m = from_config({**cal.SHAPES["BERT-Large"], "model_type": "llama"})
    lay = Layout(1, 1, 1)
    fp32 = vector_bytes(m, lay, precision("fp32"), 8, 128, "none", 0, attention="eager")
    bf16 = vector_bytes(m, lay, precision("bf16"), 8, 128, "none", 0, attention="eager")
    assert all(fp32[k] == 2 * bf16[k] for k in bf16 if k != "loss")  # the loss upcasts to FP32 in both
    # by hand: 24 layers x 3 passes (forward + backward's two) x 1024 tokens x 16 heads x 128 x 11 passes x 4 bytes
    assert fp32["softmax"] == 24 * 3 * 1024 * 16 * 128 * 11 * 4
    assert fp32["norms"] == 24 * 3 * 2 * 1024 * 1024 * 2 * 4
    assert vector_bytes(m, lay, precision("fp32"), 8, 128, "none", 0)["softmax"] == 0  # flash: scores on chip
    hw = hardware("trn1.32xlarge")
    t = stage_classes(m, hw, lay, precision("fp32"), 8, 128, "none", 0, "matmult", COMPUTE_EFFICIENCY,
                      causal=False, attention="eager")
    hbm = 820 * 2**30 / 2  # AWS: 820 GiB/s per Trainium chip, 2 cores
    assert t["softmax"] == pytest.approx(fp32["softmax"] / (hbm * HBM_EFFICIENCY))


def test_every_published_layout_fits_the_memory_model() -> None:
    from torch_neuronx.tools.plan import evaluate
    from torch_neuronx.tools.plan.layouts import Layout, hardware
    from torch_neuronx.tools.plan.model import from_config

    seen = set()
    for r in cal.ROWS:
        s = cal.setup(r)
        if s.shape is None or cal.config_of(r) in seen:
            continue
        seen.add(cal.config_of(r))
        hw = hardware("trn1.32xlarge", r.nodes)
        lp = evaluate(from_config({**s.shape, "model_type": "llama"}), hw, Layout(s.tp, 1, s.dp, s.pp),
                      precision=s.precision, global_batch=r.global_batch, seq_len=s.seq_len,
                      micro_batch=r.micro_batch, checkpointing=s.checkpointing, capacity=hw.hbm_per_core,
                      zero1=s.zero1, sequence_parallel=s.sp, reserve=0)
        assert lp.fits, (r, lp.memory.as_dict())


def test_fp32_miss_brackets_the_published_figure() -> None:
    row = next(r for r in cal.ROWS if r.dtype == "FP32" and r.sdk == "2.28.0")
    cast, fp32 = cal.predict(row), cal.predict(row, autocast="none")
    assert cast is not None and fp32 is not None
    assert fp32 < row.seq_per_s < cast and fp32 / row.seq_per_s == pytest.approx(0.47, abs=0.07)


def test_docs_carry_the_calibration_table() -> None:
    table = cal.calibration_table()
    text = DOCS.read_text()
    for line in table.splitlines()[2:]:
        assert line in text, line


def test_no_held_out_row_is_planned_as_a_fitted_configuration() -> None:
    # the planted fault: the page's "TP=32 DP=32 PP=1" Llama-3.1-8B rows are planned with ZeRO-1 like every NxD row,
    # and "TP=8 DP=32 PP=8" Llama2-13B on 32 nodes has DP 16 by the page's rule: both are fitted configurations
    fitted_plans = {cal.planned_as(r) for r in cal.ROWS if cal.config_of(r) in cal.FITTED}
    rows = dict(zip(cal.ROWS, cal.results(), strict=True))
    leaks = [r for r, e in rows.items() if e["role"] == "held out" and cal.planned_as(r) in fitted_plans]
    assert leaks == []
    as_fitted = sorted((r.model, r.topology, r.sdk) for r, e in rows.items() if e["role"] == "as fitted"
                       and r not in cal.OLDER_ROWS)
    # an earlier table's row of a fitted configuration is planned exactly as the fitted rows: 'as fitted', never held
    assert all(e["role"] == "as fitted" for r, e in rows.items()
               if r in cal.OLDER_ROWS and cal.config_of(r) in cal.FITTED)
    assert as_fitted == [("Llama-3.1-8B", "TP=32 DP=32 PP=1", "2.20.0"), ("Llama-3.1-8B", "TP=32 DP=32 PP=1", "2.21.0"),
                         ("Llama2-13B", "TP=8 DP=32 PP=8", "2.20.0")]
    # the correct twin: a held-out row of another layout (TP=8 DP=32 PP=4) stays held out
    assert all(e["role"] == "held out" for r, e in rows.items() if r.model == "Llama2-13B" and "PP=4" in r.topology
               and r.source == "NxD")


def test_fp32_operand_casts_are_counted_by_hand_and_only_for_cast_fp32_activations() -> None:
    from torch_neuronx.tools.plan.layouts import Layout
    from torch_neuronx.tools.plan.model import from_config
    from torch_neuronx.tools.plan.precision import precision
    from torch_neuronx.tools.plan.timing import cast_bytes, vector_bytes

    m = from_config({**cal.SHAPES["BERT-Large"], "model_type": "llama"})
    lay = Layout(1, 1, 1)
    h, width, tokens, s, heads = 1024, 2731, 8 * 128, 128, 16
    # forward: 3 layer inputs + the MLP-down input + q, k, v + the probabilities; backward: the gradients at q, k, v,
    # at the two H-wide outputs, at the two MLP-wide outputs, at the attention output and at the scores
    forward = 3 * h + width + 3 * h + heads * s
    backward = 3 * h + 2 * h + 2 * width + h + heads * s
    by_hand = (24 * tokens * (forward + backward) + 24 * m.layer_params) * 6
    assert cast_bytes(m, lay, 8, 128, "none", 0, attention="eager") == by_hand
    fp32 = vector_bytes(m, lay, precision("fp32"), 8, 128, "none", 0, attention="eager")
    assert fp32["autocast"] == by_hand
    # the correct twins: no cast when the activations are BF16, or when the compiler leaves FP32 matmuls alone
    assert "autocast" not in vector_bytes(m, lay, precision("bf16"), 8, 128, "none", 0, attention="eager")
    assert "autocast" not in vector_bytes(m, lay, precision("fp32"), 8, 128, "none", 0, autocast="none")


def test_gelu_learned_positions_and_a_gradient_all_reduce_after_the_backward() -> None:
    from torch_neuronx.tools.plan import evaluate
    from torch_neuronx.tools.plan.layouts import Layout, hardware
    from torch_neuronx.tools.plan.model import from_config
    from torch_neuronx.tools.plan.precision import precision
    from torch_neuronx.tools.plan.timing import vector_bytes

    m = from_config({**cal.SHAPES["BERT-Large"], "model_type": "llama"})
    lay = Layout(1, 1, 1)
    swiglu = vector_bytes(m, lay, precision("bf16"), 8, 128, "none", 0)
    gelu = vector_bytes(m, lay, precision("bf16"), 8, 128, "none", 0, mlp="gelu", rope=False)
    assert gelu["activation"] * 5 == swiglu["activation"] * 3 and gelu["rope"] == 0 < swiglu["rope"]
    # BERT-Large AMP on 16 nodes, 2 micro-batches: the all-reduce issued after the backward (torch-xla's
    # xm.reduce_gradients) adds to the step; overlapped with the last backward (DDP's buckets) it hides
    hw = hardware("trn1.32xlarge", 16)
    plans = {overlap: evaluate(m, hw, Layout(1, 1, 512), precision="fp32", global_batch=16384, seq_len=128,
                               micro_batch=16, checkpointing="none", capacity=hw.hbm_per_core, causal=False,
                               attention="eager", grad_overlap=overlap).time for overlap in (True, False)}
    assert plans[True].exposed_comm == 0.0 < plans[False].exposed_comm
    assert plans[False].total - plans[True].total == pytest.approx(plans[False].exposed_comm)


def test_earlier_tables_name_their_release_and_agree_with_aws_mfu() -> None:
    # every earlier-table row names an SDK release before the current tables' last and is held out, 'as fitted' or
    # not planned (never fitted); where AWS gives its MFU, 6 x parameters x tokens/s over the cores' BF16 peak agrees
    # with it (a check on the transcribed nodes and throughput, independent of the time model)
    from torch_neuronx.tools.plan.layouts import hardware
    from torch_neuronx.tools.plan.model import from_config

    hw = hardware("trn1.32xlarge")
    core_peak = hw.instance.chip.bf16_tflops * 1e12 / hw.cores_per_chip
    assert len(cal.OLDER_ROWS) >= 60
    for r in cal.OLDER_ROWS:
        assert (2, 5) <= tuple(int(x) for x in r.sdk.split(".")[:2]) <= (2, 15) and not cal.is_fitted(r)
        if r.mfu and cal.setup(r).shape is not None and "BERT" not in r.model:
            m = from_config({**cal.SHAPES[r.model], "model_type": "llama"})
            mfu = 6 * m.total_params * r.seq_per_s * r.seq_len / (r.nodes * 32 * core_peak) * 100
            # within 0.75-1.0x of AWS's figure (which counts some FLOPs beyond 6 per parameter per token: 0.76x for
            # NeMo's Llama2-7B in SDK 2.13.1, 0.90-0.95x elsewhere); a wrong node count would be 0.5x or 2x
            assert 0.75 * r.mfu <= mfu <= r.mfu, (r, mfu)


def test_materialised_scores_cost_their_passes_and_their_whole_square() -> None:
    # NeMo's core attention writes the scores to HBM like Transformers' eager path: 11 passes with attention dropout
    # (GPT-3's 0.1), 8 without (Llama's 0: ATen's dropout returns its input at p=0); only a flash kernel skips the
    # causal mask's upper half, so materialised scores cost the whole square of attention FLOPs
    from torch_neuronx.tools.plan.layouts import Layout, hardware
    from torch_neuronx.tools.plan.model import from_config
    from torch_neuronx.tools.plan.precision import precision
    from torch_neuronx.tools.plan.timing import SCORE_PASSES, stage_classes, vector_bytes

    assert SCORE_PASSES == {"flash": 0, "eager": 11, "eager_no_dropout": 8, "eager_no_scale_no_dropout": 6,
                            "fused": 0}
    m = from_config({**cal.SHAPES["Llama2-7B"], "model_type": "llama"})
    lay = Layout(8, 1, 64)
    bf16 = precision("bf16")
    no_dropout = vector_bytes(m, lay, bf16, 1, 4096, "full", 0, sp=True, attention="eager_no_dropout")
    # by hand: 32 layers x 4 passes (forward, recomputed forward, backward's two) x 4096 tokens x 32/8 heads x 4096
    # keys x 8 passes x 2 bytes
    assert no_dropout["softmax"] == 32 * 4 * 4096 * 4 * 4096 * 8 * 2
    assert vector_bytes(m, lay, bf16, 1, 4096, "full", 0, sp=True, attention="eager")["softmax"] * 8 == \
        no_dropout["softmax"] * 11
    hw = hardware("trn1.32xlarge", 16)

    def matmul(attention: str, causal: bool) -> float:
        return stage_classes(m, hw, lay, bf16, 1, 4096, "full", 0, "matmult", 1.0, causal, True, attention)["matmul"]

    # the whole square against half of it: attention's 4 x S x heads x head_dim FLOPs per token per layer against 2
    half = 4 * 4096 * 32 * 128 * 32 * 4096 * 4 / 8 / 2 / (hw.instance.chip.bf16_tflops * 1e12 / hw.cores_per_chip)
    assert matmul("eager_no_dropout", True) - matmul("flash", True) == pytest.approx(half)
    assert matmul("eager_no_dropout", True) == matmul("flash", False) == matmul("eager", False) == \
        matmul("fused", True)
    # "fused" (the sensitivity): the whole square, its scores on chip, so no cast of them either
    assert vector_bytes(m, lay, bf16, 1, 4096, "full", 0, sp=True, attention="fused")["softmax"] == 0
    fp32 = precision("fp32")
    assert vector_bytes(m, lay, fp32, 1, 4096, "full", 0, sp=True, attention="fused")["autocast"] == \
        vector_bytes(m, lay, fp32, 1, 4096, "full", 0, sp=True, attention="flash")["autocast"]
    # selective checkpointing recomputes materialised attention (Megatron's core-attention recompute): its score
    # passes and its two matmuls once more; a flash kernel's recompute is inside its backward
    sel = vector_bytes(m, lay, bf16, 1, 4096, "selective", 0, sp=True, attention="eager")["softmax"]
    assert sel == 32 * 4 * 4096 * 4 * 4096 * 11 * 2
    core = 4 * 4096 * 32 * 128 * 32 * 4096 / 8 / (hw.instance.chip.bf16_tflops * 1e12 / hw.cores_per_chip)

    def selective(attention: str) -> float:
        return stage_classes(m, hw, lay, bf16, 1, 4096, "selective", 0, "matmult", 1.0, True, True, attention)["matmul"]

    assert selective("eager") - matmul("eager", True) * 3 / 4 == pytest.approx(core)
    assert selective("flash") == pytest.approx(matmul("flash", True) * 3 / 4)
    # selective's recomputed core casts q, k, v and the probabilities again (FP32 activations with eager attention)
    from torch_neuronx.tools.plan.timing import cast_bytes
    again = 32 * 4096 * (32 * 128 / 8 * 3 + 4 * 4096) * 6
    assert cast_bytes(m, lay, 1, 4096, "selective", 0, True, "eager") - \
        cast_bytes(m, lay, 1, 4096, "none", 0, True, "eager") == again
    # an unknown path or checkpointing is refused, naming the known ones, wherever it enters
    with pytest.raises(ValueError, match="not one of flash, eager"):
        vector_bytes(m, lay, bf16, 1, 4096, "full", 0, attention="sdpa")
    with pytest.raises(ValueError, match="not one of flash, eager"):
        cast_bytes(m, lay, 1, 4096, "full", 0, True, "sdpa")
    with pytest.raises(ValueError, match="not one of none, selective, full"):
        vector_bytes(m, lay, bf16, 1, 4096, "partial", 0, attention="eager")


def test_nemo_rows_materialise_the_scores_and_the_contradicted_node_count_is_corrected() -> None:
    rows = dict(zip(cal.ROWS, cal.results(), strict=True))
    for r, e in rows.items():
        s = cal.setup(r)
        if s.shape is None:
            continue
        expected = ("flash" if r.source != "NeMo" and "BERT" not in r.model else
                    "eager" if r.model.startswith("GPT3") or "BERT" in r.model else
                    # SDK 2.14's Llama2-13B recipe: test_llama_mixed_precision.sh, no query-key layer scaling
                    "eager_no_scale_no_dropout" if r.sdk == "2.14.0" and r.model == "Llama2-13B" else
                    "eager_no_dropout")
        assert s.attention == expected, r
        # NeMo: BF16 with stochastic rounding but SDK 2.14's mixed-precision Llama2-13B recipe (FP32 main weights);
        # its vocabulary padded to a multiple of 128 x TP (GPT config) or 8 x TP (Llama config)
        if r.source == "NeMo":
            assert (s.precision == "bf16-mixed") == (expected == "eager_no_scale_no_dropout"), r
            multiple = (128 if r.model.startswith("GPT3") else 8) * s.tp
            padding = s.shape["vocab_size"] - cal.SHAPES[r.model]["vocab_size"]
            assert s.shape["vocab_size"] % multiple == 0 and 0 <= padding < multiple
        assert e["planned_nodes"] == s.nodes  # the JSON rows give the nodes planned
        # only the two rows AWS's own figures contradict are planned on another node count, and they say so
        key = (*cal.config_of(r), r.sdk)
        assert s.nodes == cal.RUN_ON.get(key, r.nodes)
        assert ("planned on 32 nodes, not the page's 16" in e["note"]) == (key in cal.RUN_ON)
    # SDK 2.14's mixed-precision script is Llama2-13B's only: its llama_7b.sh ran test_llama.sh (the correct twin)
    seven = next(r for r in cal.ROWS if r.model == "Llama2-7B" and r.source == "NeMo")._replace(sdk="2.14.0")
    assert (cal.setup(seven).attention, cal.setup(seven).precision) == ("eager_no_dropout", "bf16")
    # the evidence, from the rows themselves: the same code's 2.15 figure on 32 nodes with AWS's MFU, and the highest
    # MFU AWS published; 64 seq/s on 16 nodes would be more than that, on 32 nodes it is 1.07x the 2.15 run
    same_code = next(r for r in cal.ROWS if r.model == "Llama2-13B" and r.source == "NeMo" and r.sdk == "2.15.0")
    # a row no table publishes is planned too (its own prediction, not a published twin's)
    assert cal.predict(same_code._replace(global_batch=2048)) != cal.predict(same_code)
    assert same_code.nodes == 32 and same_code.mfu is not None
    top = max(r.mfu for r in cal.ROWS if r.mfu)
    for key, nodes in cal.RUN_ON.items():
        r = next(r for r in cal.ROWS if (*cal.config_of(r), r.sdk) == key)
        assert r.nodes == 16 and nodes == same_code.nodes
        implied = same_code.mfu * (r.seq_per_s / same_code.seq_per_s) * (same_code.nodes / r.nodes)
        assert implied > 1.3 * top
        assert r.seq_per_s / same_code.seq_per_s == pytest.approx(1.07, abs=0.01)
        # its prediction is the 2.15 row's (the planner cannot tell them apart), and it stays a counted miss
        assert cal.predict(r) == pytest.approx(cal.predict(same_code))
        assert cal.predict(r) != cal.predict(next(x for x in cal.ROWS if x.sdk == "2.14.0" and x.model == r.model
                                                  and x.source == "NeMo"))
        assert rows[r]["role"] == "held out" and not 0.75 <= rows[r]["ratio"] <= 1.25
