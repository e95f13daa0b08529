"""More jobs for tests/tools/test_check.py (issue 21): `python check_jobs.py JOB DEVICE OUT`.

Each is an ordinary script with one planted fault (or none: "dropout", "ddp_dropout"), nothing of the
checker in it unless the job is about the checker's marker. Distributed jobs pick their core the portable
way (neuron:LOCAL_RANK, set before init_process_group), so they run whether a rank sees every core or only
its own.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time

import torch


def model_and_data(device: str, dropout: float = 0.0) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = [torch.nn.Linear(8, 16), torch.nn.ReLU()]
    if dropout:
        layers.append(torch.nn.Dropout(dropout))
    model = torch.nn.Sequential(*layers, torch.nn.Linear(16, 4)).to(device)
    batches = [torch.randn(4, 8) for _ in range(4)]  # drawn from the CPU generator, after the init
    return model, [b.to(device) for b in batches]


def losses_job(fault: str, device: str) -> None:
    model, batches = model_and_data(device, dropout=0.3 if fault == "dropout" else 0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x in batches:
        out = model(x)
        opt.zero_grad()
        if fault == "vector_loss":  # the fault: 8x the gradient on neuron only
            out.backward(torch.full_like(out, 8.0 if device == "neuron" else 1.0) / out.numel())
        elif fault == "autograd_grad":  # the fault: doubled gradients on neuron only
            loss = out.pow(2).mean() * (2.0 if device == "neuron" else 1.0)
            grads = torch.autograd.grad(loss, list(model.parameters()))
            for p, g in zip(model.parameters(), grads, strict=True):
                p.grad = g
        elif fault == "no_loss":  # the fault: the loss is computed, never back-propagated
            out.pow(2).mean()
        else:
            out.pow(2).mean().backward()
        opt.step()


def compiled_dropout_job(device: str) -> None:
    """Correct, two compiled models in one job: the portable form (the neuron backend on neuron, Inductor on
    CPU) with dropout in the graph, and `backend="neuron"` written unconditionally (the reference must run it)."""
    model, batches = model_and_data(device, dropout=0.3)
    torch.manual_seed(1)
    plain = torch.nn.Linear(8, 4).to(device)
    portable = torch.compile(model, backend="neuron" if device == "neuron" else "inductor")
    unchanged = torch.compile(plain, backend="neuron")
    opt = torch.optim.SGD([*model.parameters(), *plain.parameters()], lr=0.05)
    for x in batches[:2]:
        opt.zero_grad()
        (portable(x).pow(2).mean() + unchanged(x).pow(2).mean()).backward()
        opt.step()


def train_two_steps_and_save(model: torch.nn.Module, batches: list[torch.Tensor], path: str) -> None:
    """Two SGD steps on the first two batches, then the state dict saved as CPU tensors at `path`."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x in batches[:2]:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, path)


def resume_job(device: str, out: str) -> None:
    """Correct: resumes from its own checkpoint when one exists, trains 2 steps, saves it (checked twice, the
    second check must not compare a resumed neuron run with a fresh reference)."""
    model, batches = model_and_data(device)
    path = os.path.join(out, "ckpt.pt")
    if os.path.exists(path):
        model.load_state_dict(torch.load(path))
    train_two_steps_and_save(model, batches, path)


def pretrained_job(device: str, out: str) -> None:
    """Correct: starts from a pretrained file it only reads (given to the checker as --checkpoint), trains 2 steps
    and saves model.pt. The reference must find the file where the job left it (rv29c defect 6)."""
    model, batches = model_and_data(device)
    model.load_state_dict(torch.load(os.path.join(out, "pretrained.pt")))
    train_two_steps_and_save(model, batches, os.path.join(out, "model.pt"))


