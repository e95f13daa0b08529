"""``--measure``: run one real training step of each layout on emulated NeuronCores, to check the model against.

The analytic planner is only worth trusting where it agrees with a real run.
For a small configuration this module saves a random-weight checkpoint of the
model, starts one process per core (as torchrun would), and in each rank loads
it sharded the way Transformers does it (``from_pretrained(distributed_config=
DistributedConfig(tp_size, fsdp_size, dp_replicate_size))``: the model's own
``tp_plan`` and FSDP2 ``fully_shard`` over a DeviceMesh), runs a warm-up step,
then measures one more step: the caching allocator's peak
(``torch.neuron.max_memory_allocated``) and the bytes each process group
moved (``torch_neuronx.distributed.comm_stats``).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from torch_neuronx.tools.plan.layouts import Layout

WORKER_TIMEOUT_S = 300.0


def save_checkpoint(config: Any, path: Path, seed: int = 0) -> Path:
    """A random-weight checkpoint of `config` (a transformers PretrainedConfig), as from_pretrained reads it."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def measure_layouts(config: Any, layouts: list[Layout], *, micro_batch: int, seq_len: int, precision: str,
                    checkpointing: str, instance: str = "trn1.32xlarge", lnc: int = 1, hbm_per_core: int | None = None,
                    workdir: Path | None = None) -> list[dict[str, Any]]:
    """Run each layout for real; one dict per layout with the ranks' peak memory and comm bytes per group.

    With `hbm_per_core` the emulated cores have that capacity: a layout that does not fit fails with the device's
    out-of-memory error, as it would on the instance.
    """
    from torch_neuronx.testing.workers import free_port, rank_env, run_processes

    if checkpointing == "selective":
        raise ValueError("--measure runs 'none' or 'full' activation checkpointing; Transformers has no selective "
                         "recomputation to run: plan 'selective' analytically, without --measure")
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="neuron_plan_") as tmp:
            return measure_layouts(config, layouts, micro_batch=micro_batch, seq_len=seq_len, precision=precision,
                                   checkpointing=checkpointing, instance=instance, lnc=lnc,
                                   hbm_per_core=hbm_per_core, workdir=Path(tmp))
    work = Path(workdir)
    ckpt = save_checkpoint(config, work / "checkpoint")
    results = []
    for layout in layouts:
        out = work / f"tp{layout.tp}_fsdp{layout.fsdp}_dp{layout.dp}"
        out.mkdir(parents=True, exist_ok=True)
        port = free_port()
        args = [sys.executable, "-m", "torch_neuronx.tools.plan.measure", str(ckpt), str(out),
                str(layout.tp), str(layout.fsdp), str(layout.dp), str(micro_batch), str(seq_len), precision,
                checkpointing]
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "TORCH_NEURONX_INSTANCE_TYPE": instance,
               "NEURON_LOGICAL_NC_CONFIG": str(lnc)}
        if hbm_per_core:
            env["TORCH_NEURONX_HBM_PER_CORE"] = str(hbm_per_core)
        cmds = [(args, {**rank_env(r, layout.world, port), **env}) for r in range(layout.world)]
        procs = run_processes(cmds, out, WORKER_TIMEOUT_S)
        if any(p.rc != 0 for p in procs):
            logs = "\n".join(f"=== rank {i}: {p.log()}" for i, p in enumerate(procs))
            raise RuntimeError(f"--measure of layout {layout} failed:\n{logs}")
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(layout.world)]
        results.append({"tp": layout.tp, "fsdp": layout.fsdp, "dp": layout.dp, "ranks": ranks})
    return results


def group_label(ranks: list[int], tp: int, fsdp: int) -> str:
    """Name a process group by the mesh dimensions (dp, fsdp, tp; tp innermost) its ranks span."""
    def coords(r: int) -> tuple[int, int, int]:
        return r // (tp * fsdp), (r // tp) % fsdp, r % tp

    cs = [coords(r) for r in ranks]
    spans = [name for i, name in enumerate(("dp", "fsdp", "tp")) if len({c[i] for c in cs}) > 1]
    return "+".join(spans) or "self"


def _step(model: Any, optimizer: Any, ids: Any) -> float:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach().float().cpu())


def _worker(argv: list[str]) -> None:
    import time

    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    import torch_neuronx.distributed as nd

    ckpt, out = Path(argv[0]), Path(argv[1])
    tp, fsdp, dp, micro_batch, seq_len = (int(a) for a in argv[2:7])
    precision, checkpointing = argv[7], argv[8]
    torch.set_num_threads(1)
    dist.init_process_group("neuron")
    rank = dist.get_rank()
    device = torch.device("neuron", torch.neuron.current_device())
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    config = DistributedConfig(tp_size=tp, fsdp_size=fsdp, dp_replicate_size=dp,
                               fsdp_mixed_precision=precision == "bf16-mixed")
    model = AutoModelForCausalLM.from_pretrained(ckpt, distributed_config=config, dtype=dtype)
    if checkpointing == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    # per-parameter AdamW: pure TP leaves some parameters plain tensors, which foreach kernels cannot mix with DTensors
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    data_rank = rank // tp  # the same rows on every rank of a tp group
    g = torch.Generator().manual_seed(data_rank)
    vocab = model.config.vocab_size
    batches = [torch.randint(4, vocab, (micro_batch, seq_len), generator=g).to(device) for _ in range(2)]
    after_load = torch.neuron.memory_allocated(device)
    _step(model, optimizer, batches[0])  # warm-up: creates the optimizer state
    torch.neuron.synchronize()
    groups = [pg for pg in dist.distributed_c10d._world.pg_group_ranks
              if isinstance(pg, dist.ProcessGroup) and pg.size() > 1]
    for pg in groups:
        nd.reset_comm_stats(pg)
    torch.neuron.reset_peak_memory_stats(device)
    before = torch.neuron.memory_allocated(device)
    t0 = time.perf_counter()
    loss = _step(model, optimizer, batches[1])
    torch.neuron.synchronize()
    seconds = time.perf_counter() - t0
    stats = torch.neuron.memory_stats(device)
    comm = []
    for pg in groups:
        ranks = sorted(dist.get_process_group_ranks(pg))
        if rank in ranks:
            comm.append({"group": group_label(ranks, tp, fsdp), "ranks": ranks, "stats": nd.comm_stats(pg)})
    record = {"rank": rank, "loss": loss, "seconds": seconds, "after_load_allocated": after_load,
              "step_start_allocated": before, "peak_allocated": torch.neuron.max_memory_allocated(device),
              "peak_reserved": stats.get("reserved_bytes.all.peak", 0), "comm": comm}
    (out / f"rank{rank}.json").write_text(json.dumps(record, indent=1))
    dist.destroy_process_group()


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
    rows = []
    for c in lp.comm:
        seen = got.pop((c.group, c.collective), {"calls": 0, "bytes": 0})
        rows.append({"group": c.group, "collective": c.collective, "analytic_calls": c.calls // lp.micro_steps,
                     "analytic_bytes": c.bytes // lp.micro_steps, "calls": seen["calls"], "bytes": seen["bytes"]})
    rows += [{"group": g, "collective": n, "analytic_calls": 0, "analytic_bytes": 0, **s} for (g, n), s in got.items()]
    return {"peak_allocated": peak, "peak_reserved": max(r["peak_reserved"] for r in run["ranks"]),
            "analytic_peak": lp.memory.total, "memory_error": lp.memory.total / peak - 1,
            "comm": rows, "comm_exact": all(r["bytes"] == r["analytic_bytes"] for r in rows),
            "step_seconds_emulated": max(r["seconds"] for r in run["ranks"])}
