"""`torch-neuronx migrate`: each rewrite against the hand-written native form, aliases, flags with TODOs, the
report, exit codes, bad input, notebooks and launchers; on the whole corpus: the output parses, a second
migration changes nothing, and no reference to the migrated families is left unflagged.

Static: nothing here imports torch_xla or optimum-neuron (neither is installed). Runs in a few seconds.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper

from torch_neuronx.tools.cli import main as cli_main
from torch_neuronx.tools.migrate.engine import migrate_paths, migrate_source
from torch_neuronx.tools.migrate.names import Aliases, RefIndex, in_family
from torch_neuronx.tools.migrate.python import CPU, TODO, migrate_python

CORPUS = Path(__file__).parent / "migrate_corpus"
DEV = 'torch.device("neuron", int(os.environ.get("LOCAL_RANK", "0")))'  # what xm.xla_device() becomes


def mig(code: str, target=None) -> str:
    return migrate_python(code, target or migrate_python.__defaults__[0]).code


def unflagged_references(code: str) -> list[str]:
    """Family references in migrated code whose statement has no TODO comment above it (must be none)."""
    module = cst.parse_module(code)
    aliases = Aliases()
    aliases.add_module(module)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    index = RefIndex(aliases)
    wrapper.visit(index)
    bad = []
    for ref in index.refs.values():
        stmt = ref.statement
        lines = [*(module.header if module.body and stmt is module.body[0] else []),
                 *getattr(stmt, "leading_lines", [])]
        comments = [ln.comment.value for ln in lines if ln.comment is not None]
        if not any(c.startswith(TODO) for c in comments):
            bad.append(f"line {ref.line}: {ref.qualname}")
    for i, stmt in enumerate(module.body):  # imports of the families: only with a TODO (kept for flagged code)
        if isinstance(stmt, cst.SimpleStatementLine) and any(isinstance(s, (cst.Import, cst.ImportFrom))
                                                             for s in stmt.body):
            text = module.code_for_node(stmt)
            mods = [module.code_for_node(s.module) if isinstance(s, cst.ImportFrom) and s.module else
                    " ".join(module.code_for_node(a.name) for a in s.names)  # type: ignore[union-attr]
                    for s in stmt.body if isinstance(s, (cst.Import, cst.ImportFrom))]
            if not any(in_family(x) for m in mods for x in m.split()):
                continue
            if i == 0:  # libcst keeps the comments above the first statement in the module's header
                text = "".join(module.code_for_node(ln) for ln in module.header) + text
            if TODO not in text:
                bad.append(f"import: {text.strip()}")
    return bad


# ------------------------------------------------------------------ rewrites, one by one

CASES = {
    "xla_device": ("import torch_xla.core.xla_model as xm\nd = xm.xla_device()\n", ['d = ' + DEV]),
    "torch_xla.device": ("import torch_xla\nd = torch_xla.device()\n", ['d = ' + DEV]),
    "mark_step removed, comment kept": (
        "import torch_xla.core.xla_model as xm\nfor i in range(2):\n    # run the graph\n    xm.mark_step()\n",
        ["for i in range(2):\n    # run the graph\n    pass\n"]),
    "sync removed": ("import torch_xla\nx = 1\ntorch_xla.sync()\ny = 2\n", ["x = 1\ny = 2\n"]),
    "mark_step in a one-line suite": ("import torch_xla.core.xla_model as xm\nif x: xm.mark_step()\n",
                                      ["if x: pass\n"]),
    "wait_device_ops": ("import torch_xla.core.xla_model as xm\nxm.wait_device_ops()\n",
                        ["torch.neuron.synchronize()"]),
    "add_step_closure": ("import torch_xla.core.xla_model as xm\nxm.add_step_closure(log, args=(step, loss))\n",
                         ["log(step, loss)"]),
    "add_step_closure args name": ("import torch_xla.core.xla_model as xm\nxm.add_step_closure(log, a)\n",
                                   ["log(*a)"]),
    "get_ordinal": ("import torch_xla.core.xla_model as xm\nr = xm.get_ordinal()\n",
                    ['r = int(os.environ.get("RANK", "0"))', "import os"]),
    "runtime ordinals": ("import torch_xla.runtime as xr\nr, w, l = xr.global_ordinal(), xr.world_size(), "
                         "xr.local_ordinal()\n",
                         ['int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")), '
                          'int(os.environ.get("LOCAL_RANK", "0"))']),
    "is_master_ordinal is local": ("import torch_xla.core.xla_model as xm\nm = xm.is_master_ordinal()\n",
                                   ['m = int(os.environ.get("LOCAL_RANK", "0")) == 0']),
    "is_master_ordinal global": ("import torch_xla.core.xla_model as xm\nm = xm.is_master_ordinal(local=False)\n",
                                 ['m = int(os.environ.get("RANK", "0")) == 0']),
    "master_print is global": ("import torch_xla.core.xla_model as xm\nxm.master_print('x', fd=f)\n",
                               ['if int(os.environ.get("RANK", "0")) == 0:\n    print(\'x\', file=f, flush=True)']),
    "rendezvous": ("import torch_xla.core.xla_model as xm\nxm.rendezvous('init')\n",
                   ["neuron_rendezvous()",
                    "if neuron_init_group():\n        torch.distributed.barrier()"]),
    "init_process_group xla": ("import torch.distributed as dist\ndist.init_process_group('xla', init_method="
                               "'xla://')\n", ["\nneuron_init_group(world_of_one=True)\n"]),  # rv32f item 7
    "init_process_group xla env": ("import torch.distributed as dist\ndist.init_process_group('xla')\n",
                                   ["dist.init_process_group('neuron')"]),
    "init_process_group backend kw": ("import torch\ntorch.distributed.init_process_group(backend=\"xla\")\n",
                                      ['torch.distributed.init_process_group(backend="neuron")']),
    "device strings": ("import torch\ndevice = 'xla'\nx = t.to('xla')\ny = torch.zeros(2, device=\"xla:0\")\n",
                       ["device = 'neuron'", "t.to('neuron')", 'device="neuron"']),
    "autocast": ("import torch\nwith torch.autocast('xla', dtype=torch.bfloat16):\n    pass\n",
                 ["torch.autocast('neuron', dtype=torch.bfloat16)"]),
    "xla amp autocast": ("import torch_xla.amp\nwith torch_xla.amp.autocast(device, dtype=torch.bfloat16):\n    pass\n",
                         ['torch.autocast("neuron", dtype=torch.bfloat16)']),
    "syncfree": ("from torch_xla.amp.syncfree import AdamW\nopt = AdamW(params, lr=1)\n",
                 ["opt = torch.optim.AdamW(params, lr=1)"]),
    "optimizer_step statement": ("import torch_xla.core.xla_model as xm\nxm.optimizer_step(opt)\n",
                                 ["neuron_average_gradients(opt)\nopt.step()\n", "def neuron_average_gradients"]),
    "optimizer_step value": ("import torch_xla.core.xla_model as xm\nloss = xm.optimizer_step(opt, optimizer_args="
                             "{'closure': c})\n",
                             ["loss = neuron_optimizer_step(opt, optimizer_args={'closure': c})",
                              "def neuron_optimizer_step", "def neuron_average_gradients"]),
    "reduce_gradients": ("import torch_xla.core.xla_model as xm\nxm.reduce_gradients(opt)\nopt.step()\n",
                         ["neuron_average_gradients(opt)\nopt.step()"]),
    "MpDeviceLoader": ("import torch_xla.distributed.parallel_loader as pl\nl = pl.MpDeviceLoader(loader, dev)\n",
                       ["l = NeuronDeviceLoader(loader, dev)", "class NeuronDeviceLoader", "def neuron_to_device"]),
    "ParallelLoader": ("import torch_xla.distributed.parallel_loader as pl\n"
                       "l = pl.ParallelLoader(loader, [dev]).per_device_loader(dev)\n",
                       ["l = NeuronDeviceLoader(loader, dev)"]),
    "save": ("import torch_xla.core.xla_model as xm\nxm.save(sd, 'c.pt')\n", ["neuron_save(sd, 'c.pt')",
                                                                             "def neuron_save"]),
    "all_reduce": ("import torch_xla.core.xla_model as xm\ny = xm.all_reduce(xm.REDUCE_SUM, x, scale=0.5)\n",
                   ["y = neuron_all_reduce(torch.distributed.ReduceOp.SUM, x, scale=0.5)"]),
    "mesh_reduce": ("import torch_xla.core.xla_model as xm\na = xm.mesh_reduce('acc', acc, np.mean)\n",
                    ["a = neuron_mesh_reduce('acc', acc, np.mean)"]),
    "spawn": ("import torch_xla.distributed.xla_multiprocessing as xmp\nif __name__ == '__main__':\n"
              "    xmp.spawn(_mp_fn, args=(flags,), nprocs=8)\n",
              ['    if "WORLD_SIZE" in os.environ and not torch.distributed.is_initialized():',
               '        torch.distributed.init_process_group("neuron")',
               '    _mp_fn(int(os.environ.get("RANK", "0")), flags)']),
    "inside f-strings": ("import torch_xla.core.xla_model as xm\nprint(f\"rank {xm.get_ordinal()}\")\n"
                         "print(f'{xm.xla_device()}')\n",
                         ["print(f\"rank {int(os.environ.get('RANK', '0'))}\")",
                          "print(f'{torch.device(\"neuron\", int(os.environ.get(\"LOCAL_RANK\", \"0\")))}')"]),
    "spawn in a one-line suite": ("import torch_xla.distributed.xla_multiprocessing as xmp\n"
                                  "if __name__ == '__main__': xmp.spawn(main)\n",
                                  ['if __name__ == \'__main__\':\n    if "WORLD_SIZE" in os.environ and not '
                                   'torch.distributed.is_initialized():']),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_rewrite_gives_the_native_form(name: str) -> None:
    code, expected = CASES[name]
    out = mig(code)
    for fragment in expected:
        assert fragment in out, f"{name}: {fragment!r} not in\n{out}"
    assert "torch_xla" not in out, out
    compile(out, name, "exec")
    assert mig(out) == out, "a second migration changed the output"


@pytest.mark.parametrize("imports,call", [
    ("import torch_xla.core.xla_model as xm", "xm.xla_device()"),
    ("import torch_xla.core.xla_model as anything", "anything.xla_device()"),
    ("from torch_xla.core import xla_model as xmm", "xmm.xla_device()"),
    ("from torch_xla.core.xla_model import xla_device", "xla_device()"),
    ("from torch_xla.core.xla_model import xla_device as get_dev", "get_dev()"),
    ("import torch_xla.core.xla_model", "torch_xla.core.xla_model.xla_device()"),
    ("import torch_xla", "torch_xla.core.xla_model.xla_device()"),
])
def test_imports_and_aliases_are_followed(imports: str, call: str) -> None:
    out = mig(f"{imports}\n\ndevice = {call}\n")
    assert 'device = torch.device("neuron", int(os.environ.get("LOCAL_RANK", "0")))' in out
    assert "torch_xla" not in out and not unflagged_references(out)


def test_names_that_only_look_like_xla_are_left_alone() -> None:
    code = ("import torch\n\n\ndef mark_step():\n    pass\n\n\nxm = Helper()\nxm.mark_step()\nmark_step()\n"
            "print('xla')\nname = 'xla'\nobj.xm.save(x)\nf(xm=1)\n")
    assert mig(code) == code  # not imported from torch_xla: not a reference


def test_comments_and_formatting_survive() -> None:
    code = ('"""Doc."""\nimport torch_xla.core.xla_model as xm  # the XLA model\n\n\n'
            "def step(  model,opt ):   # odd spacing stays\n"
            "    # leading comment\n    loss = model( 1 )  # trailing\n"
            "    xm.optimizer_step(opt)   # average + step\n\n    return   loss\n")
    out = mig(code)
    for kept in ["def step(  model,opt ):   # odd spacing stays", "    # leading comment",
                 "    loss = model( 1 )  # trailing", "    return   loss", '"""Doc."""']:
        assert kept in out
    assert "neuron_average_gradients(opt)\n    opt.step()" in out


def test_cpu_target_writes_the_reference_twin() -> None:
    code = ("import torch_xla.core.xla_model as xm\nimport torch.distributed as dist\n"
            "dist.init_process_group('xla')\nd = xm.xla_device()\nxm.wait_device_ops()\n")
    out = mig(code, CPU)
    assert "dist.init_process_group('gloo')" in out and 'torch.device("cpu")' in out
    assert "torch.cpu.synchronize()" in out


# ------------------------------------------------------------------ flags

def test_what_has_no_rewrite_is_flagged_with_a_todo_at_its_line() -> None:
    code = ("import torch_xla.core.xla_model as xm\n"
            "from torch_xla.distributed.zero_redundancy_optimizer import ZeroRedundancyOptimizer\n"
            "import torch_xla.utils.serialization as xser\n\n"
            "opt = ZeroRedundancyOptimizer(params, torch.optim.AdamW)\n"
            "xser.save(sd, 'ckpt')\n"
            "x = xm.rendezvous('t', b'payload')\n"
            "os.environ['XLA_USE_BF16'] = '1'\n"
            "d = xm.xla_device()\n")
    res = migrate_python(code)
    rules = {f.rule: f for f in res.flags}
    assert {"xla-zero", "xser", "xla-rendezvous-payload", "bf16-env", "import-kept"} <= set(rules)
    assert rules["xla-zero"].line == 5 and "FSDP2" in rules["xla-zero"].suggestion
    assert rules["xser"].line == 6 and "DCP" in rules["xser"].suggestion
    out = res.code
    lines = out.splitlines()
    i = lines.index("opt = ZeroRedundancyOptimizer(params, torch.optim.AdamW)")
    assert any(TODO in ln and "ZeroRedundancyOptimizer" in ln for ln in lines[i - 3:i])
    assert 'd = torch.device("neuron", int(os.environ.get("LOCAL_RANK", "0")))' in out  # the rest is still migrated
    assert not unflagged_references(out)
    again = migrate_python(out)
    assert again.code == out and again.flags  # idempotent, and the flags stay open


@pytest.mark.parametrize("code,rule", [
    ("import torch_neuronx\nm = torch_neuronx.trace(model, x)\n", "inference-trace"),
    ("from optimum.neuron import NeuronModelForCausalLM\nm = NeuronModelForCausalLM.from_pretrained('x')\n",
     "optimum-inference"),
    ("from neuronx_distributed.pipeline import NxDPPModel\nm = NxDPPModel(model)\n", "nxd-pipeline"),
    ("from torch_neuronx.xla_impl import custom_op\ncustom_op.load(name='relu')\n", "custom-op"),
    ("from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP\nm = FSDP(model)\n", "xla-fsdp"),
    ("from neuronx_distributed.lightning import NeuronLTModule\nm = NeuronLTModule()\n", "lightning"),
    ("from torch_xla.core.xla_model import *\nd = xla_device()\n", "star-import"),
    ("import torch_xla.debug.metrics as met\nprint(met.metrics_report())\n", "xla-metrics"),
])
def test_declined_and_unmappable_features_are_flagged(code: str, rule: str) -> None:
    res = migrate_python(code)
    assert rule in {f.rule for f in res.flags}, res.flags
    assert not unflagged_references(res.code) or rule == "star-import"
    compile(res.code, "x", "exec")


def test_a_flagged_argument_keeps_its_statement_whole() -> None:
    """master_print(met.metrics_report()): the flagged argument stays on one line with its TODO (a second run adds
    nothing), instead of moving into an `if` block away from it."""
    code = ("import torch_xla.core.xla_model as xm\nimport torch_xla.debug.metrics as met\n\n"
            "if debug:\n    xm.master_print(met.metrics_report())\nif debug: xm.master_print(met.metrics_report())\n"
            "xm.master_print(os.getenv('XLA_IR_DEBUG'))\n")
    res = migrate_python(code)
    # evaluated on every rank, as XLA's master_print (a plain function) did; printed on the master
    assert "neuron_master_print(met.metrics_report())" in res.code
    assert mig(res.code) == res.code and not unflagged_references(res.code)


def test_the_torch_neuronx_package_itself_is_not_a_reference() -> None:
    code = "import torch_neuronx\nprint(torch_neuronx.get_fallback_ops())\n"
    assert mig(code) == code


# ------------------------------------------------------------------ Optimum Neuron and NxD

def test_optimum_sft_with_tensor_parallelism() -> None:
    res = migrate_python((CORPUS / "optimum_sft_tp.py").read_text())
    out = res.code
    assert "from trl import SFTConfig" in out and "from trl import SFTTrainer" in out
    assert "args = SFTConfig(" in out and "tensor_parallel_size" not in out and "fuse_qkv" not in out
    assert "trn_config = DistributedConfig(tp_size=2)" in out
    assert ("AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="
            '"sdpa", distributed_config=trn_config)') in out
    assert "trainer = SFTTrainer(model=model" in out
    assert {f.rule for f in res.flags} == {"optimum-fused-qkv", "optimum-nki-flash-attention"}
    assert "optimum" not in out.split('"""')[-1]


