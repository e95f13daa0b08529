"""``--measure``: run one real training step of each layout on emulated NeuronCores, to check the model against.

The analytic planner is only worth trusting where it agrees with a real run.
For a small configuration this module saves a random-weight checkpoint of the
model, starts one process per core (as torchrun would; consecutive layouts of
the same world size run one after another in one launch), and in each rank loads
it sharded the way Transformers does it (``from_pretrained(distributed_config=
DistributedConfig(tp_size, fsdp_size, dp_replicate_size))``: the model's own
``tp_plan`` and FSDP2 ``fully_shard`` over a DeviceMesh), runs a warm-up step,
then measures one more step: the caching allocator's peak
(``torch.neuron.max_memory_allocated``) and the bytes each process group
moved (``torch_neuronx.distributed.comm_stats``).

Sequence-parallel layouts run the Megatron / NxD scheme the planner models
(:mod:`~torch_neuronx.tools.plan.sequence_parallel`), with FSDP2 over FSDP x
DP applied as Transformers' ``fsdp_plan`` applies it. ZeRO-1 layouts
(DP only) run the replicated model with a flat ZeRO-1
optimizer written with plain collectives (:class:`Zero1`: gradients
reduce-scattered over DP into a flat buffer, AdamW on this rank's shard of
the parameters, the updated shards all-gathered). Pipeline layouts (PP only)
split the decoder into stages and run ``torch.distributed.pipelining``'s
``Schedule1F1B`` over the step's micro-batches.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch_neuronx.tools.plan.layouts import Layout, PlanError

WORKER_TIMEOUT_S = 300.0
STACKS_BEFORE_DEADLINE_S = 15.0  # a rank still running then writes every thread's Python stack to its log
_STACKS_AFTER = "TORCH_NEURONX_PLAN_STACKS_AFTER_S"


def save_checkpoint(config: Any, path: Path, seed: int = 0) -> Path:
    """A random-weight checkpoint of `config` (a transformers PretrainedConfig), as from_pretrained reads it."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def measure_layouts(config: Any, layouts: list[Layout], *, micro_batch: int, seq_len: int, precision: str,
                    checkpointing: str, instance: str = "trn1.32xlarge", lnc: int = 1, hbm_per_core: int | None = None,
                    workdir: Path | None = None, zero1: bool = False, sequence_parallel: bool = False,
                    global_batch: int | None = None, _temporary: bool = False) -> list[dict[str, Any]]:
    """Run one optimizer step of each layout for real; one dict per layout with the ranks' peak memory and comm
    bytes per group. A step is `global_batch` sequences: `global_batch / (micro_batch x FSDP x DP)` micro-batches
    of gradient accumulation per rank (default: one).

    With `hbm_per_core` the emulated cores have that capacity: a layout that does not fit fails with the device's
    out-of-memory error, as it would on the instance.
    """
    if checkpointing == "selective":
        raise ValueError("--measure runs 'none' or 'full' activation checkpointing; Transformers has no selective "
                         "recomputation to run: plan 'selective' analytically, without --measure")
    for layout in layouts:
        problem = measurable(layout, zero1, precision, checkpointing, sequence_parallel, seq_len)
        if problem:
            raise ValueError(f"--measure cannot run layout {layout}: {problem}")
    from torch_neuronx.runtime import processes

    if workdir is None:  # SIGINT / SIGTERM stop the workers and raise (processes.Interrupted): the folder goes too
        with processes.guarded(), tempfile.TemporaryDirectory(prefix="neuron_plan_") as tmp:
            return measure_layouts(config, layouts, micro_batch=micro_batch, seq_len=seq_len, precision=precision,
                                   checkpointing=checkpointing, instance=instance, lnc=lnc,
                                   hbm_per_core=hbm_per_core, workdir=Path(tmp), zero1=zero1,
                                   sequence_parallel=sequence_parallel, global_batch=global_batch, _temporary=True)
    work = Path(workdir)
    ckpt = save_checkpoint(config, work / "checkpoint")
    specs = []
    for layout in layouts:
        z = zero1 and layout.dp > 1  # ZeRO-1 shards over DP: without DP it is the plain layout
        sp = sequence_parallel and layout.tp > 1  # likewise sequence parallelism over TP
        micro_steps = max(1, (global_batch or 0) // (micro_batch * layout.data_parallel))
        suffix = ("_zero1" if z else "") + ("_sp" if sp else "")
        out = work / f"tp{layout.tp}_pp{layout.pp}_fsdp{layout.fsdp}_dp{layout.dp}{suffix}"
        out.mkdir(parents=True, exist_ok=True)
        specs.append({"out": str(out), "tp": layout.tp, "fsdp": layout.fsdp, "dp": layout.dp, "pp": layout.pp,
                      "micro_batch": micro_batch, "seq_len": seq_len, "precision": precision,
                      "checkpointing": checkpointing, "zero1": int(z), "micro_steps": micro_steps, "sp": int(sp)})
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "TORCH_NEURONX_INSTANCE_TYPE": instance,
           "NEURON_LOGICAL_NC_CONFIG": str(lnc)}
    if hbm_per_core:
        env["TORCH_NEURONX_HBM_PER_CORE"] = str(hbm_per_core)
    if _temporary:  # a SIGKILL of this process runs no cleanup: the workers' guardians remove the folder then
        env[processes.REMOVE_ON_STARTER_EXIT] = str(work)
    for start, stop in _launches(layouts):
        _launch(ckpt, work / f"launch{start}", layouts[start:stop], specs[start:stop], env)
    results = []
    for layout, spec in zip(layouts, specs, strict=True):
        ranks = [json.loads((Path(spec["out"]) / f"rank{r}.json").read_text()) for r in range(layout.world)]
        results.append({"tp": layout.tp, "fsdp": layout.fsdp, "dp": layout.dp, "pp": layout.pp,
                        "zero1": bool(spec["zero1"]), "sequence_parallel": bool(spec["sp"]),
                        "micro_steps": spec["micro_steps"], "per_step": True, "ranks": ranks})
    return results