def rewrite_input_job(device: str, out: str) -> None:
    """Reads good.pt and bad.pt (given as --checkpoint; they exist before the job), trains 2 steps from each and
    saves each back to the same path, as a job that continues its own checkpoint does. good.pt is correct; bad.pt's
    weights are scaled by 1.1 on neuron (the fault). The reference must start from the files' original content and
    both runs' versions must be compared (rv29d). It also reads gone.pt and deletes it, as a job that consumes a
    one-off input does: nothing to compare, said in words, no failure (rv29e defect 4). And it reads latest.pt, a
    link to step.pt, and saves over the link atomically (a file written aside, then os.replace), as training
    frameworks do: the reference must be given the link (rv29e defect 7)."""
    torch.load(os.path.join(out, "gone.pt"))
    os.remove(os.path.join(out, "gone.pt"))
    for name in ("good", "bad", "latest"):
        model, batches = model_and_data(device)
        path = os.path.join(out, f"{name}.pt")
        model.load_state_dict(torch.load(path))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for x in batches[:2]:
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        if name == "bad" and device == "neuron":
            state = {k: v * 1.1 for k, v in state.items()}
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)


def symlink_dir_job(device: str, out: str) -> None:
    """Correct: makes runs/ (no exist_ok), saves runs/step_1/model.pt, points runs/latest at step_1 with a relative
    link, as training frameworks do, and appends to runs/log.txt. Moving runs/ aside for the reference, across
    filesystems too (--out on /dev/shm), must keep the link a link (rv29d)."""
    runs = os.path.join(out, "runs")
    os.makedirs(runs)
    model, batches = model_and_data(device)
    train_two_steps_and_save(model, batches, os.path.join(runs, "model.pt"))
    os.makedirs(os.path.join(runs, "step_1"))
    os.replace(os.path.join(runs, "model.pt"), os.path.join(runs, "step_1", "model.pt"))
    os.symlink("step_1", os.path.join(runs, "latest"))
    with open(os.path.join(runs, "log.txt"), "a") as f:
        f.write(f"{device}\n")


def fresh_dir_job(device: str, out: str) -> None:
    """Correct: makes its output folder with os.makedirs (no exist_ok: it never overwrites results) and a
    DeepSpeed-style `latest` tag file beside its checkpoint; it fails if either is there when it starts. The
    reference must start without what the neuron run created (rv29c defect 5)."""
    folder = os.path.join(out, "output")
    os.makedirs(folder)
    with open(os.path.join(out, "latest"), "x") as f:  # "x": fails when a run before this one left it
        f.write("step2")
    model, batches = model_and_data(device)
    train_two_steps_and_save(model, batches, os.path.join(folder, "model.pt"))


