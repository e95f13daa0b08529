"""The compile cache of neuron graphs: in memory, and on disk shared by one user's processes.

On disk we reuse Inductor's own caches (AOTAutograd cache, FX graph cache,
compiled kernels), pointed at ``$TORCH_NEURONX_NEFF_CACHE_DIR/inductor`` while
a neuron graph compiles. Inductor writes its entries atomically (temp file +
rename) and compiles kernel libraries under a per-key file lock, so
concurrent processes share the directory safely.

What the cache holds is code: Inductor unpickles graph entries, runs cached
Python wrappers and loads shared libraries. The trust model (docs/compile.md):

* The cache belongs to one user. Its root is created 0700; a root that is a
  symlink, is not owned by the user, or is group- or world-writable is
  refused with a warning, and the user's private default directory (or, if
  that is the refused one, a private temporary directory) is used instead.
  Sharing a cache between users is not supported.
* Inside it, an entry that is not a regular file owned by the user, or that
  is group- or world-writable, is removed before anything is read (files are
  checked with ``lstat``: symlinks are never followed).
* A SHA-256 seal (under ``checksums/``) is written only for files that this
  process saw appear during its own compile and found complete (a kernel
  library must hold all the ELF sections it declares; no compiler still holds
  its lock). Before every neuron compile, every file whose seal does not
  match is removed, and so is an unsealed file older than
  :data:`UNSEALED_GRACE_S` (a process died before sealing it): Inductor sees
  a miss and recompiles. Seals are integrity checks; the ownership rules above
  are what make the cache trustworthy.
* A read-only cache (a pre-warmed image, say) is read: hits are served,
  nothing is written, and a miss compiles in a private directory, with one
  notice. A cache that fails verification while read-only is not used.

Environment:
  TORCH_NEURONX_NEFF_CACHE_DIR      cache directory (default ~/.cache/torch_neuronx/neff)
  TORCH_NEURONX_DISABLE_NEFF_CACHE  1: compile every graph from scratch (no memory or disk reuse)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import struct
import tempfile
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from torch_neuronx import metrics as counters
from torch_neuronx.runtime import env

_ENV_DIR = "TORCH_NEURONX_NEFF_CACHE_DIR"
_ENV_DISABLE = "TORCH_NEURONX_DISABLE_NEFF_CACHE"
_SEAL_SUFFIX = ".sha256"
_CHUNK = 1 << 20

MEMORY_ENTRIES = 256  # compiled graphs kept per process, least recently used dropped first
UNSEALED_GRACE_S = 600.0  # an unsealed file younger than this may belong to a compile still running

_lock = threading.RLock()  # the tables below
# Compiles swap process-wide state (Inductor's cache directory in the
# environment, Inductor and functorch configuration): one at a time.
compile_lock = threading.RLock()
_memory: OrderedDict[str, Callable[..., Any]] = OrderedDict()
_verified: dict[Path, tuple[int, int, int]] = {}  # file -> (inode, size, mtime_ns) when last found intact
_warned: set[str] = set()
_scratch: Path | None = None

T = TypeVar("T")


def enabled() -> bool:
    return not env.get(_ENV_DISABLE)  # through the parser: "garbage" warns, naming the variable


def _default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "torch_neuronx", "neff").absolute()


def cache_dir() -> Path:
    """Where compiled graphs persist: $TORCH_NEURONX_NEFF_CACHE_DIR or the user's cache directory (unchecked)."""
    configured = os.environ.get(_ENV_DIR)
    return Path(configured).expanduser().absolute() if configured else _default_dir()


def _warn_once(key: str, message: str) -> None:
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(f"torch_neuronx compile cache: {message}", stacklevel=4)


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
                counters.counter("CompilationCache.Evictions")


def clear_memory() -> None:
    """Forget the compiled graphs held in this process (the disk cache stays)."""
    with _lock:
        _memory.clear()


# ---------------------------------------------------------------- the root