def _launches(layouts: list[Layout]) -> list[tuple[int, int]]:
    """The layouts in runs of one launch each: consecutive layouts of the same world size share their processes
    (a rank's start, mostly importing torch and Transformers, costs more than a tiny model's step)."""
    bounds = [i for i in range(1, len(layouts)) if layouts[i].world != layouts[i - 1].world]
    return list(zip([0, *bounds], [*bounds, len(layouts)], strict=True))


def _launch(ckpt: Path, folder: Path, layouts: list[Layout], specs: list[dict[str, Any]],
            env: dict[str, str]) -> None:
    """One process per core, each measuring `layouts` one after another (each rank writes its rank{r}.json into
    each layout's folder as that layout ends); a failure raises MeasureFailed naming the layout it happened in."""
    from torch_neuronx.runtime import processes
    from torch_neuronx.testing.workers import agent_store, rank_env, run_processes

    folder.mkdir(parents=True, exist_ok=True)
    spec_file = folder / "layouts.json"
    spec_file.write_text(json.dumps(specs, indent=1))
    timeout = WORKER_TIMEOUT_S * len(layouts)  # each layout has the deadline one alone had
    args = [sys.executable, "-m", "torch_neuronx.tools.plan.measure", str(ckpt), str(spec_file)]
    env = {**env, _STACKS_AFTER: str(timeout - STACKS_BEFORE_DEADLINE_S)}
    world = layouts[0].world
    # a rank that fails ends its peers (they would wait for it in a collective)
    with processes.guarded(), agent_store() as port:
        cmds = [(args, {**rank_env(r, world, port, agent_store=True), **env}) for r in range(world)]
        procs = run_processes(cmds, folder, timeout, fail_fast=True)
    if any(p.rc != 0 for p in procs):
        # the layout that failed: the first one some rank did not finish
        failed = next((lay for lay, spec in zip(layouts, specs, strict=True)
                       if not all((Path(spec["out"]) / f"rank{r}.json").exists() for r in range(world))),
                      layouts[-1])
        raise MeasureFailed(_failure(failed, procs, timeout))