def random_ops_job(device: str) -> None:
    """Correct: random ops that sample without an in-place sampler, drawn on the device: a batch order from
    torch.randperm(device=...), noise from torch.normal(mean tensor, std tensor) and torch.normal(0, 1, size,
    device=...) (rv29c defect 7); the out= forms of normal, randperm, bernoulli and multinomial, and torch.poisson and
    a Beta sample (rv29d). The neuron run must draw the numbers its CPU reference draws."""
    model, batches = model_and_data(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x in batches:
        x = x[torch.randperm(x.shape[0], device=device)]
        x = x + torch.normal(torch.zeros_like(x), torch.full_like(x, 0.1))
        x = x + torch.normal(0.0, 0.1, tuple(x.shape), device=device)
        noise, order, mask = torch.empty_like(x), torch.empty(x.shape[0], dtype=torch.long, device=device), \
            torch.empty_like(x)
        torch.normal(torch.zeros_like(x), torch.full_like(x, 0.1), out=noise)
        torch.randperm(x.shape[0], out=order)
        torch.bernoulli(torch.full_like(x, 0.9), out=mask)
        picked = torch.empty(2, dtype=torch.long, device=device)
        torch.multinomial(torch.ones(x.shape[1], device=device), 2, out=picked)
        x = (x + noise)[order] * mask
        x[:, picked] += torch.poisson(torch.full_like(x[:, :2], 0.5)) * 0.1
        x = x + torch.distributions.Beta(torch.full_like(x, 2.0), torch.full_like(x, 2.0)).sample() * 0.1
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()


def checkpoints_job(device: str, out: str) -> None:
    """Writes what a checkpoint check must see: a tensor-less file holding a device, a file written through a
    file object, a buffer, a safetensors file outside the working directory, and marked files whose content
    says which run wrote them (the reference must not leave its own behind)."""
    from safetensors.torch import save_file

    model, batches = model_and_data(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x in batches:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    torch.save({"device": torch.device(device), "step": 4}, os.path.join(out, "tensorless.pt"))
    with open(os.path.join(out, "fileobj.pt"), "wb") as f:
        torch.save({"w": model[0].weight.detach().cpu(), "where": torch.device(device)}, f)
    buf = io.BytesIO()
    torch.save({"where": torch.device(device)}, buf)
    elsewhere = os.path.join(out, "elsewhere")
    os.makedirs(elsewhere, exist_ok=True)
    save_file({"w": model[0].weight.detach().cpu().contiguous()}, os.path.join(elsewhere, "w.safetensors"),
              metadata={"by": device})
    torch.save({"by": device, "w": model[2].weight.detach().cpu()}, os.path.join(out, "marked.pt"))
    # issue 29: checkpoints compared with the reference run's, and files saved atomically (save, then rename)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    tmp = os.path.join(out, "good.pt.tmp")
    torch.save({**state, "by": device}, tmp)
    os.replace(tmp, os.path.join(out, "good.pt"))  # correct: CPU tensors, renamed into place
    tmp = os.path.join(out, "device.pt.tmp")
    torch.save({**state, "where": torch.device(device)}, tmp)  # the fault: a device only a neuron host knows
    os.replace(tmp, os.path.join(out, "device.pt"))
    dropped = dict(state)
    if device == "neuron":
        dropped.pop("2.bias")  # the fault: a key the reference saves is missing on neuron
    torch.save(dropped, os.path.join(out, "missing.pt"))
    square = state["0.weight"][:8, :8] + torch.arange(64.0).reshape(8, 8)
    save_file({"w": square.t().contiguous() if device == "neuron" else square.contiguous(),  # the fault
               "b": state["0.bias"].contiguous()}, os.path.join(out, "square.safetensors"))
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(out, "good.safetensors"))  # correct
    nudged = {**state, "2.weight": state["2.weight"] + (0.01 if device == "neuron" else 0.0)}
    torch.save(nudged, os.path.join(out, "sgd_nudged.pt"))  # the fault: off by 0.01 after SGD (the tight bound)
    distributed_checkpoints(model, device, out)


def distributed_checkpoints(model: torch.nn.Module, device: str, out: str) -> None:
    """torch.distributed.checkpoint folders (one process: DCP saves without a process group): the model's own
    device tensors (correct), one tensor's rows reversed on neuron, one key dropped on neuron (the faults)."""
    import torch.distributed.checkpoint as dcp

    state = model.state_dict()
    dcp.save({"model": state}, checkpoint_id=os.path.join(out, "dcp_good"))
    permuted = {**state, "0.weight": state["0.weight"].flip(0) if device == "neuron" else state["0.weight"]}
    dcp.save({"model": permuted}, checkpoint_id=os.path.join(out, "dcp_permuted"))
    dropped = {k: v for k, v in state.items() if not (device == "neuron" and k == "2.bias")}
    dcp.save({"model": dropped}, checkpoint_id=os.path.join(out, "dcp_missing"))


def leak_job(device: str) -> None:
    model, batches = model_and_data(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    kept = []
    for step in range(10):
        opt.zero_grad()
        loss = model(batches[step % 4]).pow(2).mean()
        loss.backward()
        opt.step()
        kept.append(torch.zeros(64 * 1024, device=device))  # the fault: 256 KiB held on to every step


def oom_job(device: str) -> None:
    model, batches = model_and_data(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(4):
        opt.zero_grad()
        model(batches[step]).pow(2).mean().backward()
        opt.step()
        if step == 2 and device == "neuron":  # the fault: 64 MiB on a core given 32 MiB
            torch.empty(16 * 2**20, device=device)


def record(out: str, pids: list[int]) -> None:
    """Writes out/pids.<this pid>: each pid as pid:start time (field 22 of /proc/pid/stat), so that a test that
    finds the pid alive later can tell the same process from a new one given that pid (pid_max is 32,768 here,
    and a busy test run goes through it in minutes)."""
    from torch_neuronx.runtime.processes import start_time

    def identity(pid: int) -> str:
        return f"{pid}:{start_time(pid) or 'gone'}"

    path, tmp = os.path.join(out, f"pids.{os.getpid()}"), os.path.join(out, f".pids.{os.getpid()}")
    with open(tmp, "w") as f:  # renamed whole: a test polling for pids.* never reads half of it
        f.write(" ".join(identity(pid) for pid in pids) + "\n")
    os.replace(tmp, path)


def hang_job(out: str) -> None:
    """One step, then a hang; it also starts a helper in a session of its own (as torchrun starts workers)."""
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    record(out, [os.getpid(), helper.pid])
    model, batches = model_and_data("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model(batches[0]).sum().backward()
    opt.step()
    print("stuck", flush=True)
    time.sleep(600)


def daemons_job(device: str, out: str) -> None:
    """Trains, then leaves two daemons behind (the faults): one with its own environment and session, one
    started by a shell with `env -i setsid ... &`. Its helper that it waits for is the correct twin."""
    model, batches = model_and_data(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x in batches[:2]:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    subprocess.run([sys.executable, "-c", "print('helper')"], check=True)  # waited for: never reported
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, start_new_session=True)
    shell = os.path.join(out, "shell.pid")
    subprocess.run(["sh", "-c", f"env -i setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $! > {shell}"],
                   check=True)
    with open(shell) as f:
        record(out, [daemon.pid, int(f.read())])


class Classifier(torch.nn.Module):
    """A classifier with what a checkpoint check must tell apart: trained weights (one square), a scalar added to
    every logit (softmax ignores it, so its gradient is zero up to rounding and Adam moves it by +-lr on the sign
    rounding picks, as a bias before BatchNorm), a frozen layer and a buffer (never updated: the tight bound)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                                        torch.nn.ReLU(), torch.nn.Linear(16, 4))
        self.shift = torch.nn.Parameter(torch.zeros(1))
        self.frozen = torch.nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        self.register_buffer("scale", torch.full((4,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.frozen(self.body(x)) * self.scale + self.shift


def adamw_job(device: str, out: str) -> None:
    """Issue 29 (h29): AdamW-trained checkpoints compared with the reference's, one process or DDP (one process of
    the global batch as the reference). adamw.pt is correct; each other file plants one fault on neuron: a tensor
    scaled by 1.5, a square one transposed, a key missing, a frozen weight nudged by less than AdamW's allowance
    (untouched tensors keep the tight bound), a tensor scaled by 0.97 when exported (within AdamW's allowance: caught
    when both runs' parameters were identical), and a file saved before training on neuron, after it on CPU."""
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    dev = torch.device(device)
    if world > 1:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        if device == "neuron":
            torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
            dev = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("neuron" if device == "neuron" else "gloo")
    model = Classifier().to(dev)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(6)]
    run = DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW([p for p in run.parameters() if p.requires_grad], lr=1e-3)

    def state() -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    if rank == 0 and device == "neuron":  # the fault: saved before training on neuron (after it on CPU)
        torch.save(state(), os.path.join(out, "adamw_before.pt"))
    for x, y in data:
        rows = slice(rank * 8 // world, (rank + 1) * 8 // world)  # this rank's share of the global batch
        opt.zero_grad()
        torch.nn.functional.cross_entropy(run(x[rows].to(dev)), y[rows].to(dev)).backward()
        opt.step()
    if rank == 0:
        trained = state()
        torch.save(trained, os.path.join(out, "adamw.pt"))  # correct
        if device != "neuron":
            torch.save(trained, os.path.join(out, "adamw_before.pt"))
        faults = {"scaled": ("body.0.weight", lambda t: t * 1.5), "transposed": ("body.2.weight", lambda t: t.t()),
                  "frozen": ("frozen.weight", lambda t: t + 5e-3), "missing": ("body.4.bias", None),
                  "exported": ("body.2.weight", lambda t: t * 0.97)}  # within AdamW's allowance: rv29c defect 3
        for name, (key, change) in faults.items():
            planted = dict(trained)
            if device == "neuron" and change is None:
                planted.pop(key)
            elif device == "neuron":
                planted[key] = change(planted[key]).contiguous()
            torch.save(planted, os.path.join(out, f"adamw_{name}.pt"))
    if world > 1:
        del run, opt
        dist.destroy_process_group()


def distributed_job(fault: str, device: str, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    local = int(os.environ.get("LOCAL_RANK", "0"))
    rank = int(os.environ["RANK"])
    if device == "neuron":
        torch.neuron.set_device(local)
        dev = torch.device("neuron", local)
        dist.init_process_group("neuron")
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    pids = [os.getpid()]
    if fault == "hang_rank":  # each rank also starts a child in a session of its own
        pids.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                     start_new_session=True).pid)
    record(out, pids)
    model, _ = model_and_data(str(dev), dropout=0.3 if fault == "ddp_dropout" else 0.0)
    ddp = DistributedDataParallel(model)
    lr = 0.2 if fault == "replica_drift" and rank == 1 else 0.05  # the fault: rank 1's learning rate differs
    if fault == "zero":  # correct: ZeRO under DDP (its per-shard optimizer steps inside its own step)
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt: torch.optim.Optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam,
                                                             lr=lr)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    g = torch.Generator().manual_seed(rank)
    for step in range(4):
        if fault == "hang_rank" and rank == 1 and step == 1:
            with open(os.path.join(out, "hung"), "w") as f:  # tells the test where it is: no sleep to guess
                f.write(f"{os.getpid()}\n")
            time.sleep(600)  # the fault: a rank that hangs (its peer waits in the next all-reduce)
        if fault == "early_exit" and rank == 1 and step == 2:
            sys.exit(0)  # the fault: a rank that leaves early, with exit code 0
        x = torch.randn(4, 8, generator=g).to(dev)
        opt.zero_grad()
        ddp(x).pow(2).mean().backward()
        if not (fault == "no_step" and rank == 1):  # the fault: rank 1 never steps (its all-reduces still run)
            opt.step()
    if fault == "ddp_dropout":  # correct: a distributed checkpoint written by both ranks (replicas: rank 0 writes)
        import torch.distributed.checkpoint as dcp

        dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(out, "dcp_ddp"))
    # Freed after destroy_process_group(), DDP's Reducer would be the group's last holder: PyTorch then joins Gloo's
    # worker thread with the GIL held, which can deadlock the CPU reference's plain "gloo" ranks (a PyTorch issue;
    # the neuron backend lets go of the GIL itself, see tests/distributed/test_teardown.py). Free it first.
    del ddp, opt
    dist.destroy_process_group()


def main() -> None:
    job, device, out = sys.argv[1], sys.argv[2], sys.argv[3]
    if job in ("vector_loss", "autograd_grad", "no_loss", "dropout"):
        losses_job(job, device)
    elif job == "checkpoints":
        checkpoints_job(device, out)
    elif job == "adamw":
        adamw_job(device, out)
    elif job == "random_ops":
        random_ops_job(device)
    elif job == "rewrite_input":
        rewrite_input_job(device, out)
    elif job == "symlink_dir":
        symlink_dir_job(device, out)
    elif job == "fresh_dir":
        fresh_dir_job(device, out)
    elif job == "pretrained":
        pretrained_job(device, out)
    elif job == "resume":
        resume_job(device, out)
    elif job == "compiled_dropout":
        compiled_dropout_job(device)
    elif job == "leak":
        leak_job(device)
    elif job == "oom":
        oom_job(device)
    elif job == "hang":
        hang_job(out)
    elif job == "daemons":
        daemons_job(device, out)
    elif job in ("ddp_dropout", "replica_drift", "hang_rank", "early_exit", "no_step", "zero"):
        distributed_job(job, device, out)
    else:
        raise SystemExit(f"unknown job {job!r}")


if __name__ == "__main__":
    main()
