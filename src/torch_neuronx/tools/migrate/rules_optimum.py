"""Optimum Neuron training -> Transformers / TRL on the neuron device.

- ``NeuronTrainer``, ``NeuronTrainingArguments``, ``NeuronSFTTrainer``, ``NeuronSFTConfig``,
  ``NeuronHfArgumentParser`` -> ``transformers.Trainer``, ``TrainingArguments``, ``trl.SFTTrainer``, ``SFTConfig``,
  ``transformers.HfArgumentParser`` (Transformers and Accelerate pick the neuron device and the neuron c10d backend
  by themselves, docs/hf.md).
- ``tensor_parallel_size=N`` (of the arguments or of ``TrainingNeuronConfig``) -> ``DistributedConfig(tp_size=N)``,
  handed to ``from_pretrained(..., distributed_config=...)``; ``args.trn_config`` -> that ``DistributedConfig``.
- Optimum's training model classes (``NeuronModelForCausalLM`` of ``optimum.neuron.models.training``, or a named
  one such as ``LlamaForCausalLM``) -> ``AutoModelForCausalLM`` / the Transformers class.
- What is lost is flagged: fused QKV, NKI flash attention, ZeRO-1, pipeline parallelism, XLA checkpoint options.
"""

from __future__ import annotations

import libcst as cst

from torch_neuronx.tools.migrate import flags as flagmod
from torch_neuronx.tools.migrate.registry import Ctx, Expr, Rules, split_args

ON = "optimum.neuron"
RULES = Rules()

# Optimum Neuron name -> (module, native name)
_CLASSES = {
    "NeuronTrainer": ("transformers", "Trainer"),
    "NeuronTrainingArguments": ("transformers", "TrainingArguments"),
    "Seq2SeqNeuronTrainer": ("transformers", "Seq2SeqTrainer"),
    "Seq2SeqNeuronTrainingArguments": ("transformers", "Seq2SeqTrainingArguments"),
    "NeuronSFTTrainer": ("trl", "SFTTrainer"),
    "NeuronSFTConfig": ("trl", "SFTConfig"),
    "NeuronHfArgumentParser": ("transformers", "HfArgumentParser"),
}
_PATHS = (ON, f"{ON}.trainers", f"{ON}.training_args", f"{ON}.trainers.sft_trainer", f"{ON}.trainers.trl_utils",
          f"{ON}.trainers.transformers", f"{ON}.trainers.sft_config", f"{ON}.utils.argument_utils",
          f"{ON}.hf_argparser", f"{ON}.trainers.training_args")
_ARGS_CLASSES = ("NeuronTrainingArguments", "NeuronSFTConfig", "Seq2SeqNeuronTrainingArguments")

_LOST = {
    "fuse_qkv": flagmod.FlagRule(
        "optimum-fused-qkv", "Optimum Neuron's fused QKV projection is a custom modeling feature; the Transformers "
        "model keeps separate q/k/v projections.", "nothing to do for correctness; for speed, torch.compile(model, "
        "backend='neuron') fuses what the compiler can."),
    "use_flash_attention_2": flagmod.FlagRule(
        "optimum-nki-flash-attention", "Optimum Neuron's NKI flash-attention kernel is lost.",
        "attn_implementation='sdpa' (set here) or 'flex_attention' (docs/attention.md); an NKI kernel can come "
        "back through torch_neuronx.nki_op."),
    "zero_1": flagmod.FlagRule(
        "optimum-zero1", "ZeRO-1 (optimizer-state sharding over XLA) has no TrainingArguments switch.",
        "shard with FSDP2: DistributedConfig(fsdp_size=N) in from_pretrained, or fully_shard."),
    "pipeline_parallel_size": flagmod.FlagRule(
        "optimum-pp", "Pipeline parallelism of Optimum Neuron (NxD) is not carried over.",
        "DistributedConfig(pp_size=N) where the model supports it, or torch.distributed.pipelining."),
    "async_save": flagmod.FlagRule(
        "optimum-xla-checkpoint", "An XLA checkpoint option (async or xser saving).",
        "drop it: Trainer.save_model / save_strategy write safetensors; torch.distributed.checkpoint for sharded "
        "states."),
    "use_xser": flagmod.FlagRule(
        "optimum-xla-checkpoint", "An XLA checkpoint option (async or xser saving).",
        "drop it: Trainer.save_model / save_strategy write safetensors; torch.distributed.checkpoint for sharded "
        "states."),
}
_NEURON_ONLY = {"kv_size_multiplier", "disable_sequence_parallel", "sequence_parallel_enabled",
                "recompute_causal_mask", "skip_cache_push", "num_local_ranks_per_step", "mixed_precision_config",
                "gradient_checkpointing_config", "checkpoint_dir", "output_logits_for_loss", "trn_config",
                "pipeline_parallel_num_microbatches", "virtual_pipeline_parallel_size"}
