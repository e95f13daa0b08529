"""The compile cache of neuron graphs: in memory, and on disk shared by processes.

On disk we reuse Inductor's own caches (AOTAutograd cache, FX graph cache,
compiled kernels), pointed at ``$TORCH_NEURONX_NEFF_CACHE_DIR/inductor`` while
a neuron graph compiles. Inductor writes its entries atomically (temp file +
rename) and compiles kernel libraries under a per-key file lock, so
concurrent processes share the directory safely; what it lacks is a check
that a file is still what was written: a truncated or garbled kernel library
can crash the process that loads it. We add that: after each compile every
new file gets a SHA-256 seal in ``checksums/`` (written atomically too), and
the first neuron compile of a process deletes every file whose seal does not
match, and any unsealed kernel library cut short (a compiler killed while
writing it), so Inductor sees a miss and recompiles it.

Environment:
  TORCH_NEURONX_NEFF_CACHE_DIR      cache directory (default ~/.cache/torch_neuronx/neff)
  TORCH_NEURONX_DISABLE_NEFF_CACHE  1: compile every graph from scratch (no memory or disk reuse)
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import struct
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

_ENV_DIR = "TORCH_NEURONX_NEFF_CACHE_DIR"
_ENV_DISABLE = "TORCH_NEURONX_DISABLE_NEFF_CACHE"
_SEAL_SUFFIX = ".sha256"
_CHUNK = 1 << 20

MEMORY_ENTRIES = 256  # compiled graphs kept per process, least recently used dropped first

_lock = threading.RLock()
_memory: OrderedDict[str, Callable[..., Any]] = OrderedDict()
_verified: set[Path] = set()
_sealed: set[Path] = set()
_scratch: Path | None = None


def enabled() -> bool:
    return os.environ.get(_ENV_DISABLE, "0").strip().lower() not in ("1", "true", "yes", "on")


def cache_dir() -> Path:
    """Where compiled graphs persist: $TORCH_NEURONX_NEFF_CACHE_DIR or the user's cache directory."""
    configured = os.environ.get(_ENV_DIR)
    if configured:
        return Path(configured).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "torch_neuronx", "neff").resolve()


# ---------------------------------------------------------------- in memory


def memory_get(key: str | None) -> Callable[..., Any] | None:
    if key is None or not enabled():
        return None
    with _lock:
        compiled = _memory.get(key)
        if compiled is not None:
            _memory.move_to_end(key)
        return compiled


def memory_put(key: str | None, compiled: Callable[..., Any]) -> None:
    if key is not None and enabled():
        with _lock:
            _memory[key] = compiled
            while len(_memory) > MEMORY_ENTRIES:
                _memory.popitem(last=False)


def clear_memory() -> None:
    """Forget the compiled graphs held in this process (the disk cache stays)."""
    with _lock:
        _memory.clear()


# ---------------------------------------------------------------- on disk


@dataclass
class DiskOutcome:
    """What a compile found on disk: "hit", "miss" or "off"."""

    result: str = "off"
    removed_corrupt: list[str] = field(default_factory=list)


_HIT_COUNTERS = (("aot_autograd", "autograd_cache_hit"), ("inductor", "fxgraph_cache_hit"))
_MISS_COUNTERS = (("aot_autograd", "autograd_cache_miss"), ("inductor", "fxgraph_cache_miss"))


def _count(pairs: tuple[tuple[str, str], ...]) -> list[int]:
    from torch._dynamo.utils import counters

    return [counters[group][name] for group, name in pairs]


@contextlib.contextmanager
def disk_scope() -> Iterator[DiskOutcome]:
    """Compile inside this block to read and write the neuron cache directory.

    Configuration is swapped, not threaded through: Inductor reads its cache
    directory from the environment and its cache switches from global config.
    Dynamo compiles one frame at a time (a global lock), so the swap is not
    observed by other compiles.
    """
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    outcome = DiskOutcome()
    if enabled():
        root = cache_dir()
        outcome.removed_corrupt = verify(root)
        directory, persistent = root / "inductor", True
    else:
        directory, persistent = _scratch_dir(), False
    directory.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    hits, misses = _count(_HIT_COUNTERS), _count(_MISS_COUNTERS)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
    try:
        with (
            inductor_config.patch(fx_graph_cache=persistent, fx_graph_remote_cache=False),
            functorch_config.patch(
                enable_autograd_cache=persistent,
                enable_remote_autograd_cache=False,
                # Lower the backward now, not at the first backward() (outside this
                # block, where the cache directory would be Inductor's default).
                force_non_lazy_backward_lowering=True,
            ),
        ):
            yield outcome
    finally:
        if previous is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous
        if persistent:
            seal(cache_dir())
    if persistent:
        new_hits = [a - b for a, b in zip(_count(_HIT_COUNTERS), hits, strict=True)]
        new_misses = [a - b for a, b in zip(_count(_MISS_COUNTERS), misses, strict=True)]
        # An AOTAutograd hit serves forward and backward; without one, the graph
        # came from disk only if every Inductor graph did.
        hit = new_hits[0] > 0 or (new_hits[1] > 0 and sum(new_misses) == 0)
        outcome.result = "hit" if hit else "miss"


def _scratch_dir() -> Path:
    # With the cache off, Inductor must not reuse kernels from earlier processes
    # either: give it a directory of its own, removed at exit.
    global _scratch
    with _lock:
        if _scratch is None:
            _scratch = Path(tempfile.mkdtemp(prefix="torch_neuronx_nocache_"))
            import atexit

            atexit.register(shutil.rmtree, _scratch, True)
        return _scratch


