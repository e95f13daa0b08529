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
instantiated in the file, or is built only inside an expression, is flagged with its plan.

Every parameter of the three layers is handled from NxD's published signature (positional order included):
``SIGNATURES`` says which map onto the ``torch.nn`` layer, which choose the layout, which change nothing that is
computed, and which are flagged when given (``stride``, sequence parallelism, ...). ``init_method`` is applied to
the whole weight (``neuron_init_weight``), as NxD's CPU initialisation did before sharding; ``skip_bias_add=True``
becomes ``NeuronSkipBiasLinear``, which returns ``(output, bias)``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import libcst as cst

from torch_neuronx.tools.migrate import flags as flagmod
from torch_neuronx.tools.migrate.registry import Ctx, Expr, Rules, Stmt, bind, is_literal, split_args

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


@dataclass(frozen=True)
class Param:
    """One parameter of an NxD layer, in the published signature's order, and what the migration does with it.

    outcome: "kwarg" (passed on to the torch.nn layer under `native`), "plan" (chooses the DTensor layout),
    "init" (NxD's init_method, applied to the whole weight as NxD's CPU initialisation did), "ignore" (no effect
    on what is computed: memory, speed, inference-only padding), "flag" (flagged unless it is `default`) or
    "skip-bias" (True: the neuron_skip_bias layer returns (output, bias) as NxD did, where the bias is whole;
    flagged where NxD's bias was a shard, on a column-parallel layer whose output stays sharded).
    `sample`: a value other than the default, for the tests and docs/migrate.md's table."""

    name: str
    outcome: str
    native: str = ""
    default: object = None
    sample: str = ""
    note: str = ""


_SEQ_PAR = "sequence parallelism shards activations along the sequence: a SequenceParallel plan entry and " \
    "PrepareModuleInput layouts by hand."
_GROUP = "the plan runs on the mesh's 'tp' dimension: build the mesh with that group's ranks (init_device_mesh)."
_REDUCE = "the native reduction runs in the tensor's dtype: cast the layer's output (or the model) yourself."
_ORDER = "DTensor shards in rank order: permute the weight shards when loading them."
_SKIP_BIAS = "build the layer with bias=False, keep the bias as its own nn.Parameter and return (layer(x), bias) " \
    "where the code unpacks two values."
_STRIDE = "NxD gave rank r the chunks r, r + tp, ... of a fused weight (e.g. gate/up, QKV): split it into one " \
    "nn.Linear per part, each ColwiseParallel, or permute the weight rows so each rank's shard holds its chunks."
# Signatures: neuronx_distributed/parallel_layers/layers.py (github.com/aws-neuron/neuronx-distributed), positional
# order included.
_LINEAR_HEAD = (Param("input_size", "kwarg", "in_features"), Param("output_size", "kwarg", "out_features"),
                Param("bias", "kwarg", "bias", sample="False"))
_LINEAR_TAIL = (Param("dtype", "kwarg", "dtype", sample="torch.bfloat16"),
                Param("device", "kwarg", "device", sample="dev"),
                Param("stride", "flag", default=1, sample="2", note=_STRIDE),
                Param("init_method", "init", sample="init_fn"),
                Param("sequence_parallel_enabled", "flag", default=False, sample="True", note=_SEQ_PAR),
                Param("sequence_dimension", "ignore", sample="1", note="read only with sequence parallelism"),
                Param("keep_master_weight", "ignore", sample="True", note="memory only"),
                Param("skip_bias_add", "skip-bias", default=False, sample="True", note=_SKIP_BIAS))
COLUMN = (*_LINEAR_HEAD, Param("gather_output", "plan", sample="False"), *_LINEAR_TAIL,
          Param("pad", "ignore", sample="True", note="the output is sliced back to output_size"),
          Param("pad_alignment_size_per_rank", "ignore", sample="4", note="read only with pad"),
          Param("keep_padded_output", "flag", default=False, sample="True",
                note="the native layer's output has output_size columns: pad it yourself."),
          Param("tensor_model_parallel_group", "flag", default=None, sample="grp", note=_GROUP),
          Param("reduce_dtype", "flag", default="torch.float32", sample="torch.bfloat16", note=_REDUCE),
          Param("rank_ordering", "flag", default=None, sample="[1, 0]", note=_ORDER))