_OTHER = flagmod.FlagRule("optimum-option", "An Optimum Neuron option with no native counterpart was dropped.",
                          "check whether the behaviour is needed; see docs/migrate.md.")


def _native_class(name: str) -> object:
    mod, native = _CLASSES[name]

    def make(ctx: Ctx) -> Expr | None:
        call = ctx.state.get("renamed_call")
        if name in _ARGS_CLASSES and isinstance(call, cst.Call) and _positional_fields(call):
            return None  # flagged by the call's rule: the class stays
        ctx.need(mod, native)
        if name in _MIXIN_CLASSES and not ctx.state.get("renaming_a_call"):  # HfArgumentParser((..., ThisClass))
            ctx.flag(DEFAULTS_AS_VALUE, name)
        return cst.Name(native)
    return make


for _path in _PATHS:
    for _name in _CLASSES:
        RULES.renames[f"{_path}.{_name}"] = _native_class(_name)  # type: ignore[assignment]


def _drop_neuron_kwargs(ctx: Ctx, call: cst.Call, keep_tp: bool = False) -> tuple[cst.Call, str | None]:
    """Remove Optimum-only keyword arguments (flagging what is lost); return the tensor-parallel size's code."""
    args, tp = [], None
    for a in call.args:
        name = a.keyword.value if a.keyword is not None else None
        if name == "tensor_parallel_size":
            tp = ctx.code(a.value)
            continue
        if name in _LOST:
            if not (name == "fuse_qkv" and isinstance(a.value, cst.Name) and a.value.value == "False"):
                ctx.flag(_LOST[name], ctx.code(a).strip(", "))
            continue
        if name in _NEURON_ONLY:
            ctx.warn(f"dropped the Optimum Neuron option {name}")
            continue
        args.append(a)
    if args and len(args) < len(call.args):
        args[-1] = args[-1].with_changes(comma=call.args[-1].comma)  # the layout of the original last argument
    return call.with_changes(args=args), tp


# Defaults NeuronTrainingArgumentsMixin (optimum/neuron/trainers/training_args.py, huggingface/optimum-neuron) sets
# differently from transformers' TrainingArguments (8, 8, True): given explicitly when the call leaves them out.
OPTIMUM_DEFAULTS = {"per_device_train_batch_size": "1", "per_device_eval_batch_size": "1",
                    "average_tokens_across_devices": "False"}
_MIXIN_CLASSES = ("NeuronTrainingArguments", "Seq2SeqNeuronTrainingArguments")
DEFAULTS_UNKNOWN = flagmod.FlagRule(
    "optimum-defaults", "Optimum Neuron's training arguments default to per_device_train_batch_size=1, "
    "per_device_eval_batch_size=1 and average_tokens_across_devices=False (Transformers: 8, 8, True), and this "
    "call's **kwargs may or may not set them.",
    "pass the three explicitly (or make sure the dict holds them).")


DEFAULTS_AS_VALUE = flagmod.FlagRule(
    "optimum-defaults", "Used as a class (HfArgumentParser((..., NeuronTrainingArguments))), Transformers' "
    "TrainingArguments has other defaults than Optimum Neuron's: per_device_train_batch_size and "
    "per_device_eval_batch_size 8 (Optimum: 1), average_tokens_across_devices True (Optimum: False).",
    "pass --per_device_train_batch_size 1 --per_device_eval_batch_size 1 --average_tokens_across_devices False "
    "(or parser.set_defaults(...)) where the old defaults were relied on.")