class MeasureFailed(PlanError):
    """A rank of a --measure run failed: the message names it, its last error line and where its log was kept."""


def _failure(layout: Layout, procs: list[Any], timeout: float = WORKER_TIMEOUT_S) -> str:
    """One line about the rank that failed first (the others were stopped because of it); its whole log is copied
    out of the run's folder, which is removed, into a file the message names."""
    # the rank that ended on its own with an error, the earliest; the ranks stopped because of it only when none
    # did (all of them ran into the deadline)
    own = sorted((p.seconds, i) for i, p in enumerate(procs) if p.rc != 0 and not (p.timed_out or p.stopped))
    rank = own[0][1] if own else next(i for i, p in enumerate(procs) if p.rc != 0)
    proc = procs[rank]
    last = next((line.strip() for line in reversed(proc.err.splitlines()) if line.strip()), "")
    fd, log = tempfile.mkstemp(prefix=f"plan_measure_rank{rank}_", suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write(proc.log())
    if proc.timed_out:
        stacks = hung_stacks(proc.err)
        return (f"--measure of layout {layout} failed: rank {rank} timed out after {timeout:.0f} s"
                f"{'; where its threads were: ' + stacks if stacks else ''}; its log: {log}")
    return (f"--measure of layout {layout} failed: rank {rank} exited {proc.rc}"
            f"{' (' + last[:200] + ')' if last else ''}; its log: {log}")


def hung_stacks(err: str) -> str:
    """The innermost two frames of each thread in the stack dump a rank wrote before its deadline
    (faulthandler's format), on one line: "" when the log holds no dump."""
    dump = err[err.rfind("Timeout ("):] if "Timeout (" in err else ""
    threads = []
    for block in dump.split("\n\n"):
        frames = [line.strip() for line in block.splitlines() if line.strip().startswith("File ")]
        if frames:
            threads.append(" <- ".join(f.replace("File ", "", 1) for f in frames[:2]))
    return " | ".join(threads)


def measurable(layout: Layout, zero1: bool, precision: str, checkpointing: str, sequence_parallel: bool = False,
               seq_len: int = 0, kv_replicas: int = 1) -> str:
    """Why `layout` cannot be run by --measure ("" when it can). `kv_replicas` > 1: TP exceeds the KV heads, which
    only the sequence-parallel (NxD) model replicates, over the whole world (Transformers' tp_plan cannot)."""
    if kv_replicas > 1 and not (sequence_parallel and layout.world == layout.tp):
        return ("KV heads replicated over TP (NxD's kv_size_multiplier) are measured with --sequence-parallel and TP "
                "alone (Transformers' tp_plan cannot replicate them)")
    if sequence_parallel and layout.tp > 1:
        if layout.pp > 1:
            return "sequence parallelism is measured with TP, FSDP and DP (without pipeline stages)"
        if precision == "bf16-mixed" and layout.data_parallel == 1:
            return "bf16-mixed is FSDP2's mixed precision: with sequence parallelism it is measured with FSDP x DP > 1"
        if seq_len % layout.tp:
            return f"sequence parallelism splits the sequence over TP: {seq_len} tokens do not divide by {layout.tp}"
    if zero1 and layout.dp > 1:
        if (layout.tp, layout.fsdp, layout.pp) != (1, 1, 1):
            return "ZeRO-1 is measured over data parallelism alone (TP = PP = FSDP = 1)"
        if precision == "bf16-mixed":
            return "ZeRO-1 is measured in fp32 or bf16 (bf16-mixed is FSDP2's mixed precision)"
    if layout.pp > 1:
        if (layout.tp, layout.fsdp, layout.dp) != (1, 1, 1):
            return "pipelines are measured alone (TP = FSDP = DP = 1)"
        if precision == "bf16-mixed" or checkpointing != "none":
            return "pipelines are measured in fp32 or bf16 without checkpointing"
    return ""


def group_label(ranks: list[int], tp: int, fsdp: int, dp: int = 1) -> str:
    """Name a process group by the mesh dimensions (pp, dp, fsdp, tp; tp innermost) its ranks span."""
    def coords(r: int) -> tuple[int, int, int, int]:
        return r // (tp * fsdp * dp), (r // (tp * fsdp)) % dp, (r // tp) % fsdp, r % tp

    cs = [coords(r) for r in ranks]
    spans = [name for i, name in enumerate(("pp", "dp", "fsdp", "tp")) if len({c[i] for c in cs}) > 1]
    return "+".join(spans) or "self"


class Zero1:
    """ZeRO-1 over the default group: every rank keeps the whole model and its gradients, and 1/world of the AdamW
    state. The parameters live, for the optimizer, in one flat master shard per rank (padded to a multiple of the
    world size); after backward the gradients are copied into one flat buffer and reduce-scattered into the shard's
    gradient, AdamW updates the shard, and the shards are all-gathered back into the parameters."""

    def __init__(self, params: list[Any], lr: float = 1e-3) -> None:
        import torch
        import torch.distributed as dist

        self.params = params
        self.world, rank = dist.get_world_size(), dist.get_rank()
        total = sum(p.numel() for p in params)
        self.padded = -(-total // self.world) * self.world
        self.shard = self.padded // self.world
        device, dtype = params[0].device, params[0].dtype
        master = torch.zeros(self.shard, dtype=dtype, device=device)
        lo, hi, off = rank * self.shard, (rank + 1) * self.shard, 0
        with torch.no_grad():
            for p in params:  # this rank's slice of the flat parameters, without materialising all of them
                a, b = max(lo, off), min(hi, off + p.numel())
                if a < b:
                    master[a - lo:b - lo].copy_(p.detach().reshape(-1)[a - off:b - off])
                off += p.numel()
        self.master = master.requires_grad_()
        self.optimizer = torch.optim.AdamW([self.master], lr=lr, foreach=False)

    def step(self) -> None:
        import torch
        import torch.distributed as dist

        grad_dtype = self.params[0].grad.dtype
        flat = torch.zeros(self.padded, dtype=grad_dtype, device=self.master.device)
        off = 0
        for p in self.params:
            flat[off:off + p.numel()].copy_(p.grad.reshape(-1))
            p.grad = None
            off += p.numel()
        grad = torch.empty(self.shard, dtype=grad_dtype, device=self.master.device)
        dist.reduce_scatter_single(grad, flat)
        del flat
        self.master.grad = grad.div_(self.world)
        self.optimizer.step()
        self.master.grad = None
        del grad
        full = torch.empty(self.padded, dtype=self.master.dtype, device=self.master.device)
        dist.all_gather_single(full, self.master.detach())
        off = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(full[off:off + p.numel()].view_as(p))
                off += p.numel()
        del full

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


def _stage_module(model: Any, stage: int, stages: int) -> Any:
    """Pipeline stage `stage` of a Hugging Face decoder: its layers, the embedding (first) or norm + LM head (last)."""
    import torch
    from torch import nn

    from torch_neuronx.tools.plan.tensors import stage_layers

    lo = sum(stage_layers(model.config.num_hidden_layers, stages, s) for s in range(stage))
    hi = lo + stage_layers(model.config.num_hidden_layers, stages, stage)
    inner = model.model

    class Stage(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = inner.embed_tokens if stage == 0 else None
            self.layers = nn.ModuleList(inner.layers[lo:hi])
            self.rotary = inner.rotary_emb
            self.norm = inner.norm if stage == stages - 1 else None
            self.head = model.lm_head if stage == stages - 1 else None

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.embed(x) if self.embed is not None else x
            pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            pe = self.rotary(h, pos)
            for layer in self.layers:  # no mask: SDPA runs causal
                h = layer(h, attention_mask=None, position_embeddings=pe, position_ids=pos)
            if self.head is not None:
                h = self.head(self.norm(h))
            return h

    return Stage()


def _worker(argv: list[str]) -> None:
    """One rank: measure each layout of the launch's spec file in turn, in one process group."""
    import os

    import torch.distributed as dist

    ckpt, specs = Path(argv[0]), json.loads(Path(argv[1]).read_text())
    if os.environ.get(_STACKS_AFTER):  # a hang is then reported with where every thread waited
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ[_STACKS_AFTER]), exit=False)
    dist.init_process_group("neuron")
    import torch

    idle = torch.neuron.memory_allocated(torch.neuron.current_device())  # what a fresh rank holds before a layout
    for spec in specs:
        _measure_one(ckpt, spec, idle)
    dist.destroy_process_group()
    if os.environ.get(_STACKS_AFTER):
        import faulthandler

        faulthandler.cancel_dump_traceback_later()


def _measure_one(ckpt: Path, spec: dict[str, Any], idle: int) -> None:
    """Warm-up and measured step of one layout; its rank{r}.json, then everything it made is released: the next
    layout starts from the device as a fresh rank had it (`idle` bytes allocated: checked) and counts the calls of
    its measured step on every group, whichever layout made it."""
    import gc
    import os
    import time

    import torch
    import torch.distributed as dist

    import torch_neuronx.distributed as nd

    out = Path(spec["out"])
    tp, fsdp, dp, pp = spec["tp"], spec["fsdp"], spec["dp"], spec["pp"]
    micro_batch, seq_len, micro_steps = spec["micro_batch"], spec["seq_len"], spec["micro_steps"]
    precision, checkpointing = spec["precision"], spec["checkpointing"]
    torch.set_num_threads(1)
    rank = dist.get_rank()
    device = torch.device("neuron", torch.neuron.current_device())
    if torch.neuron.memory_allocated(device) != idle:
        raise RuntimeError(f"--measure: {torch.neuron.memory_allocated(device) - idle} bytes still allocated on "
                           f"{device} from the layout before: its peak would count them")
    torch.neuron.reset_peak_memory_stats(device)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    data_rank = rank // tp if pp == 1 else 0  # the same rows on every rank of a tp group (a pipeline: one input)
    g = torch.Generator().manual_seed(data_rank)
    if pp > 1:
        step, vocab = _pipeline_step(ckpt, pp, rank, device, dtype, micro_steps)
    elif spec["sp"]:
        step, vocab = _sequence_parallel_step(ckpt, tp, fsdp, dp, precision, checkpointing, device, dtype,
                                              micro_batch)
    else:
        step, vocab = _plain_step(ckpt, tp, fsdp, dp, precision, checkpointing, device, dtype, bool(spec["zero1"]),
                                  micro_batch)
    rows = micro_batch * micro_steps
    batches = [torch.randint(4, vocab, (rows, seq_len), generator=g).to(device) for _ in range(2)]
    after_load = torch.neuron.memory_allocated(device)
    warm_loss = step(batches[0])  # warm-up: creates the optimizer state (and a pipeline's shapes)
    torch.neuron.synchronize()
    # every group, an earlier layout's included: a layout's collectives may run on a group of the same ranks that
    # an earlier layout of the launch made (2x1x1x2 measured after 2x1x2x1 ran all its TP all-reduces on the first
    # layout's TP groups, and counted none); the stats are reset here, so a group this layout does not use counts
    # no call
    groups = [pg for pg in dist.distributed_c10d._world.pg_group_ranks
              if isinstance(pg, dist.ProcessGroup) and pg.size() > 1]
    for pg in groups:
        nd.reset_comm_stats(pg)
    torch.neuron.reset_peak_memory_stats(device)
    snapshot = os.environ.get("PLAN_MEASURE_SNAPSHOT")  # debugging the estimate: rank 0's allocations
    if snapshot and rank == 0:
        torch.neuron.memory._record_memory_history(max_entries=100000)
    before = torch.neuron.memory_allocated(device)
    t0 = time.perf_counter()
    loss = step(batches[1])
    torch.neuron.synchronize()
    seconds = time.perf_counter() - t0
    if snapshot and rank == 0:
        torch.neuron.memory._dump_snapshot(snapshot)  # the launch's last layout's, when it runs several
        torch.neuron.memory._record_memory_history(enabled=None)
    stats = torch.neuron.memory_stats(device)
    comm = []
    for pg in groups:
        ranks = sorted(dist.get_process_group_ranks(pg))
        if rank in ranks:
            comm.append({"group": group_label(ranks, tp, fsdp, dp), "ranks": ranks, "stats": nd.comm_stats(pg)})
    record = {"rank": rank, "warm_up_loss": warm_loss, "loss": loss, "seconds": seconds,
              "after_load_allocated": after_load, "step_start_allocated": before,
              "peak_allocated": torch.neuron.max_memory_allocated(device),
              "peak_reserved": stats.get("reserved_bytes.all.peak", 0), "comm": comm}
    dist.barrier()  # no rank frees (or starts the next layout) while a peer still runs this one's collectives
    del step, batches, groups
    gc.collect()
    torch.neuron.empty_cache()
    (out / f"rank{rank}.json").write_text(json.dumps(record, indent=1))


def _plain_step(ckpt: Path, tp: int, fsdp: int, dp: int, precision: str, checkpointing: str, device: Any,
                dtype: Any, zero1: bool, micro_batch: int) -> tuple[Any, int]:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    if zero1:
        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype).to(device)
        optimizer: Any = Zero1([p for p in model.parameters() if p.requires_grad])
    else:
        config = DistributedConfig(tp_size=tp, fsdp_size=fsdp, dp_replicate_size=dp,
                                   fsdp_mixed_precision=precision == "bf16-mixed")
        model = AutoModelForCausalLM.from_pretrained(ckpt, distributed_config=config, dtype=dtype)
        # per-parameter AdamW: pure TP leaves some parameters plain tensors, which foreach kernels cannot mix with
        # DTensors
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    if checkpointing == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()

    return _accumulating_step(model, lambda ids: model(input_ids=ids, labels=ids).loss, optimizer, micro_batch), \
        model.config.vocab_size


