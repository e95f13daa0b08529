"""NeuronX Distributed tensor parallelism -> ``nn.Linear`` / ``nn.Embedding`` plus a DTensor plan.

- ``ColumnParallelLinear(i, o, bias, gather_output=True)`` -> ``nn.Linear(i, o, bias)`` and, in the plan,
  ``ColwiseParallel(output_layouts=Replicate())`` (``gather_output=False``: ``ColwiseParallel()``, the output
  stays sharded on the last dim);
- ``RowParallelLinear(i, o, bias, input_is_parallel=False)`` -> ``nn.Linear`` and
  ``RowwiseParallel(input_layouts=Replicate())`` (``input_is_parallel=True``: ``RowwiseParallel()``, the input
  arrives sharded on the last dim);
- ``ParallelEmbedding(n, d)`` -> ``nn.Embedding`` and ``RowwiseParallel(input_layouts=Replicate())`` (the vocabulary
  is split; ``shard_across_embedding=True``: ``ColwiseParallel(output_layouts=Replicate())``);
- ``parallel_state.initialize_model_parallel(tensor_model_parallel_size=N)`` -> a ("dp", "tp") mesh
  (``neuron_init_mesh``), and its getters -> that mesh's ranks, sizes and groups.

The plan of a class is the layers assigned to ``self.<name>`` in it. After ``model = ThatClass(...)`` in the same
file, ``model = parallelize_module(model, neuron_mesh()["tp"], {plan})`` follows. A class with layers that is not
instantiated in the file is flagged with its plan. NxD initialised each shard with its ``init_method``; the native
layers start from ``nn.Linear``'s initialisation (warned).
"""

from __future__ import annotations

import libcst as cst

from torch_neuronx.tools.migrate import flags as flagmod
from torch_neuronx.tools.migrate.python import Ctx, Expr, Rules, Stmt, arg, split_args

NXD = "neuronx_distributed"
PS = f"{NXD}.parallel_layers.parallel_state"
RULES = Rules()
_LAYER_PATHS = (f"{NXD}.parallel_layers", f"{NXD}.parallel_layers.layers")
_PLAN_IMPORTS = (("torch.distributed.tensor.parallel", "parallelize_module"),)


def _is_true(node: cst.BaseExpression | None, default: bool) -> bool | None:
    if node is None:
        return default
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    return None  # not static


def _plans(ctx: Ctx) -> dict[str, dict[str, str]]:
    return ctx.state.setdefault("plans", {})


def _layer(kind: str) -> object:
    def rule(ctx: Ctx, call: cst.Call, qn: str) -> Expr | None:
        split = split_args(call)
        if split is None:
            return None
        pos, kw = split
        if kind == "embedding":
            n, d = arg(call, 0, "num_embeddings"), arg(call, 1, "embedding_dim")
            if n is None or d is None:
                return None
            across = _is_true(kw["shard_across_embedding"].value if "shard_across_embedding" in kw else None, False)
            style = "ColwiseParallel(output_layouts=Replicate())" if across else \
                "RowwiseParallel(input_layouts=Replicate())"
            styled = across is not None
            new = f"torch.nn.Embedding({ctx.code(n)}, {ctx.code(d)})"
        else:
            i, o = arg(call, 0, "input_size"), arg(call, 1, "output_size")
            if i is None or o is None:
                return None
            bias = arg(call, 2, "bias")
            b = "" if bias is None else f", bias={ctx.code(bias)}"
            new = f"torch.nn.Linear({ctx.code(i)}, {ctx.code(o)}{b})"
            if kind == "column":
                gather = _is_true(kw["gather_output"].value if "gather_output" in kw else None, True)
                style = "ColwiseParallel(output_layouts=Replicate())" if gather else "ColwiseParallel()"
                styled = gather is not None
            else:
                parallel_in = _is_true(kw["input_is_parallel"].value if "input_is_parallel" in kw else None, False)
                style = "RowwiseParallel()" if parallel_in else "RowwiseParallel(input_layouts=Replicate())"
                styled = parallel_in is not None
        dropped = sorted(set(kw) - {"input_size", "output_size", "bias", "gather_output", "input_is_parallel",
                                    "num_embeddings", "embedding_dim", "shard_across_embedding"})
        if dropped:
            ctx.warn(f"dropped NxD layer options: {', '.join(dropped)}")
        ctx.warn("initialised as torch.nn's layer (NxD initialised each shard with its init_method)")
        ctx.need("torch")
        target = ctx.assign_target or ""
        cls = ctx.classes[-1] if ctx.classes else None
        if not styled or cls is None or not target.startswith("self."):
            ctx.flag(flagmod.FlagRule(
                "nxd-plan", "The tensor-parallel plan of this layer cannot be derived statically.",
                f"parallelize_module(model, mesh['tp'], {{'<path.to.layer>': {style}}}) from "
                "torch.distributed.tensor.parallel."), ctx.code(call))
        else:
            _plans(ctx).setdefault(cls, {})[target[len("self."):]] = style
            if cls not in ctx.state.get("called", set()):
                ctx.flag(flagmod.FlagRule(
                    "nxd-plan", f"{cls} is not instantiated in this file: its plan cannot be applied here.",
                    f"where {cls} is built: parallelize_module(model, mesh['tp'], {{'{target[5:]}': {style}, ...}})"
                    " from torch.distributed.tensor.parallel."), ctx.code(call))
        return ctx.expr(new)
    return rule