def test_optimum_trainer_renames_keep_aliases_working() -> None:
    code = ("from optimum.neuron import NeuronTrainer as Trainer, NeuronTrainingArguments\n"
            "args = NeuronTrainingArguments(output_dir='o', tensor_parallel_size=8, zero_1=True)\n"
            "t = Trainer(model=m, args=args)\nassert isinstance(t, Trainer)\n")
    res = migrate_python(code)
    assert "from transformers import Trainer" in res.code and "from transformers import TrainingArguments" in res.code
    assert ("args = TrainingArguments(output_dir='o', per_device_train_batch_size=1, per_device_eval_batch_size=1, "
            "average_tokens_across_devices=False)") in res.code  # Optimum's defaults, not Transformers'
    assert "optimum-zero1" in {f.rule for f in res.flags}


def test_nxd_layers_become_linear_and_a_plan() -> None:
    res = migrate_python((CORPUS / "nxd_tp_mlp.py").read_text())
    out = res.code
    assert "self.up = torch.nn.Linear(d, hidden, bias=True, dtype=torch.float32)" in out  # NxD's default dtype
    assert "self.down = torch.nn.Linear(hidden, classes, bias=True, dtype=torch.float32)" in out
    assert ('model = parallelize_module(model, neuron_mesh()["tp"], {"up": ColwiseParallel(), '
            '"down": RowwiseParallel()})') in out
    assert "neuron_init_mesh(2)" in out and 'tp_rank = neuron_mesh()["tp"].get_local_rank()' in out
    assert not res.flags and not unflagged_references(out)