ROW = (*_LINEAR_HEAD, Param("input_is_parallel", "plan", sample="True"), *_LINEAR_TAIL,
       Param("pad", "ignore", sample="True", note="inference only (NxD refuses it in training)"),
       Param("reduce_output", "flag", default=True, sample="False",
             note="the plan's RowwiseParallel always reduces: keep a Partial output with "
             "RowwiseParallel(output_layouts=Partial(), use_local_output=False)."),
       Param("tensor_model_parallel_group", "flag", default=None, sample="grp", note=_GROUP),
       Param("reduce_dtype", "flag", default="torch.float32", sample="torch.bfloat16", note=_REDUCE),
       Param("tile_cc", "ignore", sample="True", note="speed only"),
       Param("rank_ordering", "flag", default=None, sample="[1, 0]", note=_ORDER))
EMBEDDING = (Param("num_embeddings", "kwarg", "num_embeddings"), Param("embedding_dim", "kwarg", "embedding_dim"),
             Param("padding_idx", "padding", "padding_idx", sample="3",
                   note="NxD pads only with a positive index (`if padding_idx and padding_idx >= start_index`): "
                   "give the index as an int literal, or set padding_idx on the nn.Embedding yourself."),
             Param("max_norm", "flag", default=None, sample="1.0",
                   note="max_norm renormalises rows in place, which a vocabulary-sharded weight does per shard: "
                   "clip the rows yourself."),
             Param("norm_type", "kwarg", "norm_type", sample="1.0"),
             Param("scale_grad_by_freq", "flag", default=False, sample="True",
                   note="frequencies would be counted per shard: scale the gradients yourself."),
             Param("sparse", "flag", default=False, sample="True",
                   note="sparse gradients do not shard with DTensor: use dense gradients."),
             Param("init_method", "init", sample="init_fn"),
             Param("device", "kwarg", "device", sample="dev"),
             Param("dtype", "kwarg", "dtype", sample="torch.bfloat16"),
             Param("shard_across_embedding", "plan", sample="True"),
             Param("pad", "ignore", sample="True", note="padded vocabulary rows are never looked up"),
             Param("sequence_parallel_enabled", "flag", default=False, sample="True", note=_SEQ_PAR),
             Param("tensor_model_parallel_group", "flag", default=None, sample="grp", note=_GROUP),
             Param("use_spmd_rank", "ignore", sample="True", note="how NxD finds the rank in a traced graph"),
             Param("sequence_dimension", "ignore", sample="1", note="read only with sequence parallelism"),
             Param("tile_cc", "ignore", sample="True", note="speed only"),
             Param("rank_ordering", "flag", default=None, sample="[1, 0]", note=_ORDER),
             Param("collect_output", "flag", default=True, sample="False",
                   note="the plan always gives each rank the whole output: shard it yourself."))
SIGNATURES = {"ColumnParallelLinear": COLUMN, "RowParallelLinear": ROW, "ParallelEmbedding": EMBEDDING}


def _option_flag(layer: str, param: Param) -> flagmod.FlagRule:
    return flagmod.FlagRule("nxd-option", f"{layer}({param.name}=...) has no same-meaning native form "
                            "(the rewrite would compute something else).", param.note)


def _style(kind: str, options: dict[str, cst.BaseExpression]) -> tuple[str, bool]:
    """The DTensor style of the layer and whether its layout is static."""
    if kind == "ParallelEmbedding":
        across = _is_true(options.get("shard_across_embedding"), False)
        return ("ColwiseParallel(output_layouts=Replicate())" if across else
                "RowwiseParallel(input_layouts=Replicate())"), across is not None
    if kind == "ColumnParallelLinear":
        gather = _is_true(options.get("gather_output"), True)
        return ("ColwiseParallel(output_layouts=Replicate())" if gather else "ColwiseParallel()"), gather is not None
    parallel_in = _is_true(options.get("input_is_parallel"), False)
    return ("RowwiseParallel()" if parallel_in else "RowwiseParallel(input_layouts=Replicate())"), \
        parallel_in is not None