def _accumulating_step(model: Any, loss_of: Callable[[Any], Any], optimizer: Any, micro_batch: int,
                       before_optimizer: Callable[[], None] | None = None) -> Callable[[Any], float]:
    """One optimizer step over a batch in micro-batches of `micro_batch` rows (gradient accumulation)."""
    from torch.distributed.fsdp import FSDPModule

    fsdp_modules = [mod for mod in model.modules() if isinstance(mod, FSDPModule)]

    def step(ids: Any) -> float:
        chunks = ids.split(micro_batch)
        total = 0.0
        for i, chunk in enumerate(chunks):
            for mod in fsdp_modules:  # HSDP all-reduces across replicas on the last micro-batch only
                mod.set_requires_all_reduce(i == len(chunks) - 1, recurse=False)
            loss = loss_of(chunk) / len(chunks)
            loss.backward()
            total += float(loss.detach().float().cpu())
        if before_optimizer is not None:
            before_optimizer()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total

    return step


def _sequence_parallel_step(ckpt: Path, tp: int, fsdp: int, dp: int, precision: str, checkpointing: str,
                            device: Any, dtype: Any, micro_batch: int) -> tuple[Any, int]:
    """Megatron / NxD sequence parallelism over TP; over FSDP x DP, FSDP2 as Transformers' ``fsdp_plan`` applies
    it (the embedding and each layer resharded after forward, the final norm and LM head kept, then the root)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoModelForCausalLM

    from torch_neuronx.tools.plan.sequence_parallel import SequenceParallelLlama

    mesh = init_device_mesh("neuron", (dp, fsdp, tp), mesh_dim_names=("dp_replicate", "fsdp", "tp"))
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype)  # on the host; only this rank's shard moves
    module = SequenceParallelLlama(model, group=mesh["tp"].get_group(),
                                   checkpointing=checkpointing == "full").to(device)
    vocab = model.config.vocab_size
    del model
    if fsdp * dp > 1:
        shard_mesh = mesh["dp_replicate", "fsdp"] if dp > 1 else mesh["fsdp"]
        kw: dict[str, Any] = {"mesh": shard_mesh}
        if precision == "bf16-mixed":
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        fully_shard(module.embed_tokens, reshard_after_forward=True, **kw)
        for layer in module.layers:
            fully_shard(layer, reshard_after_forward=True, **kw)
        fully_shard([module.norm, module.lm_head], reshard_after_forward=False, **kw)
        fully_shard(module, **kw)
    module.train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3, foreach=False)

    def loss_of(ids: Any) -> Any:
        target = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)  # next-token labels
        return module(ids, target)

    return _accumulating_step(module, loss_of, optimizer, micro_batch, module.all_reduce_norm_grads), vocab


def _pipeline_step(ckpt: Path, pp: int, rank: int, device: Any, dtype: Any, micro_steps: int) -> tuple[Any, int]:
    import torch
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype)  # on the host; only this stage moves
    module = _stage_module(model, rank, pp).to(device)
    module.train()
    vocab = model.config.vocab_size
    del model
    stage = PipelineStage(module, rank, pp, device)

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100)

    schedule = Schedule1F1B(stage, n_microbatches=micro_steps, loss_fn=loss_fn)
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3, foreach=False)

    def step(ids: Any) -> float:
        target = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)  # next-token labels
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(ids)
        elif rank == pp - 1:
            schedule.step(target=target, losses=losses)
        else:
            schedule.step()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(torch.stack(losses).mean().float().cpu()) if losses else 0.0

    return step, vocab


if __name__ == "__main__":
    _worker(sys.argv[1:])


def measured_comm(run: dict[str, Any]) -> dict[tuple[str, str], dict[str, int]]:
    """Rank 0's collectives by (group, collective): what one core did in the measured step."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for entry in run["ranks"][0]["comm"]:
        for name, stats in entry["stats"].items():
            if stats["calls"]:
                seen = out.setdefault((entry["group"], name), {"calls": 0, "bytes": 0})
                seen["calls"] += stats["calls"]
                seen["bytes"] += stats["bytes"]
    return out