def _untrusted(st: os.stat_result) -> str | None:
    """Why a file or directory (from lstat) may not be trusted, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is group- or world-writable (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _check_root(root: Path) -> str | None:
    """Create `root` private if missing; say why it cannot be trusted, or None."""
    try:
        if not os.path.lexists(root):
            root.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(root, 0o700)
        st = os.lstat(root)
    except OSError as exc:
        return f"cannot be created or read ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode):
        return "is not a directory"
    return _untrusted(st)


@dataclass(frozen=True)
class Root:
    path: Path
    persistent: bool  # False: a scratch directory removed at exit
    writable: bool


def _scratch_dir() -> Path:
    # With no usable cache, Inductor must not reuse kernels from earlier
    # processes either: a directory of this process's own, removed at exit.
    global _scratch
    with _lock:
        if _scratch is None:
            _scratch = Path(tempfile.mkdtemp(prefix="torch_neuronx_neff_"))
            import atexit

            atexit.register(shutil.rmtree, _scratch, True)
        return _scratch


def trusted_root() -> Root:
    """The cache root this compile may use, after the ownership and permission checks."""
    if not enabled():
        return Root(_scratch_dir(), persistent=False, writable=True)
    root = cache_dir()
    reason = _check_root(root)
    if reason is not None:
        fallback = _default_dir()
        use_fallback = fallback != root and _check_root(fallback) is None
        _warn_once(f"root:{root}", f"{root} {reason}; it is not used (it would load code from it). Using "
                   f"{fallback if use_fallback else 'a private temporary directory'} instead: point "
                   f"{_ENV_DIR} at a directory of your own, mode 0700.")
        if not use_fallback:
            return Root(_scratch_dir(), persistent=False, writable=True)
        root = fallback
    writable = os.access(root, os.W_OK)
    if not writable:
        _warn_once(f"ro:{root}", f"{root} is read-only: its entries are used, nothing is written to it, and "
                   "graphs it lacks compile in a private temporary directory.")
    return Root(root, persistent=True, writable=writable)


# ---------------------------------------------------------------- on disk


@dataclass
class DiskOutcome:
    """What a compile found on disk: "hit", "miss" or "off"."""

    result: str = "off"
    removed_corrupt: list[str] = field(default_factory=list)


class _ReadOnlyMiss(Exception):
    """A compile needed to write into a read-only cache."""


_HIT_COUNTERS = (("aot_autograd", "autograd_cache_hit"), ("inductor", "fxgraph_cache_hit"))
_MISS_COUNTERS = (("aot_autograd", "autograd_cache_miss"), ("inductor", "fxgraph_cache_miss"))
_WRITE_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM}


def _count(pairs: tuple[tuple[str, str], ...]) -> list[int]:
    from torch._dynamo.utils import counters

    return [counters[group][name] for group, name in pairs]


def compile_with_disk_cache(compile_fn: Callable[[], T]) -> tuple[T, DiskOutcome]:
    """Run `compile_fn` (an Inductor compile) against the neuron disk cache; returns its result and what
    the cache did. Holds :data:`compile_lock` throughout."""
    with compile_lock:
        root = trusted_root()
        try:
            return _compile_in(root, compile_fn)
        except _ReadOnlyMiss:
            result, _ = _compile_in(Root(_scratch_dir(), persistent=False, writable=True), compile_fn)
            return result, DiskOutcome(result="miss")


def _compile_in(root: Root, compile_fn: Callable[[], T]) -> tuple[T, DiskOutcome]:
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    outcome = DiskOutcome()
    persistent = root.persistent
    if persistent:
        damaged = verify(root.path, remove=root.writable)
        if damaged and not root.writable:
            _warn_once(f"ro-damaged:{root.path}", f"{root.path} is read-only and holds damaged or unsealed "
                       f"entries ({damaged[0]}, ...): it is not used.")
            root, persistent = Root(_scratch_dir(), persistent=False, writable=True), False
        outcome.removed_corrupt = damaged if root.writable else []
    directory = root.path / "inductor" if persistent else root.path
    if root.writable:
        _make_private_dirs(directory)
    elif persistent:
        directory = _read_only_overlay(directory)
    before = _snapshot(directory) if persistent and root.writable else {}
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    hits, misses = _count(_HIT_COUNTERS), _count(_MISS_COUNTERS)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
    try:
        with (
            inductor_config.patch(fx_graph_cache=persistent, fx_graph_remote_cache=False),
            functorch_config.patch(
                # Off: an AOTAutograd hit returns Inductor's graphs without calling the inner compile, the step
                # that attaches the profiler's device event to each graph (backend._profiled), so graphs from the
                # cache would be invisible to torch.profiler. Inductor's FX graph cache still serves each graph
                # (no C++ compile on a hit); AOTAutograd traces again, a small part of a cold compile.
                enable_autograd_cache=False,
                enable_remote_autograd_cache=False,
                # Lower the backward now, not at the first backward() (outside this
                # block, where the cache directory would be Inductor's default).
                force_non_lazy_backward_lowering=True,
            ),
        ):
            result = compile_fn()
    except Exception as exc:
        if not root.writable and _write_refused(exc):
            raise _ReadOnlyMiss from exc
        raise
    finally:
        if previous is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous
    if persistent:
        if root.writable:
            seal(root.path, before)
        new_hits = [a - b for a, b in zip(_count(_HIT_COUNTERS), hits, strict=True)]
        new_misses = [a - b for a, b in zip(_count(_MISS_COUNTERS), misses, strict=True)]
        # An AOTAutograd hit serves forward and backward; without one, the graph
        # came from disk only if every Inductor graph did.
        hit = new_hits[0] > 0 or (new_hits[1] > 0 and sum(new_misses) == 0)
        outcome.result = "hit" if hit else "miss"
    return result, outcome


def _write_refused(exc: BaseException) -> bool:
    """Whether an error (Inductor wraps them) comes from a write the file system refused."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _WRITE_ERRNOS:
            return True
        current = getattr(current, "inner_exception", None) or current.__cause__ or current.__context__
    return False