def _layer(kind: str) -> object:
    params = SIGNATURES[kind]
    native = "torch.nn.Embedding" if kind == "ParallelEmbedding" else "torch.nn.Linear"

    def rule(ctx: Ctx, call: cst.Call, qn: str) -> Expr | None:
        options = bind(call, [p.name for p in params])
        if options is None or params[0].name not in options or params[1].name not in options:
            return None  # not bindable statically: flagged as a leftover
        args = [ctx.code(options[params[0].name]), ctx.code(options[params[1].name])]
        init = None
        for p in params[2:]:
            value = options.get(p.name)
            if value is None:
                continue
            if p.outcome == "kwarg":
                args.append(f"{p.native}={ctx.code(value)}")
            elif p.outcome == "padding":
                padding = _padding_idx(ctx, p, value, options.get("shard_across_embedding"))
                if padding is not None:
                    args.append(f"{p.native}={padding}")
                    # NxD never zeroes the padding row (init_method runs on the whole master weight, the index
                    # only masks the gradient); nn.Embedding does: re-initialise the weight as NxD did
                    init = init or "torch.nn.init.normal_"
            elif p.outcome == "init":
                init = ctx.code(value)
            elif p.outcome == "flag" and not is_literal(value, p.default):
                ctx.flag(_option_flag(kind, p), f"{p.name}={ctx.code(value)}")
        if "dtype" not in options:  # NxD's layers default to dtype=torch.float32, not torch.get_default_dtype()
            args.append("dtype=torch.float32")
        style, styled = _style(kind, options)
        layer = native
        if _skip_bias(ctx, kind, options, style):
            layer = ctx.helper("NeuronSkipBiasLinear")
        new = f"{layer}({', '.join(args)})"
        if init is not None:
            new = f"{ctx.helper('neuron_init_weight')}({new}, {init})"
        ctx.need("torch")
        _plan_entry(ctx, call, style, styled, ".linear" if layer != native else "")
        return ctx.expr(new)
    return rule