for _p in _LAYER_PATHS:
    RULES.calls[f"{_p}.ColumnParallelLinear"] = _layer("column")  # type: ignore[assignment]
    RULES.calls[f"{_p}.RowParallelLinear"] = _layer("row")  # type: ignore[assignment]
    RULES.calls[f"{_p}.ParallelEmbedding"] = _layer("embedding")  # type: ignore[assignment]


def _init(ctx: Ctx, call: cst.Call, qn: str) -> Expr | None:
    tp = arg(call, 0, "tensor_model_parallel_size")
    if arg(call, 1, "pipeline_model_parallel_size") is not None:
        ctx.flag(flagmod.for_qualname(f"{NXD}.pipeline"), ctx.code(call))
    ctx.helper("neuron_init_mesh")
    ctx.state["mesh"] = True
    return ctx.expr(f"neuron_init_mesh({'' if tp is None else ctx.code(tp)})")


RULES.calls[f"{PS}.initialize_model_parallel"] = _init

_GETTERS = {
    "get_tensor_model_parallel_rank": 'neuron_mesh()["tp"].get_local_rank()',
    "get_tensor_model_parallel_size": 'neuron_mesh()["tp"].size()',
    "get_tensor_model_parallel_group": 'neuron_mesh()["tp"].get_group()',
    "get_data_parallel_rank": 'neuron_mesh()["dp"].get_local_rank()',
    "get_data_parallel_size": 'neuron_mesh()["dp"].size()',
    "get_data_parallel_group": 'neuron_mesh()["dp"].get_group()',
    "model_parallel_is_initialized": '"mesh" in NEURON_MESH',
}


def _getter(code: str) -> object:
    def rule(ctx: Ctx, call: cst.Call, qn: str) -> Expr:
        ctx.helper("neuron_init_mesh")
        return ctx.expr(code)
    return rule


for _g, _code in _GETTERS.items():
    RULES.calls[f"{PS}.{_g}"] = _getter(_code)  # type: ignore[assignment]


def _innermost_class(node: cst.BaseExpression) -> str | None:
    """`Cls(...)`, `Cls(...).to(device)`: the class name."""
    while isinstance(node, cst.Call):
        if isinstance(node.func, cst.Name):
            return node.func.value
        if isinstance(node.func, cst.Attribute) and isinstance(node.func.value, cst.Call):
            node = node.func.value
            continue
        return None
    return None


def _apply_plan(ctx: Ctx, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine) -> list[Stmt]:
    if len(updated.body) != 1 or not isinstance(updated.body[0], cst.Assign):
        return []
    assign = updated.body[0]
    if len(assign.targets) != 1:
        return []
    cls = _innermost_class(assign.value)
    plan = _plans(ctx).get(cls or "")
    if not plan:
        return []
    target = ctx.code(assign.targets[0].target).strip()
    for mod, obj in _PLAN_IMPORTS:
        ctx.need(mod, obj)
    styles = set()
    for style in plan.values():
        styles.add(style.split("(")[0])
        if "Replicate" in style:
            ctx.need("torch.distributed.tensor", "Replicate")
    for s in styles:
        ctx.need("torch.distributed.tensor.parallel", s)
    ctx.helper("neuron_init_mesh")
    if not ctx.state.get("mesh"):
        ctx.flag(flagmod.FlagRule(
            "nxd-mesh", "The plan needs the tensor-parallel mesh, and this file does not call "
            "initialize_model_parallel before it.", "call neuron_init_mesh(tp_size) (or init_device_mesh) first."),
            target)
    entries = ", ".join(f'"{k}": {v}' for k, v in plan.items())
    return [ctx.stmt(f'{target} = parallelize_module({target}, neuron_mesh()["tp"], {{{entries}}})\n')]


RULES.after_statement.append(_apply_plan)
