"""`torch-neuronx migrate`, parameter by parameter: for every NxD layer and torch_xla call the tool rewrites, each
parameter of its published signature (positional order included) is either mapped with the same meaning or flagged
when given; docs/migrate.md's API x parameter x outcome table has one row per case here, and each row is tested.

Signatures: neuronx_distributed/parallel_layers/layers.py (aws-neuron/neuronx-distributed) and
torch_xla/core/xla_model.py, torch_xla/distributed/xla_multiprocessing.py (pytorch/xla). In-process, about 2 s.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torch_neuronx.tools.migrate.python import migrate_python
from torch_neuronx.tools.migrate.rules_nxd import INIT, SIGNATURES, Param

DOC = Path(__file__).parents[2] / "docs" / "migrate.md"
NXD_HEAD = ("from neuronx_distributed.parallel_layers import parallel_state\n"
            "from neuronx_distributed.parallel_layers.layers import ColumnParallelLinear, RowParallelLinear, "
            "ParallelEmbedding\n\n\nclass M:\n    def __init__(self):\n")
NXD_TAIL = "\n\nparallel_state.initialize_model_parallel(2)\nm = M()\n"
DEV = 'torch.device("neuron", int(os.environ.get("LOCAL_RANK", "0")))'  # what xm.xla_device() becomes
XM = "import torch_xla.core.xla_model as xm\n"
XMP = "import torch_xla.distributed.xla_multiprocessing as xmp\n"
PL = "import torch_xla.distributed.parallel_loader as pl\n"


def nxd(layer_line: str) -> str:
    return f"{NXD_HEAD}        self.l = {layer_line}\n{NXD_TAIL}"


def rules_of(code: str) -> tuple[str, list[str]]:
    res = migrate_python(code)
    return res.code, sorted({f.rule for f in res.flags})


# ------------------------------------------------------------------ NxD layers: every parameter, from the signature

def _nxd_rows() -> list[tuple[str, Param]]:
    return [(kind, p) for kind, params in SIGNATURES.items() for p in params[2:]]


def _required(kind: str) -> str:
    return "10, 4" if kind == "ParallelEmbedding" else "4, 8"


@pytest.mark.parametrize(("kind", "param"), _nxd_rows(), ids=[f"{k}-{p.name}" for k, p in _nxd_rows()])
def test_each_nxd_parameter_is_mapped_or_flagged(kind: str, param: Param) -> None:
    code, flags = rules_of(nxd(f"{kind}({_required(kind)}, {param.name}={param.sample})"))
    layer_line = next(ln for ln in code.splitlines() if "self.l = " in ln)
    plan_line = next((ln for ln in code.splitlines() if "parallelize_module(m," in ln), "")
    if param.outcome == "flag":
        assert flags == ["nxd-option"], code
        # its correct twin: the default value given explicitly is no flag
        _, twin_flags = rules_of(nxd(f"{kind}({_required(kind)}, {param.name}={param.default!s})"))
        assert twin_flags == [], param.default
        return
    assert flags == [], code
    if param.outcome == "kwarg":
        assert f"{param.native}={param.sample}" in layer_line
    elif param.outcome == "init":
        assert layer_line.strip().startswith("self.l = neuron_init_weight(torch.nn.") and \
            layer_line.strip().endswith(f", {param.sample})")
    elif param.outcome == "plan":
        expected = {"gather_output": "ColwiseParallel()", "input_is_parallel": "RowwiseParallel()",
                    "shard_across_embedding": "ColwiseParallel(output_layouts=Replicate())"}[param.name]
        assert f'"l": {expected}' in plan_line
    elif param.outcome == "skip-bias":
        assert "self.l = NeuronSkipBiasLinear(4, 8, dtype=torch.float32)" in layer_line and '"l.linear": ' in plan_line
    elif param.outcome == "padding":  # a positive literal: kept, and the weight initialised as NxD's (no zero row)
        assert layer_line.strip() == ("self.l = neuron_init_weight(torch.nn.Embedding(10, 4, "
                                      f"padding_idx={param.sample}, dtype=torch.float32), torch.nn.init.normal_)")
    else:
        assert param.outcome == "ignore" and param.name not in layer_line


POSITIONAL = {
    # NxD's examples give these positionally; each maps by position as NxD's signature orders them
    "embedding padding_idx (item 2)": ("ParallelEmbedding(10, 4, 2)", "neuron_init_weight(torch.nn.Embedding(10, 4, "
                                       "padding_idx=2, dtype=torch.float32), torch.nn.init.normal_)",
                                       '"l": RowwiseParallel(input_layouts=Replicate())', []),
    "column gather_output=False (item 4)": ("ColumnParallelLinear(4, 8, True, False)",
                                            "torch.nn.Linear(4, 8, bias=True, dtype=torch.float32)",
                                            '"l": ColwiseParallel()', []),
    "row input_is_parallel=True (item 4)": ("RowParallelLinear(8, 4, False, True)",
                                            "torch.nn.Linear(8, 4, bias=False, dtype=torch.float32)",
                                            '"l": RowwiseParallel()', []),
    "column stride=2 (item 1)": ("ColumnParallelLinear(4, 8, False, False, torch.float32, None, 2)",
                                 "torch.nn.Linear(4, 8, bias=False, dtype=torch.float32, device=None)",
                                 '"l": ColwiseParallel()', ["nxd-option"]),
    "column stride=1 (twin)": ("ColumnParallelLinear(4, 8, False, False, torch.float32, None, 1)",
                               "torch.nn.Linear(4, 8, bias=False, dtype=torch.float32, device=None)",
                               '"l": ColwiseParallel()', []),
    "embedding max_norm positional": ("ParallelEmbedding(10, 4, None, 1.0)", "torch.nn.Embedding(10, 4, "
                                      "dtype=torch.float32)", '"l": RowwiseParallel', ["nxd-option"]),
}


@pytest.mark.parametrize("name", list(POSITIONAL))
def test_positional_nxd_arguments_follow_the_signature(name: str) -> None:
    call, layer, plan, flags = POSITIONAL[name]
    code, got = rules_of(nxd(call))
    assert f"self.l = {layer}\n" in code and plan in code
    assert got == flags


def test_skip_bias_of_a_sharded_column_output_is_flagged() -> None:
    """NxD returned a bias *shard* there; the whole-bias layer would not add up: flagged, not translated."""
    code, flags = rules_of(nxd("ColumnParallelLinear(4, 8, gather_output=False, skip_bias_add=True)"))
    assert flags == ["nxd-option"] and "NeuronSkipBiasLinear" not in code
    code, flags = rules_of(nxd("ColumnParallelLinear(4, 8, skip_bias_add=True)"))  # gathered: the whole bias
    assert flags == [] and "self.l = NeuronSkipBiasLinear(4, 8, dtype=torch.float32)" in code


def test_a_class_built_inside_an_expression_has_its_plan_flagged() -> None:
    """Item 5: `Sequential(*[Block() for ...])` is no `x = Block()` statement, after which the plan would go."""
    block = (f"{NXD_HEAD}        self.up = ColumnParallelLinear(4, 8)\n\n\n"
             "parallel_state.initialize_model_parallel(2)\n")
    code, flags = rules_of(block + "model = torch.nn.Sequential(*[M() for _ in range(2)])\n")
    assert flags == ["nxd-plan"] and "is built inside an expression" in code
    assert "model = parallelize_module" not in code
    assert rules_of(block + "model = M(); n = 2\n")[1] == ["nxd-plan"]  # no line of its own: flagged too
    code, flags = rules_of(block + "model = M()\n")  # the twin: the plan is applied after the statement
    assert flags == [] and 'model = parallelize_module(model, neuron_mesh()["tp"], {"up": ' in code


def test_optimizers_of_a_planned_model_loop_over_parameters() -> None:
    code = "import torch\n" + nxd("ColumnParallelLinear(4, 8)") + "opt = torch.optim.AdamW(m.parameters(), lr=1e-3)\n"
    assert "opt = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False)" in rules_of(code)[0]
    plain = "import torch\nimport torch_xla\nopt = torch.optim.AdamW(p, lr=1e-3)\nd = torch_xla.device()\n"
    assert "opt = torch.optim.AdamW(p, lr=1e-3)\n" in rules_of(plain)[0]  # no plan: untouched


@pytest.mark.parametrize("param", INIT[1:], ids=[p.name for p in INIT[1:]])
def test_each_initialize_model_parallel_parameter_is_mapped_or_flagged(param: Param) -> None:
    head = "from neuronx_distributed.parallel_layers import parallel_state\n"
    code, flags = rules_of(head + f"parallel_state.initialize_model_parallel(2, {param.name}={param.sample})\n")
    assert "neuron_init_mesh(2)" in code
    assert flags == (["nxd-option"] if param.outcome == "flag" else [])
    if param.outcome == "flag":  # the twin: the default given explicitly
        assert rules_of(head + f"parallel_state.initialize_model_parallel(2, {param.name}={param.default})\n")[1] == []
    positional = rules_of(head + "parallel_state.initialize_model_parallel(2, 1, 1, 4)\n")  # expert_model_parallel
    assert positional[1] == ["nxd-option"]
    assert "initialize_model_parallel(expert_model_parallel_size=...)" in positional[0]


# ------------------------------------------------------------------ torch_xla calls: every parameter

XLA_ROWS: dict[tuple[str, str], tuple[str, str, list[str]]] = {
    # (API, parameter): (snippet, text the output holds, flags)
    ("xm.xla_device", "n"): (XM + "d = xm.xla_device(1)\n", 'd = ' + DEV, []),
    ("xm.xla_device", "devkind"): (XM + "d = xm.xla_device(devkind='TPU')\n", 'd = ' + DEV, []),
    ("xm.mark_step", "wait, reset_scope"): (XM + "x = 1\nxm.mark_step(wait=True)\n", "x = 1\n", []),
    ("xm.wait_device_ops", "devices"): (XM + "xm.wait_device_ops(['xla:0'])\n", "torch.neuron.synchronize()", []),
    ("xm.add_step_closure", "closure, args"): (XM + "xm.add_step_closure(log, (a, b))\nxm.mark_step()\n",
                                               "log(a, b)", []),
    ("xm.add_step_closure", "run_async"): (XM + "xm.add_step_closure(log, (a,), run_async=True)\nxm.mark_step()\n",
                                           "log(a)", []),
    ("xm.is_master_ordinal", "local"): (XM + "m = xm.is_master_ordinal(False)\n",
                                        'm = int(os.environ.get("RANK", "0")) == 0', []),
    ("xm.master_print", "fd"): (XM + "xm.master_print('x', fd=f)\n", "print('x', file=f, flush=True)", []),
    ("xm.master_print", "local"): (XM + "xm.master_print('x', local=True)\n",
                                   'if int(os.environ.get("LOCAL_RANK", "0")) == 0:\n    print(\'x\', flush=True)',
                                   []),
    ("xm.master_print", "flush"): (XM + "xm.master_print('x', flush=False)\n", "print('x', flush=True)", []),
    ("xm.master_print", "*args"): (XM + "xm.master_print('acc', xm.mesh_reduce('a', a, max))\n",
                                   "\nneuron_master_print('acc', neuron_mesh_reduce('a', a, max))\n", []),
    ("xm.rendezvous", "tag"): (XM + "xm.rendezvous('init')\n", "neuron_rendezvous()", []),
    ("xm.rendezvous", "payload"): (XM + "xm.rendezvous('init', b'x')\n", "xm.rendezvous('init', b'x')",
                                   ["import-kept", "xla-rendezvous-payload"]),
    ("xm.rendezvous", "replicas"): (XM + "xm.rendezvous('init', replicas=[0, 1])\n", "replicas=[0, 1]",
                                    ["import-kept", "xla-rendezvous-replicas"]),
    ("xm.optimizer_step", "optimizer_args"): (XM + "xm.optimizer_step(opt, optimizer_args=a)\n", "opt.step(**a)", []),
    ("xm.optimizer_step", "barrier"): (XM + "xm.optimizer_step(opt, barrier=True)\n", "opt.step()", []),
    ("xm.optimizer_step", "groups"): (XM + "xm.optimizer_step(opt, False, {}, [[0, 1]])\n",
                                      "xm.optimizer_step(opt, False, {}, [[0, 1]])", ["import-kept", "xla-groups"]),
    ("xm.optimizer_step", "pin_layout"): (XM + "xm.optimizer_step(opt, pin_layout=False)\n", "opt.step()", []),
    ("xm.reduce_gradients", "groups"): (XM + "xm.reduce_gradients(opt, [[0, 1]])\n",
                                        "xm.reduce_gradients(opt, [[0, 1]])", ["import-kept", "xla-groups"]),
    ("xm.reduce_gradients", "pin_layout"): (XM + "xm.reduce_gradients(opt, None, False)\n",
                                            "\nneuron_average_gradients(opt)\n", []),
    ("xm.all_reduce", "reduce_type"): (XM + "y = xm.all_reduce('max', x)\n",
                                       "y = neuron_all_reduce(torch.distributed.ReduceOp.MAX, x)", []),
    ("xm.all_reduce", "scale"): (XM + "y = xm.all_reduce(xm.REDUCE_SUM, x, 0.5)\n",
                                 "y = neuron_all_reduce(torch.distributed.ReduceOp.SUM, x, 0.5)", []),
    ("xm.all_reduce", "groups"): (XM + "y = xm.all_reduce(xm.REDUCE_SUM, x, groups=[[0, 1]])\n",
                                  "neuron_all_reduce(", ["xla-groups"]),
    ("xm.all_reduce", "pin_layout"): (XM + "y = xm.all_reduce(xm.REDUCE_SUM, x, groups=None, pin_layout=False)\n",
                                      "neuron_all_reduce(", []),
    ("xm.mesh_reduce", "tag, data, reduce_fn"): (XM + "a = xm.mesh_reduce('acc', acc, max)\n",
                                                 'data = neuron_to_device(data, "cpu")', []),
    ("xm.save", "master_only, global_master"): (XM + "xm.save(sd, 'c.pt', global_master=True)\n",
                                                "neuron_save(sd, 'c.pt', global_master=True)", []),
    ("xmp.spawn", "fn, args"): (XMP + "xmp.spawn(fn, args=(a,))\n", 'fn(int(os.environ.get("RANK", "0")), a)', []),
    ("torch_xla.launch", "fn, args"): ("import torch_xla\ntorch_xla.launch(fn, args=(a,))\n",
                                       'fn(int(os.environ.get("LOCAL_RANK", "0")), a)', []),
    ("xmp.spawn", "nprocs, join, daemon, start_method"): (XMP + "xmp.spawn(fn, nprocs=2, start_method='fork')\n",
                                                          'fn(int(os.environ.get("RANK", "0")))', []),
    ("pl.MpDeviceLoader", "**kwargs"): (PL + "l = pl.MpDeviceLoader(loader, dev, loader_prefetch_size=8)\n",
                                        "l = NeuronDeviceLoader(loader, dev)", []),
}


@pytest.mark.parametrize("key", list(XLA_ROWS), ids=[f"{a}-{p}" for a, p in XLA_ROWS])
def test_each_xla_parameter_is_mapped_or_flagged(key: tuple[str, str]) -> None:
    snippet, expected, flags = XLA_ROWS[key]
    code, got = rules_of(snippet)
    assert expected in code and got == flags, code


PS = "from neuronx_distributed.parallel_layers import parallel_state as ps\n"
NTA = "from optimum.neuron import NeuronTrainingArguments\n"
OTHER_ROWS: dict[tuple[str, str], tuple[str, str, list[str]]] = {
    # NxD's getters (parallel_state.py) and Optimum's arguments (training_args.py): (snippet, output holds, flags)
    ("get_tensor_model_parallel_group", "as_list"): (PS + "g = ps.get_tensor_model_parallel_group(as_list=True)\n",
                                                     "g = neuron_mesh().mesh.tolist()", []),
    ("get_data_parallel_group", "as_list"): (PS + "g = ps.get_data_parallel_group(True)\n",
                                             "g = neuron_mesh().mesh.t().tolist()", []),
    ("NeuronTrainingArguments", "per_device_train_batch_size, per_device_eval_batch_size, "
     "average_tokens_across_devices"): (NTA + "a = NeuronTrainingArguments(output_dir='o')\n",
                                        "per_device_train_batch_size=1, per_device_eval_batch_size=1, "
                                        "average_tokens_across_devices=False)", []),
    ("NeuronTrainingArguments", "positional arguments after output_dir"): (
        NTA + "a = NeuronTrainingArguments('o', True)\n", "a = NeuronTrainingArguments('o', True)",
        ["import-kept", "optimum-positional"]),
}


@pytest.mark.parametrize("key", list(OTHER_ROWS), ids=[f"{a}-{p[:20]}" for a, p in OTHER_ROWS])
def test_each_getter_and_optimum_default_row(key: tuple[str, str]) -> None:
    snippet, expected, flags = OTHER_ROWS[key]
    code, got = rules_of(snippet)
    assert expected in code and got == flags, code


def test_groups_none_and_empty_are_the_whole_world() -> None:
    for groups in ("None", "[]"):
        assert rules_of(XM + f"y = xm.all_reduce('sum', x, groups={groups})\n")[1] == []


# ------------------------------------------------------------------ the table in docs/migrate.md

def _doc_rows() -> set[tuple[str, str]]:
    text = DOC.read_text()
    table = text.split("<!-- api-parameter-table -->")[1].split("\n\n")[1]
    rows = set()
    for line in table.splitlines()[2:]:
        cells = [c.strip().replace("`", "") for c in line.strip("|").split("|")]
        rows.add((cells[0], re.sub(r" \(\d+\)$", "", cells[1])))
    return rows


def test_the_docs_table_has_one_row_per_tested_case() -> None:
    expected = {(kind, p.name) for kind, p in _nxd_rows()} | set(XLA_ROWS) | set(OTHER_ROWS) | {
        ("initialize_model_parallel", p.name) for p in INIT}
    assert _doc_rows() == expected