def compare(lp: Any, run: dict[str, Any]) -> dict[str, Any]:
    """The measured step beside the analytic figures of its layout plan (per micro-batch)."""
    peak = max(r["peak_allocated"] for r in run["ranks"])
    got = measured_comm(run)
    analytic: dict[tuple[str, str], dict[str, int]] = {}
    for c in lp.comm:  # one row per (group, collective): a kind may be planned in parts (per micro-batch, per step)
        # the measured step runs one micro-batch, or (a pipeline) the whole step
        k = lp.micro_steps if c.per_micro_batch and not run.get("per_step") else 1
        row = analytic.setdefault((c.group, c.collective), {"calls": 0, "bytes": 0})
        row["calls"] += c.calls // k
        row["bytes"] += c.bytes // k
    rows = []
    for (group, name), a in analytic.items():
        seen = got.pop((group, name), {"calls": 0, "bytes": 0})
        rows.append({"group": group, "collective": name, "analytic_calls": a["calls"], "analytic_bytes": a["bytes"],
                     "calls": seen["calls"], "bytes": seen["bytes"]})
    rows += [{"group": g, "collective": n, "analytic_calls": 0, "analytic_bytes": 0, **s} for (g, n), s in got.items()]
    reserved = max(r["peak_reserved"] for r in run["ranks"])
    return {"peak_allocated": peak, "peak_reserved": reserved, "analytic_peak": lp.memory.total,
            "memory_error": lp.memory.total / peak - 1, "analytic_reserved": lp.memory.reserved,
            "reserved_error": lp.memory.reserved / reserved - 1 if reserved else 0.0,
            "comm": rows, "comm_exact": all(r["bytes"] == r["analytic_bytes"] for r in rows),
            "step_seconds_emulated": max(r["seconds"] for r in run["ranks"]),
            "loss": run["ranks"][-1]["loss"], "warm_up_loss": run["ranks"][-1]["warm_up_loss"]}