def _make_private_dirs(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)


def _read_only_overlay(directory: Path) -> Path:
    """A private directory that shows a read-only cache's entries and has a writable ``locks/``.

    Inductor takes a lock file even to load a cached kernel, in the cache
    directory itself: the overlay links each entry of the read-only cache and
    keeps its own locks. A new entry that would go inside a linked directory
    fails to write, and the compile is redone in a private directory.
    """
    overlay = _scratch_dir() / ("ro-" + hashlib.sha256(str(directory).encode()).hexdigest()[:16])
    if not overlay.exists():
        overlay.mkdir(mode=0o700)
        (overlay / "locks").mkdir(mode=0o700)
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(directory):
                if entry.name != "locks":
                    (overlay / entry.name).symlink_to(entry.path)
    return overlay


def _cached_files(root: Path) -> Iterator[tuple[Path, Path]]:
    """(file, seal) pairs of what Inductor keeps under root/inductor; skips locks and temp files.

    Directories are walked without following symbolic links."""
    data, seals = root / "inductor", root / "checksums"
    for dirpath, dirnames, filenames in os.walk(data, followlinks=False):
        if os.path.basename(dirpath) == "locks":
            dirnames.clear()
            continue
        for name in filenames:
            if name.endswith((".lock", ".tmp")) or name.startswith("."):
                continue
            path = Path(dirpath, name)
            yield path, seals / (str(path.relative_to(data)) + _SEAL_SUFFIX)