def _cached_files(root: Path) -> Iterator[tuple[Path, Path]]:
    """(file, seal) pairs of what Inductor keeps under root/inductor; skips locks and temp files."""
    data, seals = root / "inductor", root / "checksums"
    for dirpath, dirnames, filenames in os.walk(data):
        if os.path.basename(dirpath) == "locks":
            dirnames.clear()
            continue
        for name in filenames:
            if name.endswith((".lock", ".tmp")) or name.startswith("."):
                continue
            path = Path(dirpath, name)
            yield path, seals / (str(path.relative_to(data)) + _SEAL_SUFFIX)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _writer_active(root: Path, path: Path) -> bool:
    """Whether a process holds Inductor's lock for this file (e.g. the compiler is still writing it).

    Inductor compiles kernel libraries in place, under a lock file per key
    (``locks/<key>.lock``, an flock); we only probe it, non-blocking.
    """
    lock = root / "inductor" / "locks" / (path.name.split(".", 1)[0] + ".lock")
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def _elf_complete(path: Path) -> bool:
    """Whether a shared library holds all it declares (its section table ends the file; a cut-off write loses it)."""
    with path.open("rb") as f:
        header = f.read(64)
    if len(header) < 52 or header[:4] != b"\x7fELF":
        return False
    order = "<" if header[5] == 1 else ">"
    if header[4] == 2:  # 64-bit
        (table,), (entry, count) = struct.unpack_from(order + "Q", header, 0x28), struct.unpack_from(
            order + "HH", header, 0x3A)
    else:
        (table,), (entry, count) = struct.unpack_from(order + "I", header, 0x20), struct.unpack_from(
            order + "HH", header, 0x2E)
    return table + entry * count <= path.stat().st_size


def seal(root: Path) -> None:
    """Record the checksum of every complete cache file that has none yet."""
    for path, seal_path in _cached_files(root):
        if path in _sealed:
            continue
        try:
            if not seal_path.exists():
                if _writer_active(root, path):
                    continue  # seal it once the compiler has finished writing it
                size = path.stat().st_size
                _write_atomic(seal_path, f"{_digest(path)} {size}\n")
        except FileNotFoundError:  # another process removed it meanwhile
            continue
        _sealed.add(path)


def _intact(root: Path, path: Path, seal_path: Path) -> bool:
    try:
        recorded = seal_path.read_text().split()
    except FileNotFoundError:
        # Not sealed: written by a process that has not sealed it yet, or that died
        # first. Inductor writes its pickles and sources atomically, but compiles
        # kernel libraries in place, so a library may be cut short: check it is whole.
        return not path.name.endswith(".so") or _elf_complete(path)
    except OSError:
        return False
    try:
        return (len(recorded) == 2 and path.stat().st_size == int(recorded[1])
                and _digest(path) == recorded[0])
    except (OSError, ValueError):
        return False


def verify(root: Path) -> list[str]:
    """Once per process and directory: delete cache files that are damaged (Inductor recompiles them)."""
    with _lock:
        if root in _verified:
            return []
        _verified.add(root)
    removed: list[str] = []
    for path, seal_path in _cached_files(root):
        try:
            if _intact(root, path, seal_path) or _writer_active(root, path):
                if seal_path.exists():
                    _sealed.add(path)
                continue
        except FileNotFoundError:
            continue
        for stale in (path, seal_path):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        removed.append(str(path))
    return removed


def forget_verification() -> None:
    """Make the next compile verify the directory again (tests; after editing the cache by hand)."""
    with _lock:
        _verified.clear()
        _sealed.clear()


# ---------------------------------------------------------------- keys


def graph_key(gm: torch.fx.GraphModule, example_inputs: list[Any], extra: str) -> str | None:
    """A key of everything a compiled graph depends on, or None when it must not be shared."""
    import torch._inductor.config as inductor_config

    h = hashlib.sha256()
    h.update(torch.__version__.encode())
    h.update(extra.encode())
    # Global state Dynamo guards on and the graph code does not show, and Inductor's settings.
    h.update(repr((torch.is_grad_enabled(), torch.is_inference_mode_enabled(), torch.get_default_dtype(),
                   torch.are_deterministic_algorithms_enabled())).encode())
    h.update(repr(sorted(inductor_config.save_config_portable().items())).encode())
    for name, module in gm.named_modules():  # the graph and any subgraphs (higher-order ops)
        if isinstance(module, torch.fx.GraphModule):
            h.update(name.encode())
            h.update(module.code.encode())
    # Tensors the graph holds (rather than takes as inputs) are compiled in by
    # reference: share the compiled graph only with graphs holding the same objects.
    held = [*gm.named_buffers(remove_duplicate=False), *gm.named_parameters(remove_duplicate=False),
            *((n, v) for n, v in vars(gm).items() if isinstance(v, torch.Tensor))]
    for name, value in sorted(held, key=lambda item: item[0]):
        h.update(f"{name}:{id(value)}:{value.data_ptr()}:".encode())
        h.update(_tensor_fingerprint(value))
    storages: dict[int, int] = {}
    for value in example_inputs:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage().data_ptr() if value.device.type != "meta" else id(value)
            if storage in storages and storage != 0:
                # Aliased inputs: AOTAutograd installs guards for them when it compiles,
                # which a graph served from memory would not have.
                return None
            storages[storage] = len(storages)
            h.update(_tensor_fingerprint(value))
        elif isinstance(value, torch.SymInt):
            return None  # symbolic graphs are specialised per shape, never shared
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


def _tensor_fingerprint(t: torch.Tensor) -> bytes:
    meta = (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device, t.requires_grad,
            isinstance(t, torch.nn.Parameter), t.is_leaf)
    return repr(meta).encode()