def _with_optimum_defaults(ctx: Ctx, call: cst.Call, new: cst.Call) -> cst.Call:
    split = split_args(call)
    if split is None:
        ctx.flag(DEFAULTS_UNKNOWN, ctx.code(call))
        return new
    missing = [k for k in OPTIMUM_DEFAULTS if k not in split[1]]
    if not missing:
        return new
    ctx.warn(f"Optimum Neuron's defaults given explicitly: {', '.join(f'{k}={OPTIMUM_DEFAULTS[k]}' for k in missing)}")
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    args = list(new.args)
    if args:
        args[-1] = args[-1].with_changes(comma=comma)
    args += [_kwarg(ctx, k, ctx.expr(OPTIMUM_DEFAULTS[k])).with_changes(comma=comma) for k in missing]
    args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return new.with_changes(args=args)


POSITIONAL = flagmod.FlagRule(
    "optimum-positional", "Positional training arguments after output_dir follow Optimum Neuron's field order "
    "(output_dir, overwrite_output_dir, do_train, ...: the Transformers release it pinned), which the installed "
    "Transformers' TrainingArguments does not share (overwrite_output_dir is gone): they would bind to other fields.",
    "pass every argument after output_dir by keyword, then migrate again.")


def _positional_fields(call: cst.Call) -> bool:
    """Whether training arguments are given by position after output_dir."""
    split = split_args(call)
    return split is not None and len(split[0]) > 1


def _args_call(ctx: Ctx, call: cst.Call, qn: str) -> Expr | None:
    if _positional_fields(call):  # flagged, not rewritten: no faithful keyword for a positional field
        ctx.flag(POSITIONAL, ctx.code(call))
        return None
    new, tp = _drop_neuron_kwargs(ctx, call)
    if qn.rsplit(".", 1)[-1] in _MIXIN_CLASSES:
        new = _with_optimum_defaults(ctx, call, new)
    if tp is not None:
        ctx.state["tp_size"] = tp
        ctx.warn(f"tensor_parallel_size={tp} moved to from_pretrained(..., distributed_config=DistributedConfig("
                 f"tp_size={tp}))")
    return new


for _path in _PATHS:
    for _name in _ARGS_CLASSES:
        RULES.calls[f"{_path}.{_name}"] = _args_call


def _distributed_config(ctx: Ctx, tp: str) -> Expr:
    ctx.need("transformers.distributed", "DistributedConfig")
    return ctx.expr(f"DistributedConfig(tp_size={tp})")


def _trn_config(ctx: Ctx, call: cst.Call, qn: str) -> Expr | None:
    """`TrainingNeuronConfig(tensor_parallel_size=N, ...)` -> `DistributedConfig(tp_size=N)`."""
    new, tp = _drop_neuron_kwargs(ctx, call)
    split = split_args(new)
    if split is None:
        return None
    pos, kw = split
    if pos or kw:
        dropped = ", ".join([ctx.code(a.value) for a in pos] + list(kw))
        ctx.warn(f"TrainingNeuronConfig arguments without a DistributedConfig counterpart dropped: {dropped}")
    if tp is None:
        tp = "1"
    ctx.state["tp_size"] = tp
    return _distributed_config(ctx, tp)


RULES.calls[f"{ON}.models.training.config.TrainingNeuronConfig"] = _trn_config
RULES.calls[f"{ON}.models.training.TrainingNeuronConfig"] = _trn_config
RULES.calls[f"{ON}.TrainingNeuronConfig"] = _trn_config


def _trn_config_attr(ctx: Ctx, node: cst.Attribute) -> Expr | None:
    """`training_args.trn_config` -> the DistributedConfig of the tensor_parallel_size seen in this file."""
    if node.attr.value != "trn_config":
        return None
    tp = ctx.state.get("tp_size")
    if tp is None:
        ctx.flag(flagmod.FlagRule(
            "optimum-trn-config", "The model's TRN config comes from arguments this file does not set statically.",
            "DistributedConfig(tp_size=N) from transformers.distributed, passed as from_pretrained("
            "..., distributed_config=...)."), ctx.code(node))
        return None
    return _distributed_config(ctx, tp)


