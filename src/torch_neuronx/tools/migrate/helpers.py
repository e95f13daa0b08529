"""The native helpers a migrated script gets, inlined after its imports.

They are inlined, not imported from torch_neuronx, on purpose: the migrated script must run on a real Trainium
instance under AWS's TorchNeuron, which has no such module, and on a CPU-only machine as its own reference. Each
keeps one torch_xla semantic that has no one-line native form:

- the collectives below start the default process group themselves when torchrun started several processes and
  the script did not (XLA's runtime joined them from torchrun's environment);
- each XLA process had one device: ``neuron_set_device`` makes the bare "neuron" the process's own core;
- ``xm.optimizer_step`` / ``xm.reduce_gradients`` all-reduce and *average* the gradients over the world (XLA
  scales the sum by ``1 / world_size``), only when more than one process runs;
- ``pl.MpDeviceLoader`` moves each batch (tensors inside lists, tuples, dicts, sets and objects' attributes, as
  XLA's ``for_each_instance_rewrite``) to the device and can be iterated once per epoch;
- ``xm.save`` moves everything to the CPU and writes on the (local) master only (no barrier, as torch_xla 2.1+);
- ``xm.rendezvous(tag)`` waits for every process and returns one ``b""`` per process;
- ``xm.all_reduce`` returns a new tensor for a tensor (in place for a list) and applies ``scale``;
- ``xm.mesh_reduce`` gathers a Python value from every process and reduces it;
- ``xm.master_print`` whose arguments call something evaluates them on every rank, then prints on the master;
- NxD's ``parallel_state`` holds the tensor/data parallel mesh.

Names start with ``neuron_`` so that a second migration finds them (and adds nothing) and user names are safe.
Each helper that reads the environment imports ``os`` under a private name in its own body: the file may bind
``os`` to something else (``os = platform.system()``, ``import posixpath as os``), and adding a module-level
``import os`` would rebind the file's own name (issue 32 rv32g items 1, 2).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Helper:
    name: str
    source: str
    imports: tuple[str, ...]  # modules the helper needs (`import X`)
    needs: tuple[str, ...] = ()  # other helpers it calls


_TO_DEVICE = '''
def neuron_to_device(data, device, _moved=None):
    """Move tensors (inside lists, tuples, dicts, sets and other objects' attributes, as XLA's
    for_each_instance_rewrite) to `device`; one object seen twice is moved once, as XLA's rewrite map did
    (torch-neuronx migrate)."""
    _moved = {} if _moved is None else _moved
    if id(data) in _moved:
        return _moved[id(data)][1]
    if isinstance(data, torch.Tensor):
        moved = data.to(device)
    elif isinstance(data, dict):  # a copy keeps the type and a defaultdict's default_factory
        moved = copy.copy(data)
        for key, value in data.items():
            moved[key] = neuron_to_device(value, device, _moved)
    elif isinstance(data, tuple) and hasattr(data, "_fields"):  # a namedtuple
        moved = type(data)(*(neuron_to_device(v, device, _moved) for v in data))
    elif isinstance(data, (list, tuple, set, frozenset)):
        moved = type(data)(neuron_to_device(v, device, _moved) for v in data)
    elif hasattr(data, "__dict__") and not isinstance(data, type):  # a Transformers BatchEncoding: a copy, moved
        moved = copy.copy(data)
        _moved[id(data)] = (data, moved)  # before its attributes: an attribute that refers back finds the copy
        for key, value in vars(moved).items():
            vars(moved)[key] = neuron_to_device(value, device, _moved)
    else:
        return data
    _moved[id(data)] = (data, moved)  # the original is held: its id cannot be reused while the map lives
    return moved
'''

_LOADER = '''
class NeuronDeviceLoader:
    """Iterate `loader` with each batch moved to `device`, as the XLA MpDeviceLoader did (torch-neuronx migrate)."""

    def __init__(self, loader, device, **kwargs):
        self.loader = loader
        self.device = device

    def __iter__(self):
        for batch in self.loader:
            yield neuron_to_device(batch, self.device)

    def __len__(self):
        return len(self.loader)
'''

# XLA's PJRT runtime reads torchrun's environment (pytorch/xla torch_xla/_internal/neuron.py, pjrt.py): under
# torchrun, optimizer_step / all_reduce / mesh_reduce / rendezvous act over every process with no
# init_process_group in the script. The helpers start the default group themselves then (rv32d item 3), never
# acting as one process of several.
_GROUP = '''
def neuron_init_group(world_of_one=False):
    """Start the default process group when torchrun started several processes and the script has none, as XLA's
    runtime joined them from torchrun's environment; True when a process group runs (torch-neuronx migrate).
    world_of_one: XLA's own rendezvous (the init method of XLA's scheme) also started a group of one process
    alone."""
    import os as _os

    if not torch.distributed.is_available():
        if int(_os.environ.get("WORLD_SIZE", "1")) > 1:
            raise RuntimeError("WORLD_SIZE > 1 but torch.distributed is not available: cannot reduce over processes")
        return False
    if not torch.distributed.is_initialized():
        if int(_os.environ.get("WORLD_SIZE", "1")) > 1:
            torch.distributed.init_process_group({backend!r})
        elif world_of_one:
            store = torch.distributed.HashStore()
            torch.distributed.init_process_group({backend!r}, store=store, rank=0, world_size=1)
    return torch.distributed.is_initialized()
'''

# each XLA process had one device, so "xla", "xla:0" and xla_device() were the same one; natively the bare
# "neuron" is the current device, core 0 until it is set (a "neuron" group sets it to LOCAL_RANK). Selecting a
# core does not start the runtime: allowed before init_process_group (issue 32 rv32f item 1).
_SET_DEVICE = '''
def neuron_set_device():
    """Make the bare "neuron" device this process's own core, neuron:LOCAL_RANK under torchrun, as each XLA process
    had one device ("xla" and xla_device() were the same); alone, core 0 as before (torch-neuronx migrate)."""
    import os as _os

    if "LOCAL_RANK" in _os.environ:
        torch.neuron.set_device(int(_os.environ["LOCAL_RANK"]))
'''

_AVERAGE = '''
def neuron_average_gradients(optimizer):
    """All-reduce and average the gradients over the data-parallel processes, as xm.reduce_gradients did
    (torch-neuronx migrate). With a (dp, tp) mesh from neuron_init_mesh, only over its "dp" dimension."""
    if not neuron_init_group():
        return
    mesh = globals().get("NEURON_MESH", {}).get("mesh")
    group = mesh["dp"].get_group() if mesh is not None else None
    world_size = torch.distributed.get_world_size(group)
    if world_size < 2:
        return
    for param_group in optimizer.param_groups:
        for param in param_group["params"]:
            if param.grad is not None:
                grad = param.grad.to_local() if hasattr(param.grad, "to_local") else param.grad
                torch.distributed.all_reduce(grad, group=group)
                grad.mul_(1.0 / world_size)
'''

_OPT_STEP = '''
def neuron_optimizer_step(optimizer, barrier=False, optimizer_args=None, **kwargs):
    """Average the gradients, then step, as xm.optimizer_step did; returns what step returns (torch-neuronx migrate)."""
    neuron_average_gradients(optimizer)
    return optimizer.step(**(optimizer_args or {}))
'''

_SAVE = '''
def neuron_save(data, path, master_only=True, global_master=False):
    """torch.save on the master only, after moving to the CPU, as xm.save did (torch-neuronx migrate). The master is
    the local one (LOCAL_RANK 0) unless global_master (RANK 0). No barrier: xm.save has none since PyTorch/XLA 2.1
    (pytorch/xla 4f7f3dcd "Remove rendezvous from xm.save"), so `if master: neuron_save(...)` cannot hang."""
    import os as _os

    rank = int(_os.environ.get("RANK" if global_master else "LOCAL_RANK", "0"))
    if not master_only or rank == 0:
        torch.save(neuron_to_device(data, "cpu"), path)
'''

_ALL_REDUCE = '''
def neuron_all_reduce(reduce_type, inputs, scale=1.0, groups=None, pin_layout=True):
    """xm.all_reduce: a new tensor for a tensor, in place for a list of tensors, times `scale`; with one process
    nothing is reduced nor scaled, as XLA (torch-neuronx migrate). `groups` is flagged by the migration."""
    if not neuron_init_group() or torch.distributed.get_world_size() == 1:
        return inputs.clone() if isinstance(inputs, torch.Tensor) else inputs
    tensors = [inputs.clone()] if isinstance(inputs, torch.Tensor) else list(inputs)
    for t in tensors:
        torch.distributed.all_reduce(t, op=reduce_type)
        if scale != 1.0:
            t.mul_(scale)
    return tensors[0] if isinstance(inputs, torch.Tensor) else inputs
'''

_MESH_REDUCE = '''
def neuron_mesh_reduce(tag, data, reduce_fn):
    """Gather `data` (moved to the CPU first) from every process, reduce it with `reduce_fn`, as xm.mesh_reduce
    did (torch-neuronx migrate)."""
    data = neuron_to_device(data, "cpu")
    if not neuron_init_group():
        return reduce_fn([data])
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, data)
    return reduce_fn(gathered)
'''

_RENDEZVOUS = '''
def neuron_rendezvous():
    """Wait for every process, as xm.rendezvous(tag) did, and return what it returned with no payload: one b"" per
    process; with no process group (one process), [b""] at once (torch-neuronx migrate)."""
    if neuron_init_group():
        torch.distributed.barrier()
        return [b""] * torch.distributed.get_world_size()
    return [b""]
'''

_MESH = '''
NEURON_MESH = {}


def neuron_init_mesh(tensor_model_parallel_size=1, **kwargs):
    """The (dp, tp) device mesh NxD's parallel_state.initialize_model_parallel set up (torch-neuronx migrate)."""
    from torch.distributed.device_mesh import init_device_mesh

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group({backend!r})
    world_size = torch.distributed.get_world_size()
    tp = int(tensor_model_parallel_size)
    NEURON_MESH["mesh"] = init_device_mesh({device!r}, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))
    return NEURON_MESH["mesh"]


