"""What is flagged rather than rewritten, and why: each entry gives the reason and the native path.

A reference to torch_xla, optimum.neuron or neuronx_distributed that no rewrite consumed is flagged with the
first entry whose prefix matches its qualified name, or with the generic entry.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlagRule:
    rule: str
    reason: str
    suggestion: str


# (qualified-name prefix, rule); the first match wins, so the more specific prefixes come first
PREFIX_RULES: list[tuple[str, FlagRule]] = [
    ("torch_xla.distributed.zero_redundancy_optimizer", FlagRule(
        "xla-zero", "XLA's ZeroRedundancyOptimizer shards optimizer state through XLA collectives.",
        "shard with FSDP2: torch.distributed.fsdp.fully_shard(model) on a neuron mesh, then a plain optimizer.")),
    ("torch_xla.distributed.fsdp", FlagRule(
        "xla-fsdp", "XLA FSDP (XlaFullyShardedDataParallel) has no native counterpart with the same wrapping.",
        "FSDP2: torch.distributed.fsdp.fully_shard on each block, then on the model (mesh from init_device_mesh).")),
    ("torch_xla.utils.serialization", FlagRule(
        "xser", "xser checkpoints are XLA's own tensor-per-file format.",
        "torch.distributed.checkpoint (DCP) save/load; convert old checkpoints once with xser.load on an XLA host "
        "then torch.save(state_dict).")),
    ("torch_xla.utils.checkpoint", FlagRule(
        "xla-activation-checkpoint", "torch_xla's activation checkpoint wraps XLA's optimization barrier.",
        "torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False).")),
    ("torch_xla.debug.metrics", FlagRule(
        "xla-metrics", "XLA's metrics report (compile and execute counters) does not exist natively.",
        "torch_neuronx.get_dynamo_metrics() for compilations, torch-neuronx check for the whole picture.")),
    ("torch_xla.debug.profiler", FlagRule(
        "xla-profiler", "XLA's profiler server and traces do not exist natively.",
        "torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]).")),
    ("torch_xla.amp.GradScaler", FlagRule(
        "xla-grad-scaler", "A gradient scaler is for fp16; Trainium trains in bf16, which needs none.",
        "drop the scaler and use torch.autocast('neuron', dtype=torch.bfloat16).")),
    ("torch_xla.core.xla_model.rendezvous", FlagRule(
        "xla-rendezvous-payload", "rendezvous with a payload returns every process's payload.",
        "torch.distributed.all_gather_object(out, payload) with out = [None] * world_size.")),
    ("torch_xla.core.xla_model.mark_step", FlagRule(
        "xla-mark-step-value", "mark_step used as a value: native eager execution has no step to mark.",
        "delete the call (torch.neuron.synchronize() if the code waited for the device).")),
    ("torch_xla.core.xla_model.all_gather", FlagRule(
        "xla-all-gather", "xm.all_gather returns the concatenation along `dim`.",
        "torch.distributed.all_gather_into_tensor(out, t) (dim 0) or all_gather + torch.cat(dim).")),
    ("torch_xla.core.xla_model.reduce_scatter", FlagRule(
        "xla-reduce-scatter", "xm.reduce_scatter takes XLA's reduce type and scale.",
        "torch.distributed.reduce_scatter_tensor(out, t, op=ReduceOp.SUM) then out.mul_(scale).")),
    ("torch_xla.distributed.xla_multiprocessing", FlagRule(
        "xla-spawn", "xmp.spawn used other than as a statement.",
        "launch with torchrun --nproc-per-node N and call the function with int(os.environ['LOCAL_RANK']).")),
    ("torch_xla.distributed.parallel_loader", FlagRule(
        "xla-parallel-loader", "This parallel loader form has no mechanical rewrite.",
        "iterate the DataLoader and move each batch with .to(device) (or NeuronDeviceLoader(loader, device)).")),
    ("torch_neuronx.xla_impl", FlagRule(
        "custom-op", "torch_neuronx.xla_impl custom ops were built for the XLA graph.",
        "write the kernel in NKI and register it with torch_neuronx.nki_op (docs/torchneuron.md).")),
    ("torch_neuronx.trace", FlagRule(
        "inference-trace", "Declined: torch_neuronx.trace compiles an inference graph ahead of time, outside "
        "training; it is not part of a training migration.",
        "keep it on an inference image, or run the model eagerly / torch.compile(model, backend='neuron').")),
    ("optimum.neuron.models.inference", FlagRule(
        "optimum-inference", "Declined: Optimum Neuron inference models are exported, precompiled artifacts.",
        "transformers' AutoModelFor*.from_pretrained(..., device_map='neuron') and generate() for native inference.")),
    ("optimum.neuron.NeuronModelFor", FlagRule(
        "optimum-inference", "Declined: Optimum Neuron inference models are exported, precompiled artifacts.",
        "transformers' AutoModelFor*.from_pretrained(..., device_map='neuron') and generate() for native inference.")),
    *((f"optimum.neuron.{prefix}", FlagRule(
        "optimum-inference", "Declined: Optimum Neuron diffusion pipelines are exported, precompiled artifacts.",
        "diffusers' pipeline: DiffusionPipeline.from_pretrained(...).to('neuron') (torch.compile the unet / "
        "transformer with backend='neuron' for speed).")) for prefix in (
        "NeuronStableDiffusion", "NeuronDiffusion", "NeuronLatentConsistency", "NeuronPixArt", "NeuronFlux",
        "modeling_diffusion")),
    ("optimum.neuron.accelerate", FlagRule(
        "optimum-accelerate", "Optimum Neuron's accelerator wraps XLA.",
        "accelerate.Accelerator() (it picks the neuron device and the neuron c10d backend by itself).")),
    ("optimum.neuron.models.training.config", FlagRule(
        "optimum-trn-config", "A TrainingNeuronConfig option with no native counterpart.",
        "transformers.distributed.DistributedConfig(tp_size=..., fsdp_size=...).")),
    ("neuronx_distributed.pipeline", FlagRule(
        "nxd-pipeline", "NxDPPModel pipelines through NxD's own scheduler.",
        "torch.distributed.pipelining (pipeline(), ScheduleGPipe / Schedule1F1B) on a 'pp' mesh dimension.")),
    ("neuronx_distributed.trainer.checkpoint", FlagRule(
        "nxd-checkpoint", "NxD checkpoints are saved per TP/PP rank in NxD's layout.",
        "torch.distributed.checkpoint (DCP): dcp.save / dcp.load of the DTensor state dict; convert old "
        "checkpoints once by merging the TP shards.")),
    ("neuronx_distributed.parallel_layers.checkpointing", FlagRule(
        "nxd-checkpoint", "NxD checkpoints are saved per TP/PP rank in NxD's layout.",
        "torch.distributed.checkpoint (DCP): dcp.save / dcp.load of the DTensor state dict; convert old "
        "checkpoints once by merging the TP shards.")),
    ("neuronx_distributed.lightning", FlagRule(
        "lightning", "NxD's Lightning integration drives XLA.",
        "Lightning with accelerator='auto' on the neuron device, or a plain training loop; strategy='fsdp' / DDP.")),
    ("neuronx_distributed.trainer", FlagRule(
        "nxd-trainer", "NxD's trainer (initialize_parallel_model / optimizer) wraps the model its own way.",
        "build the mesh with init_device_mesh, apply parallelize_module / fully_shard, use a torch.optim optimizer.")),
    ("neuronx_distributed.modules.moe", FlagRule(
        "nxd-moe", "NxD's MoE layers have no one-to-one native layer.",
        "transformers' MoE models with DistributedConfig(ep_size=...), or a DTensor plan for the experts.")),
]

GENERIC = FlagRule("no-rewrite", "No mechanical native equivalent is known for this reference.",
                   "rewrite by hand with torch / torch.distributed; see docs/migrate.md.")


def for_qualname(qualname: str) -> FlagRule:
    for prefix, rule in PREFIX_RULES:
        if qualname == prefix or qualname.startswith(prefix):
            return rule
    return GENERIC


BF16 = FlagRule(
    "bf16-env", "XLA_USE_BF16 / XLA_DOWNCAST_BF16 cast every float tensor to bf16 behind the code's back; the "
    "native backend does not read them.",
    "choose one: torch.autocast('neuron', dtype=torch.bfloat16) around the forward (fp32 weights and optimizer, "
    "closest to XLA_DOWNCAST_BF16) or model.to(torch.bfloat16) (all-bf16, as XLA_USE_BF16; expect the loss to "
    "differ from fp32 in the 3rd digit).")
CC_FLAGS = FlagRule(
    "neuron-cc-flags", "NEURON_CC_FLAGS passes options to neuronx-cc, the XLA-path compiler; the native backend "
    "does not read it.", "drop it; compile with torch.compile(model, backend='neuron') where wanted.")
XLA_ENV = FlagRule(
    "xla-env", "An XLA / PJRT runtime variable: the native backend does not read it.", "drop it.")
XLA_TEST = FlagRule(
    "xla-test", "A test for XLA (`x.device.type == 'xla'`, `'torch_xla' in sys.modules`) is now always false: the "
    "XLA branch it guards is dead code, and what it skipped now runs.",
    "test for the neuron device (x.device.type == 'neuron') or drop the branch, then migrate again.")


# torch_xla/core/xla_model.py: add_step_closure queues the closure; mark_step runs the queue after the step's graph
STEP_CLOSURE = FlagRule(
    "xla-step-closure", "XLA called this step closure at the next mark_step (after the optimizer step, the rest "
    "of the loop body or a `continue`, whatever ran before it); it is now called here, at once, with the values "
    "its arguments have here.",
    "check that nothing it reads changes before the next mark_step, or move the call to where that mark_step was.")


CLASS_SCOPE = FlagRule(
    "class-scope", "The class body binds this name on one path only (in an `if`, a loop, a `try`): here it is "
    "either the class's own or the import, and the rewrite cannot tell which.",
    "bind it on every path (or rename the class attribute), then migrate again.")
EARLY_GROUP = FlagRule(
    "xla-early-group", "Under torchrun the migrated script starts the process group first, before its first device "
    "use (`neuron_init_group()` after the helpers), as XLA's runtime joined the processes at start and the native "
    "runtime requires; this init_process_group, with other options, on one line with others or in an expression, "
    "would start a second one (initialised twice).",
    "guard it with `if not torch.distributed.is_initialized():` (its options then apply only without torchrun), "
    "or drop it.")
XLA_DEVICE_FSTRING = FlagRule(
    "xla-device-string", "An XLA device name built at run time (`f\"xla:{i}\"`, `\"xla:\" + str(i)`, "
    "`torch.device(\"xla\", i)`): each XLA process had its own "
    "`xla:0`; the rewrite cannot tell which core a built index means.",
    "torch.device('neuron', int(os.environ['LOCAL_RANK'])), the core of a torchrun worker.")
BACKEND_VAR = FlagRule(
    "xla-backend-var", "The process group's backend is not a literal (a variable assigned \"xla\", `args.backend`, "
    "`\"xla\" if c else \"gloo\"`) in a file that names \"xla\": it is left as it is, and the native "
    "init_process_group has no \"xla\" backend.",
    "make the value \"neuron\" where it was \"xla\" (or pass \"neuron\"); the group then starts as torchrun's, as "
    "XLA's did.")
XLA_INIT_METHOD = FlagRule(
    "xla-init-method", "XLA's init_method \"xla://\" / \"pjrt://\" took the world from XLA's runtime, also one "
    "process alone with no launcher; the native env:// rendezvous needs torchrun's RANK and WORLD_SIZE. This call "
    "cannot become `neuron_init_group(world_of_one=True)` (its value is used, it has other options, options "
    "follow the init_method by position, or the init_method is no plain string: a variable, an f-string, an "
    "expression, `**kwargs` that may hold it): a literal one is dropped, any other is left as it is.",
    "make it a statement of its own, `neuron_init_group(world_of_one=True)` (it starts torchrun's group, or alone "
    "a group of one), or run it under torchrun only.")
SETTING_AFTER_START = FlagRule(
    "xla-setting-after-start", "This environment setting comes after module code, so after the process group start "
    "that the migration puts before that code (as early as XLA's runtime joined the processes). The start reads the "
    "machine's settings (`NEURON_RT_VISIBLE_CORES`, `TORCH_DISTRIBUTED_DEBUG`, ...) and does not see this one; "
    "XLA's runtime read them at the first device use, later.",
    "set it in the launch environment (`NEURON_RT_VISIBLE_CORES=... torchrun ...`), or, when its value is known "
    "before the module code runs, move it next to the imports.")
SCRIPT_UNSURE = FlagRule(
    "xla-script-unsure", "The migration cannot tell whether this file is a script or a library: its module-level "
    "code calls something it does not know (not a function of this file, not an entry point like main()). A "
    "script run under torchrun needs the process group started first, before any device use, as XLA's runtime "
    "did; started at a library's import it would collide with the importing script's own group. Not started.",
    "a script: call `neuron_init_group()` after the inlined helpers, before any device use (or wrap the code in "
    "`if __name__ == \"__main__\":` and migrate again); a library: nothing to do.")
LIBRARY_GROUP = FlagRule(
    "xla-library-group", "A migrated script that imports this module starts the process group first under torchrun "
    "(`neuron_init_group()` after its helpers); this init_process_group, with other options, on one line with "
    "others or in an expression, would start a second one (initialised twice).",
    "guard it with `if not torch.distributed.is_initialized():` (its options then apply only without torchrun), "
    "or drop it.")