RULES.attr_hooks.append(_trn_config_attr)

_TRAINING_MODELS = f"{ON}.models.training."


def _is_training_from_pretrained(qn: str) -> bool:
    return qn.startswith(_TRAINING_MODELS) and qn.endswith(".from_pretrained")


def _kwarg(ctx: Ctx, name: str, value: cst.BaseExpression) -> cst.Arg:
    call = ctx.expr(f"f({name}=None)")
    assert isinstance(call, cst.Call)
    return call.args[0].with_changes(value=value)


def _from_pretrained(ctx: Ctx, call: cst.Call, qn: str) -> Expr | None:
    cls = qn[len(_TRAINING_MODELS):].rsplit(".", 1)[0].split(".")[-1]
    native = "AutoModelForCausalLM" if cls in ("NeuronModelForCausalLM", "NeuronModel") else cls
    ctx.need("transformers", native)
    split = split_args(call)
    if split is None:
        return None
    pos, kw = split
    new, tp = _drop_neuron_kwargs(ctx, call)
    args = list(new.args)
    dist_arg = None
    positional = [a for a in args if a.keyword is None]
    if len(positional) >= 2:  # from_pretrained(model_id, trn_config, ...)
        dist_arg = positional[1]
        args = [a for a in args if a is not dist_arg]
    args = _without_flash_attention_2(ctx, args)
    if "use_flash_attention_2" in kw and "attn_implementation" not in kw:
        args.append(_kwarg(ctx, "attn_implementation", cst.SimpleString('"sdpa"')))
    if dist_arg is not None:
        args.append(_kwarg(ctx, "distributed_config", dist_arg.value))
    elif tp is not None or ctx.state.get("tp_size") is not None:
        args.append(_kwarg(ctx, "distributed_config", _distributed_config(ctx, tp or ctx.state["tp_size"])))
    args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) if i == len(args) - 1 else
            (a if a.comma is not cst.MaybeSentinel.DEFAULT else a.with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))) for i, a in enumerate(args)]
    ctx.warn("the Transformers model replaces Optimum Neuron's custom modeling (its weights load the same way)")
    return cst.Call(func=ctx.expr(f"{native}.from_pretrained"), args=args)


RULES.call_matchers.append((_is_training_from_pretrained, _from_pretrained))


FLASH_ATTENTION_2 = flagmod.FlagRule(
    "flash-attention-2", "attn_implementation='flash_attention_2' needs the CUDA flash-attn package, which the "
    "neuron device does not have (the model would fail to load).",
    "attn_implementation='sdpa' (set here) or 'flex_attention' (docs/attention.md); an NKI kernel can come back "
    "through torch_neuronx.nki_op.")


def _without_flash_attention_2(ctx: Ctx, args: list[cst.Arg]) -> list[cst.Arg]:
    """`attn_implementation="flash_attention_2"` -> `"sdpa"`, flagged (the kernel choice changes, not the maths)."""
    out = []
    for a in args:
        if (a.keyword is not None and a.keyword.value == "attn_implementation"
                and isinstance(a.value, cst.SimpleString) and a.value.evaluated_value == "flash_attention_2"):
            ctx.flag(FLASH_ATTENTION_2, _EMPTY_MODULE.code_for_node(a).strip().rstrip(","))
            a = a.with_changes(value=cst.SimpleString(f"{a.value.quote}sdpa{a.value.quote}"))
        out.append(a)
    return out


def _flash_attention_2_hook(ctx: Ctx, original: cst.Call, updated: cst.Call) -> Expr | None:
    """Any call (Transformers' from_pretrained, a config) with attn_implementation="flash_attention_2"."""
    args = _without_flash_attention_2(ctx, list(updated.args))
    return None if all(a is b for a, b in zip(args, updated.args, strict=True)) else updated.with_changes(args=args)


_EMPTY_MODULE = cst.Module(body=[])
_flash_attention_2_hook.rule_name = "flash-attention-2"  # type: ignore[attr-defined]
RULES.call_hooks.append(_flash_attention_2_hook)