def test_nxd_gather_output_and_input_is_parallel_map_onto_layouts() -> None:
    code = ("from neuronx_distributed.parallel_layers import layers, parallel_state\n\n\nclass M:\n"
            "    def __init__(self):\n        self.a = layers.ColumnParallelLinear(4, 8)\n"
            "        self.b = layers.RowParallelLinear(8, 4)\n        self.e = layers.ParallelEmbedding(10, 4)\n\n\n"
            "parallel_state.initialize_model_parallel(2)\nm = M()\n")
    out = mig(code)
    assert ('{"a": ColwiseParallel(output_layouts=Replicate()), "b": RowwiseParallel(input_layouts=Replicate()), '
            '"e": RowwiseParallel(input_layouts=Replicate())}') in out
    assert "from torch.distributed.tensor import Replicate" in out


def test_nxd_plan_that_cannot_be_derived_is_flagged() -> None:
    code = ("from neuronx_distributed.parallel_layers import ColumnParallelLinear\n\n\nclass Block:\n"
            "    def __init__(self, g):\n        self.fc = ColumnParallelLinear(4, 8, gather_output=g)\n")
    res = migrate_python(code)
    assert [f.rule for f in res.flags] == ["nxd-plan"]
    assert "self.fc = torch.nn.Linear(4, 8, dtype=torch.float32)" in res.code