def _signature(st: os.stat_result) -> tuple[int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _snapshot(directory: Path) -> dict[str, tuple[int, int, int]]:
    """Every file under `directory` with its signature (to tell what a compile wrote)."""
    out: dict[str, tuple[int, int, int]] = {}
    for dirpath, _, filenames in os.walk(directory, followlinks=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            with contextlib.suppress(OSError):
                out[path] = _signature(os.lstat(path))
    return out


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
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
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
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


def seal(root: Path, before: dict[str, tuple[int, int, int]]) -> None:
    """Seal the files this process's compile wrote (absent or different in `before`), once found complete.

    Sealed files lose any group/world write bit (a umask of 002 must not make
    them untrusted next time). Bookkeeping never fails the compile: a file
    that cannot be sealed is left unsealed, and is removed once it is stale.
    """
    try:
        for path, seal_path in _cached_files(root):
            try:
                st = os.lstat(path)
                if before.get(str(path)) == _signature(st) or not stat.S_ISREG(st.st_mode):
                    continue  # not written by this compile
                if _untrusted(st) is not None and st.st_uid == os.getuid():
                    os.chmod(path, stat.S_IMODE(st.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))
                    st = os.lstat(path)
                if _untrusted(st) is not None or _writer_active(root, path):
                    continue
                if path.name.endswith(".so") and not _elf_complete(path):
                    continue
                _write_atomic(seal_path, f"{_digest(path)} {st.st_size}\n")
                with _lock:
                    _verified[path] = _signature(st)
            except OSError:
                continue
    except OSError as exc:
        _warn_once(f"seal:{root}", f"could not seal new entries under {root} ({exc}); they will be recompiled")


def _intact(path: Path, seal_path: Path, st: os.stat_result) -> bool:
    with _lock:
        if _verified.get(path) == _signature(st):
            return True
    try:
        recorded = seal_path.read_text().split()
    except OSError:
        # Unsealed: a compile still running may have just written it; once it
        # is stale, a process died before sealing it.
        return time.time() - st.st_mtime < UNSEALED_GRACE_S and (
            not path.name.endswith(".so") or _elf_complete(path))
    try:
        ok = len(recorded) == 2 and st.st_size == int(recorded[1]) and _digest(path) == recorded[0]
    except (OSError, ValueError):
        return False
    if ok:
        with _lock:
            _verified[path] = _signature(st)
    return ok


def verify(root: Path, *, remove: bool = True) -> list[str]:
    """Check every cache file before a compile; delete (with `remove`) and return those not to be trusted.

    Files found intact are remembered by (inode, size, mtime), so only new or
    changed files are hashed again.
    """
    bad: list[str] = []
    for path, seal_path in _cached_files(root):
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or _untrusted(st) is not None:
                trusted = False
            else:
                trusted = _intact(path, seal_path, st) or _writer_active(root, path)
        except FileNotFoundError:
            continue  # another process removed it meanwhile
        except OSError:
            trusted = False
        if trusted:
            continue
        bad.append(str(path))
        if remove:
            for stale in (path, seal_path):
                with contextlib.suppress(OSError):
                    stale.unlink()
            with _lock:
                _verified.pop(path, None)
    return bad


def forget_verification() -> None:
    """Hash every file again at the next compile (tests; after editing the cache by hand)."""
    with _lock:
        _verified.clear()
        _warned.clear()


# ---------------------------------------------------------------- keys


def _global_state() -> tuple[Any, ...]:
    """Process-wide modes that change what a traced graph computes, though its code does not show them."""
    autocast = tuple(
        (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        for device in ("cpu", "cuda", "neuron")
    )
    return (
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        torch.get_default_dtype(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.is_autocast_cache_enabled(),
        autocast,
        torch.get_float32_matmul_precision(),
        torch._C._get_cpu_allow_fp16_reduced_precision_reduction(),
    )


def graph_key(gm: torch.fx.GraphModule, example_inputs: list[Any], extra: str) -> str | None:
    """A key of everything a compiled graph depends on, or None when it must not be shared."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    h = hashlib.sha256()
    h.update(torch.__version__.encode())
    h.update(extra.encode())
    h.update(repr(_global_state()).encode())
    h.update(repr(sorted(inductor_config.save_config_portable().items())).encode())
    h.update(repr(sorted(functorch_config.save_config_portable().items())).encode())
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
    # The Python numbers Dynamo passes as 0-d tensors, by value: Inductor may compile one in as a constant (its
    # tensorify pass specialises a float that an op takes only as a number, clamp's min say, and Dynamo then
    # guards on the value), so the graph Dynamo traces again for the next value has the same code and inputs,
    # and is another graph. A graph that reads the number at run time is compiled again only when Dynamo
    # itself compiles again.
    from torch._subclasses.fake_tensor import is_fake

    from torch_neuronx.compile import placement

    for i in sorted(placement.python_scalar_positions(gm)):
        value = example_inputs[i] if i < len(example_inputs) else None
        if isinstance(value, torch.Tensor) and value.numel() == 1 and value.device.type == "cpu" \
                and not is_fake(value):
            h.update(f"number {i}: {value.item()!r}".encode())
    return h.hexdigest()


def _tensor_fingerprint(t: torch.Tensor) -> bytes:
    meta = (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device, t.requires_grad,
            isinstance(t, torch.nn.Parameter), t.is_leaf)
    return repr(meta).encode()