def _padding_idx(ctx: Ctx, param: Param, value: cst.BaseExpression,
                 across: cst.BaseExpression | None) -> str | None:
    """The padding index nn.Embedding gets, None when NxD has none. NxD's ParallelEmbedding (parallel_layers/
    layers.py, aws-neuron/neuronx-distributed): vocabulary-sharded, `if padding_idx and padding_idx >= start_index
    and padding_idx < end_index` (0 and negative indices mean no padding); sharded across the embedding,
    `padding_idx if padding_idx else None` (0 means none, a negative index counts from the end as nn.Embedding's)."""
    try:
        index = ast.literal_eval(ctx.code(value).strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        index = ...
    if index is None:
        return None
    if isinstance(index, bool) or not isinstance(index, int):
        ctx.flag(_option_flag("ParallelEmbedding", param), f"padding_idx={ctx.code(value)}")
        return None
    if index > 0:
        return str(index)
    if index == 0:
        return None
    shard_across = _is_true(across, False)
    if shard_across is None:
        ctx.flag(_option_flag("ParallelEmbedding", param), f"padding_idx={ctx.code(value)}")
        return None
    return str(index) if shard_across else None


def _skip_bias(ctx: Ctx, kind: str, options: dict[str, cst.BaseExpression], style: str) -> bool:
    """True when skip_bias_add=True is translated (the layer returns (output, whole bias)); flagged when it is
    not static, or when NxD returned a bias shard (column-parallel, output not gathered)."""
    value = options.get("skip_bias_add")
    if value is None or is_literal(value, False):
        return False
    if is_literal(value, True) and (kind == "RowParallelLinear" or "Replicate" in style):
        return True
    param = next(p for p in SIGNATURES[kind] if p.name == "skip_bias_add")
    ctx.flag(_option_flag(kind, param), f"skip_bias_add={ctx.code(value)}")
    return False


def _plan_entry(ctx: Ctx, call: cst.Call, style: str, styled: bool, suffix: str = "") -> None:
    target = ctx.assign_target or ""
    cls = ctx.classes[-1] if ctx.classes else None
    if not styled or cls is None or not target.startswith("self."):
        ctx.flag(flagmod.FlagRule(
            "nxd-plan", "The tensor-parallel plan of this layer cannot be derived statically.",
            f"parallelize_module(model, mesh['tp'], {{'<path.to.layer>': {style}}}) from "
            "torch.distributed.tensor.parallel."), ctx.code(call))
        return
    _plans(ctx).setdefault(cls, {})[target[len("self."):] + suffix] = style
    for built, line in ctx.state.get("built_early", {}).items():  # built above this layer's class: no plan there
        if built == cls or cls in _ancestors(ctx, built):
            ctx.flag(flagmod.FlagRule(
                "nxd-plan", f"{built} is built at line {line}, above the definition of {cls}'s layers: its plan is "
                "not applied there.", f"where {built} is built: parallelize_module(model, mesh['tp'], "
                f"{{'{target[5:]}': {style}, ...}}) from torch.distributed.tensor.parallel, or define {cls} above "
                "it and migrate again."), ctx.code(call))
    where = ("is not instantiated in this file" if cls not in ctx.state.get("called", set()) else
             "is built inside an expression here" if cls in ctx.state.get("built_in_expression", set()) else "")
    if where:
        ctx.flag(flagmod.FlagRule(
            "nxd-plan", f"{cls} {where}: its plan cannot be applied there.",
            f"where {cls} is built: parallelize_module(model, mesh['tp'], {{'{target[5:]}': {style}, ...}})"
            " from torch.distributed.tensor.parallel (the path of each layer from the model)."), ctx.code(call))


for _p in _LAYER_PATHS:
    for _kind in SIGNATURES:
        RULES.calls[f"{_p}.{_kind}"] = _layer(_kind)  # type: ignore[assignment]


# parallel_state.initialize_model_parallel's signature (neuronx_distributed/parallel_layers/parallel_state.py)
INIT = (Param("tensor_model_parallel_size", "kwarg", "tensor_model_parallel_size", sample="2"),
        Param("pipeline_model_parallel_size", "flag", default=1, sample="2",
              note="a 'pp' mesh dimension and torch.distributed.pipelining (pipeline(), a schedule)."),
        Param("context_parallel_size", "flag", default=1, sample="2",
              note="a 'cp' mesh dimension and torch.distributed.tensor.experimental.context_parallel."),
        Param("expert_model_parallel_size", "flag", default=1, sample="2",
              note="an 'ep' mesh dimension for the experts (transformers' DistributedConfig(ep_size=...))."),
        Param("skip_collective_init", "ignore", sample="True", note="NxD's own collective warm-up"),
        Param("lnc_size", "ignore", sample="2", note="logical NeuronCore size: the runtime's, not the model's"),
        Param("mesh_only", "ignore", sample="True", note="NxD's own bookkeeping"))


def _init(ctx: Ctx, call: cst.Call, qn: str) -> Expr | None:
    options = bind(call, [p.name for p in INIT])
    if options is None:
        return None
    for p in INIT[1:]:
        value = options.get(p.name)
        if p.outcome == "flag" and value is not None and not is_literal(value, p.default):
            ctx.flag(flagmod.FlagRule("nxd-option", f"initialize_model_parallel({p.name}=...) has no same-meaning "
                                      "native form in the (dp, tp) mesh.", p.note), f"{p.name}={ctx.code(value)}")
    tp = options.get("tensor_model_parallel_size")
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


# get_tensor_model_parallel_group(as_list=False) / get_data_parallel_group(as_list=False) (parallel_state.py): with
# as_list=True NxD returns the replica groups, every group's ranks ([[0, 1], [2, 3]] for TP = 2 of 4 ranks), not the
# caller's group: the rows of the (dp, tp) mesh are the tensor-parallel groups, its columns the data-parallel ones.
_AS_LIST = {"get_tensor_model_parallel_group": "neuron_mesh().mesh.tolist()",
            "get_data_parallel_group": "neuron_mesh().mesh.t().tolist()"}
GETTER_PARAMS = {name: (Param("as_list", "as-list", default=False, sample="True",
                              note="give as_list as a literal True or False."),) for name in _AS_LIST}


def _getter(name: str, code: str) -> object:
    def rule(ctx: Ctx, call: cst.Call, qn: str) -> Expr | None:
        options = bind(call, [p.name for p in GETTER_PARAMS.get(name, ())])
        if options is None:
            return None
        as_list = options.get("as_list")
        ctx.helper("neuron_init_mesh")
        if as_list is None or is_literal(as_list, False):
            return ctx.expr(code)
        if is_literal(as_list, True):
            return ctx.expr(_AS_LIST[name])
        param = GETTER_PARAMS[name][0]
        ctx.flag(flagmod.FlagRule("nxd-option", f"{name}(as_list=...) returns the replica groups (a list of rank "
                                  "lists) or the caller's group: which one is not known statically.", param.note),
                 ctx.code(call))
        return None
    return rule


for _g, _code in _GETTERS.items():
    RULES.calls[f"{PS}.{_g}"] = _getter(_g, _code)  # type: ignore[assignment]


def _innermost_call(node: cst.BaseExpression) -> cst.Call | None:
    """`Cls(...)`, `Cls(...).to(device)`: the `Cls(...)` call."""
    while isinstance(node, cst.Call):
        if isinstance(node.func, cst.Name):
            return node
        if isinstance(node.func, cst.Attribute) and isinstance(node.func.value, cst.Call):
            node = node.func.value
            continue
        return None
    return None


def _innermost_class(node: cst.BaseExpression) -> str | None:
    call = _innermost_call(node)
    return call.func.value if call is not None and isinstance(call.func, cst.Name) else None


def _ancestors(ctx: Ctx, cls: str) -> set[str]:
    """The classes of this file `cls` derives from, directly or not (by name)."""
    bases: dict[str, set[str]] = ctx.state.get("bases", {})
    found: set[str] = set()
    todo = list(bases.get(cls, ()))
    while todo:
        name = todo.pop()
        if name not in found and name != cls:
            found.add(name)
            todo += bases.get(name, ())
    return found


def _find_expression_builds(ctx: Ctx, module: cst.Module) -> None:
    """The classes called somewhere other than as `x = Cls(...)` (where the plan is applied after the statement):
    `Sequential(*[Block() for ...])`, `f(Block())`; their layers' plans are flagged, not silently dropped. Read
    from Python's parse tree (C speed), only in files that import NxD."""
    inside: set[str] = set()
    ctx.state["built_in_expression"] = inside
    bases: dict[str, set[str]] = {}
    ctx.state["bases"] = bases
    tree = ctx.state.get("tree")
    if not any(q.startswith(NXD) for q in [*ctx.aliases.names.values(), *ctx.aliases.local_qualnames]):
        return
    if tree is None:
        tree = ast.parse(module.code)
    for node in ast.walk(tree):  # the classes of the file and their bases' names (a subclass has their layers)
        if isinstance(node, ast.ClassDef):
            bases.setdefault(node.name, set()).update(b.id if isinstance(b, ast.Name) else b.attr
                                                      for b in node.bases if isinstance(b, (ast.Name, ast.Attribute)))
    applied: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            value = node.value
            while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and isinstance(
                    value.func.value, ast.Call):  # Cls(...).to(device)
                value = value.func.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
                applied.add(id(value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and id(node) not in applied:
            inside.add(node.func.id)


RULES.prepare.append(_find_expression_builds)


def _apply_plan(ctx: Ctx, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine) -> list[Stmt]:
    if len(updated.body) != 1:  # `model = Block(); n = 2`: no statement of its own to follow, so flagged
        for small in updated.body:
            if isinstance(small, cst.Assign) and _plans(ctx).get(_innermost_class(small.value) or ""):
                ctx.flag(flagmod.FlagRule(
                    "nxd-plan", "The model is built on a line with other statements: its plan is not applied.",
                    "put `model = ThatClass(...)` on a line of its own and migrate again."), ctx.code(small))
        return []
    if not isinstance(updated.body[0], cst.Assign):
        return []
    assign = updated.body[0]
    if len(assign.targets) != 1:
        return []
    cls = _innermost_class(assign.value)
    plan = _plans(ctx).get(cls or "")
    inherited = sorted(a for a in _ancestors(ctx, cls or "") if _plans(ctx).get(a))
    if inherited:  # the plan holds the class's own layers: its bases' layers, built by super().__init__, are not
        ctx.flag(flagmod.FlagRule(
            "nxd-plan", f"{cls} inherits the tensor-parallel layers of {', '.join(inherited)}: their plan is not "
            "applied here.", f"parallelize_module(model, mesh['tp'], {{...}}) with the paths of {cls}'s inherited "
            "layers too (torch.distributed.tensor.parallel)."), ctx.code(assign))
    if not plan:
        if cls in ctx.state.get("bases", {}):  # a class of this file whose layers come later in the text (rv32c 11)
            ctx.state.setdefault("built_early", {}).setdefault(cls, ctx.line)
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
    # at module level or in a function the text's order is the run's; inside a class (`self.mlp = MLP()` in an
    # `__init__`) the layer is built when the class is, so a mesh made anywhere in the file may come first
    mesh_made = ctx.state.get("mesh") or (bool(ctx.classes) and bool(
        {"initialize_model_parallel", "neuron_init_mesh", "init_device_mesh"} & ctx.state.get("called", set())))
    if not mesh_made:
        ctx.flag(flagmod.FlagRule(
            "nxd-mesh", "The plan needs the tensor-parallel mesh, and this file does not call "
            "initialize_model_parallel before it.", "call neuron_init_mesh(tp_size) (or init_device_mesh) first."),
            target)
    entries = ", ".join(f'"{k}": {v}' for k, v in plan.items())
    return [ctx.stmt(f'{target} = parallelize_module({target}, neuron_mesh()["tp"], {{{entries}}})\n')]


RULES.after_statement.append(_apply_plan)


def _optimizer_without_foreach(ctx: Ctx, original: cst.Call, updated: cst.Call) -> Expr | None:
    """`torch.optim.SGD(model.parameters(), ...)` in a file whose model got a plan: `foreach=False` added. The plan
    leaves the parameters it does not name plain tensors next to DTensors, and the multi-tensor (foreach) kernels
    refuse the mix; the per-parameter loop computes the same update."""
    if not _plans(ctx):
        return None
    qn = ctx.qualname(original.func) or ""
    parts = qn.split(".")
    if len(parts) != 3 or parts[:2] != ["torch", "optim"] or not parts[2][:1].isupper() or parts[2] == "Optimizer":
        return None
    split = split_args(updated)
    if split is None or "foreach" in split[1] or "fused" in split[1]:
        return None
    ctx.warn("foreach=False: the plan leaves some parameters plain tensors, which foreach kernels cannot mix "
             "with DTensors")
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    args = [*updated.args[:-1], updated.args[-1].with_changes(comma=comma)] if updated.args else []
    return updated.with_changes(args=[*args, cst.Arg(keyword=cst.Name("foreach"), value=cst.Name("False"),
                                                      equal=cst.AssignEqual(cst.SimpleWhitespace(""),
                                                                            cst.SimpleWhitespace("")))])


_optimizer_without_foreach.rule_name = "optimizer-foreach"  # type: ignore[attr-defined]
RULES.call_hooks.append(_optimizer_without_foreach)


MOVE_MODEL = ("model", "device")


def _move_model_to_device(ctx: Ctx, call: cst.Call, qn: str) -> list[Stmt] | None:
    """NxD's move_model_to_device(model, device) is `model.to(device)` inside context managers that keep shared
    weights and NxD's parameter attributes (neuronx-distributed src/neuronx_distributed/utils/model_utils.py); the
    native layers carry no such attributes, so `model.to(device)` is the whole of it. It returns None: only the
    statement form is rewritten."""
    options = bind(call, MOVE_MODEL)
    if options is None or set(options) != set(MOVE_MODEL):
        return None
    return [ctx.stmt(f"{ctx.code(options['model'])}.to({ctx.code(options['device'])})\n")]


for _qn in (f"{NXD}.utils.model_utils.move_model_to_device", f"{NXD}.utils.move_model_to_device"):
    RULES.statements[_qn] = _move_model_to_device