# ------------------------------------------------------------------ the corpus: parses, idempotent, nothing left

CORPUS_FILES = sorted(p for p in CORPUS.iterdir() if p.suffix in (".py", ".ipynb", ".sh"))


@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: p.name)
def test_corpus_output_parses_is_idempotent_and_leaves_nothing_unflagged(path: Path) -> None:
    kind = {".py": "python", ".ipynb": "notebook", ".sh": "shell"}[path.suffix]
    first = migrate_source(path.read_text(), kind, path=str(path), spawn_scripts={"xla_spawn.py"})
    assert first.report.error is None, first.report.error
    out = first.result
    assert out is not None
    second = migrate_source(out, kind, path=str(path), spawn_scripts={"xla_spawn.py"})
    assert second.result == out, "a second migration changed the output"
    assert len(second.report.flags) >= len(first.report.flags) - sum(f.rule == "cell-syntax"
                                                                      for f in first.report.flags) * 0
    if kind == "python":
        ast.parse(out)
        assert not unflagged_references(out)
    elif kind == "notebook":
        nb = json.loads(out)
        for cell in nb["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] == "code" and not src.lstrip().startswith("%%") and "does not parse" not in src:
                lines = [ln for ln in src.splitlines() if not ln.lstrip().startswith(("!", "%"))]
                ast.parse("\n".join(lines))
                assert "torch_xla" not in src


# ------------------------------------------------------------------ notebooks and launchers

def test_notebook_cells_magics_and_a_broken_cell() -> None:
    orig = json.loads((CORPUS / "xla_notebook.ipynb").read_text())
    orig["cells"].append({"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                          "source": ["xm.master_print('this cell does not parse'\n"]})
    text = json.dumps(orig, indent=1)
    res = migrate_source(text, "notebook")
    nb = json.loads(res.result)
    assert nb["cells"][0] == orig["cells"][0]  # markdown untouched
    c1, c2, c3, c4 = ("".join(c["source"]) for c in nb["cells"][1:])
    assert "!pip install torch-neuronx\n" in c1 and 'device = ' + DEV in c1
    assert "# %env XLA_USE_BF16=1" in c1 and TODO in c1
    assert "neuron_average_gradients(opt)\n    opt.step()" in c2 and "def neuron_average_gradients" in c2
    assert c3 == "%%bash\n# neuron_parallel_compile python train.py\n"  # the compile-only trial run is not run
    assert c4 == "".join(orig["cells"][4]["source"])  # does not parse: left as it was, and flagged
    flags = {(f.cell, f.rule) for f in res.report.flags}
    assert (4, "cell-syntax") in flags and (1, "bf16-env") in flags
    assert nb["metadata"] == orig["metadata"]


def test_launcher_rules() -> None:
    res = migrate_source((CORPUS / "run_xla.sh").read_text(), "shell", spawn_scripts={"xla_spawn.py"})
    out = res.result
    active = [ln for ln in out.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert not any("neuron_parallel_compile" in ln for ln in active)  # the trial run is commented out, not run
    assert sum(ln.startswith("python xla_spawn.py") for ln in active) == 1  # so the script trains once
    assert "NEURON_CC_FLAGS" not in out and "PJRT_DEVICE" not in out
    assert "export NEURON_RT_VISIBLE_CORES=0-1" in out  # the runtime's own variables stay
    assert "\ntorchrun --nproc_per_node=2 xla_torchrun.py" in out
    assert "# export XLA_USE_BF16=1" in out
    warn = " ".join(r.warning for r in res.report.rewrites)
    for flag in ("--model-type=transformer", "-O1", "--enable-saturate-infinity"):
        assert flag in warn  # each dropped compiler flag is named
    rules = [f.rule for f in res.report.flags]
    assert rules.count("bf16-env") == 2 and rules.count("xmp-launch") == 1 and "launcher-family" in rules


# ------------------------------------------------------------------ the command line, the report, bad input

def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli_main(["migrate", *argv])
    return code, capsys.readouterr().out


def test_cli_dry_run_out_in_place_diff_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(CORPUS / "xla_single.py", src / "train.py")
    (src / "native.py").write_text("import torch\nprint(torch.ones(1))\n")
    before = (src / "train.py").read_text()
    code, out = _cli(capsys, str(src), "--diff")
    assert code == 0 and "dry run" in out and "+    device = " + DEV in out
    assert (src / "train.py").read_text() == before  # nothing written
    code, out = _cli(capsys, str(src), "--out", str(tmp_path / "out"), "--json", str(tmp_path / "r.json"))
    assert code == 0
    assert (tmp_path / "out" / "native.py").read_text() == (src / "native.py").read_text()
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["exit_code"] == 0 and doc["summary"]["files"] == 2 and doc["summary"]["flags"] == 0
    entry = next(f for f in doc["files"] if f["path"].endswith("train.py"))
    rw = next(r for r in entry["rewrites"] if r["rule"] == "xla_device")
    assert rw["line"] == 45 and rw["before"] == "xm.xla_device()" and rw["after"] == DEV
    code, _ = _cli(capsys, str(src), "--in-place")
    assert code == 0 and "import torch_xla" not in (src / "train.py").read_text()
    code, out = _cli(capsys, str(src), "--in-place")
    assert code == 0 and "0 rewrite(s)" in out  # idempotent


def test_cli_exit_code_1_when_flags_remain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "t.py"
    p.write_text("import torch_xla.utils.serialization as xser\nxser.save(sd, 'x')\n")
    code, out = _cli(capsys, str(p))
    assert code == 1 and "FLAG [xser]" in out


@pytest.mark.parametrize("name,content,why", [
    ("broken.py", "def f(:\n    pass\n", "syntax error"),
    ("notes.txt", "hello", "not a Python file"),
    ("blob.py", b"\x00\x01\x02import torch", "binary"),
    ("latin.py", "x = 'caf\xe9'\n".encode("latin-1"), "not UTF-8"),
    ("bad.ipynb", "{not json", "not a notebook"),
])
def test_bad_input_exits_2_and_leaves_the_file_untouched(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         name: str, content: str | bytes, why: str) -> None:
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = p.read_bytes()
    code, out = _cli(capsys, str(p), "--in-place", "--json", str(tmp_path / "r.json"))
    assert code == 2 and why in out
    assert p.read_bytes() == before
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["files"][0]["error"]
    if name == "broken.py":
        assert doc["files"][0]["error_line"] == 1 and "(line 1)" in out


def test_missing_paths_and_out_over_the_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _cli(capsys, str(tmp_path / "nope.py"))
    assert code == 2 and "no such file" in out
    link = tmp_path / "dangling.py"
    os.symlink(tmp_path / "gone.py", link)
    code, out = _cli(capsys, str(link))
    assert code == 2
    (tmp_path / "t.py").write_text("import torch_xla\nd = torch_xla.device()\n")
    code, out = _cli(capsys, str(tmp_path / "t.py"), "--out", str(tmp_path))
    assert code == 2 and "would overwrite" in out
    assert "torch_xla.device()" in (tmp_path / "t.py").read_text()


def test_a_good_file_next_to_a_bad_one_is_still_migrated(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text("import torch_xla\nd = torch_xla.device()\n")
    (tmp_path / "bad.py").write_text("x = (\n")
    results = migrate_paths([tmp_path], out_dir=tmp_path / "out")
    by_name = {Path(m.report.path).name: m.report for m in results}
    assert by_name["bad.py"].error and by_name["bad.py"].error_line is not None
    assert by_name["good.py"].error is None
    assert not (tmp_path / "out" / "bad.py").exists()
    assert DEV in (tmp_path / "out" / "good.py").read_text()


@pytest.mark.parametrize("code", ["", "# only a comment\n", "\n\n\n", "x = 1\r\ny = 2\r\n",
                                  "import torch_xla.core.xla_model as xm\r\nxm.mark_step()\r\nx = 1\r\n"])
def test_odd_files(code: str) -> None:
    m = migrate_source(code)
    assert m.report.error is None
    assert m.result is not None and "mark_step" not in m.result
    compile(m.result, "x", "exec")
    if "\r\n" in code:
        assert "\r\n" in m.result and "\n" not in m.result.replace("\r\n", "")


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    code = "x = " + "(" * 5000 + "1" + ")" * 5000 + "\n"
    m = migrate_source(code)
    assert m.report.error is not None or m.result == code


def test_spawn_does_not_start_a_second_process_group() -> None:
    code = ("import torch.distributed as dist\nimport torch_xla.distributed.xla_multiprocessing as xmp\n\n\n"
            "def _mp_fn(index):\n    dist.init_process_group('xla', init_method='pjrt://')\n\n\nxmp.spawn(_mp_fn)\n")
    out = mig(code)
    assert "    neuron_init_group(world_of_one=True)\n" in out  # pjrt://: alone, a group of one (rv32f item 7)
    assert 'WORLD_SIZE" in os.environ' not in out and '_mp_fn(int(os.environ.get("RANK", "0")))' in out


def test_a_byte_order_mark_is_kept(tmp_path: Path) -> None:
    p = tmp_path / "bom.py"
    p.write_bytes(b"\xef\xbb\xbfimport torch_xla\nd = torch_xla.device()\n")
    (m,) = migrate_paths([p], in_place=True)
    assert m.report.error is None and m.report.changed
    assert p.read_bytes().startswith(b"\xef\xbb\xbf") and DEV.encode() in p.read_bytes()