def neuron_mesh():
    """The mesh made by neuron_init_mesh (torch-neuronx migrate)."""
    return NEURON_MESH["mesh"]
'''

_INIT_WEIGHT = '''
def neuron_init_weight(layer, init_method):
    """Initialise the whole weight with NxD's init_method, as NxD's CPU initialisation did before sharding it
    (torch-neuronx migrate); returns the layer."""
    with torch.no_grad():
        init_method(layer.weight)
    return layer
'''

_SKIP_BIAS = '''
class NeuronSkipBiasLinear(torch.nn.Module):
    """A linear layer that returns (x @ weight.T, bias) and leaves the addition to the caller, as NxD's
    skip_bias_add=True did (torch-neuronx migrate). The tensor-parallel plan shards `.linear`; the bias is whole."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features, bias=False, device=device, dtype=dtype)
        self.bias = None
        if bias:
            bound = 1 / in_features ** 0.5
            bias = torch.empty(out_features, device=device, dtype=dtype)
            self.bias = torch.nn.Parameter(bias.uniform_(-bound, bound))

    @property
    def weight(self):
        return self.linear.weight

    def forward(self, x):
        return self.linear(x), self.bias
'''

# torch_xla/core/xla_model.py master_print(*args, fd=sys.stdout, local=False, flush=False) is an ordinary function:
# the arguments are evaluated on every rank (a collective among them is entered by all), then it prints on the
# master only.
_MASTER_PRINT = '''
def neuron_master_print(*args, local=False, file=None):
    """Print on the (local) master only; the arguments were evaluated on every rank, as XLA's master_print
    (torch-neuronx migrate)."""
    import os as _os

    if int(_os.environ.get("LOCAL_RANK" if local else "RANK", "0")) == 0:
        print(*args, file=file, flush=True)
'''

HELPERS: dict[str, Helper] = {
    h.name: h
    for h in (
        Helper("neuron_init_group", _GROUP, ("torch",)),
        Helper("neuron_set_device", _SET_DEVICE, ("torch",)),
        Helper("neuron_to_device", _TO_DEVICE, ("copy", "torch")),
        Helper("NeuronDeviceLoader", _LOADER, (), ("neuron_to_device",)),
        Helper("neuron_average_gradients", _AVERAGE, ("torch",), ("neuron_init_group",)),
        Helper("neuron_optimizer_step", _OPT_STEP, (), ("neuron_average_gradients",)),
        Helper("neuron_save", _SAVE, ("torch",), ("neuron_to_device",)),
        Helper("neuron_all_reduce", _ALL_REDUCE, ("torch",), ("neuron_init_group",)),
        Helper("neuron_mesh_reduce", _MESH_REDUCE, ("torch",), ("neuron_to_device", "neuron_init_group")),
        Helper("neuron_rendezvous", _RENDEZVOUS, ("torch",), ("neuron_init_group",)),
        Helper("neuron_init_mesh", _MESH, ("torch",)),
        Helper("neuron_init_weight", _INIT_WEIGHT, ("torch",)),
        Helper("NeuronSkipBiasLinear", _SKIP_BIAS, ("torch",)),
        Helper("neuron_master_print", _MASTER_PRINT, ()),
    )
}

# the names a helper's source defines at module level (to find them again in a migrated file)
DEFINES = {"neuron_init_mesh": ("NEURON_MESH", "neuron_init_mesh", "neuron_mesh")}


def closure(names: set[str]) -> list[str]:
    """The helpers needed, dependencies first, in a stable order."""
    out: list[str] = []

    def add(n: str) -> None:
        if n in out:
            return
        for d in HELPERS[n].needs:
            add(d)
        out.append(n)

    for n in sorted(names, key=list(HELPERS).index):
        add(n)
    return out


def source(name: str, device: str, backend: str) -> str:
    text = HELPERS[name].source
    if name in ("neuron_init_mesh", "neuron_init_group"):
        text = text.replace("{backend!r}", repr(backend)).replace("{device!r}", repr(device))
    return text.strip("\n") + "\n"
