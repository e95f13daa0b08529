"""Load a job's checkpoints where Trainium is absent: a fresh CPU process that cannot import torch_neuronx.

Run by path (``python cpu_loader.py`` with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``)
by `torch-neuronx check`, never imported by the plugin's processes except for
:func:`tensor_digest`, so it imports nothing of torch_neuronx. It reads a JSON
request on stdin and prints one JSON line: for each checkpoint, whether it
loads the way portable code loads it (``torch.load(..., map_location="cpu",
weights_only=True)``, safetensors, ``from_pretrained``, a distributed checkpoint
folder read without a process group), the digest of every
tensor, the devices the tensors were saved from, and for a Hugging Face
directory the logits on a fixed batch.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import sys
from typing import Any

import torch


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's values in row-major order (the same on any device; 16-bit floats by their bits)."""
    if t.layout != torch.strided:
        t = t.to_dense()
    cpu = t.detach().to("cpu").contiguous()
    if cpu.dtype in (torch.bfloat16, torch.float16):
        cpu = cpu.view(torch.int16)
    elif cpu.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.bool):
        cpu = cpu.view(torch.uint8)
    data = cpu.numpy().tobytes() if cpu.numel() else b""
    return hashlib.sha256(data + str((tuple(cpu.shape), str(t.dtype))).encode()).hexdigest()[:32]


def flat_tensors(obj: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a nested dict / list / tuple, by a dotted path."""
    out: dict[str, torch.Tensor] = {}
    if isinstance(obj, torch.Tensor):
        if type(obj) is not torch.Tensor and hasattr(obj, "to_local"):  # a DTensor: this rank's shard (gathering
            obj = obj.to_local()  # would be a collective, which may hang when one rank saves alone)
        out[prefix or "."] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flat_tensors(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.update(flat_tensors(v, f"{prefix}.{i}" if prefix else str(i)))
    return out


def _describe(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    nonfinite = [k for k, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    return {"tensors": {k: tensor_digest(t) for k, t in tensors.items()}, "nonfinite": nonfinite}


WRAPPER_PARTS = {"module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"}


def _plain(name: str) -> str:
    """A parameter name without the wrappers' parts (DDP's module., torch.compile's _orig_mod.)."""
    return ".".join(p for p in name.split(".") if p not in WRAPPER_PARTS)


def _same_name(key: str, name: str) -> bool:
    """Whether a checkpoint key names this parameter: equal, or one a dotted suffix of the other
    (``model.0.weight`` for ``dcp.save({"model": ...})``, ``0.weight`` in a plain state dict)."""
    k, n = _plain(key), _plain(name)
    return bool(k and n) and (k == n or k.endswith("." + n) or n.endswith("." + k))


IDENTICAL_RUNS = ("both runs' parameters were identical at every optimizer step (the same per-tensor norms), so "
                  "they did not diverge")


def allowance(key: str, shape: list[int], trained: dict[str, Any] | None) -> tuple[float, str, dict[str, Any] | None]:
    """The optimizer's allowance for one checkpoint tensor (tools/check/optimizers.py), how it was matched to the
    optimizer's parameters, and that parameter's entry: by name and shape; a name the models give an untouched
    parameter or a buffer keeps 0; a key that names no parameter gets the largest allowance of the trained
    parameters of its shape ("by shape only"); anything else 0."""
    if not trained or not trained.get("params"):
        return 0.0, "no optimizer step seen", None
    if trained.get("identical_runs"):  # tools/check/verdicts.py identical_parameters
        return 0.0, IDENTICAL_RUNS, None
    params = trained["params"]
    exact = [p for p in params if p["shape"] == shape and any(_plain(key) == _plain(n) for n in p["names"])]
    if exact:
        best = max(exact, key=lambda p: p["allowance"])
        return best["allowance"], "by name and shape", best
    untouched = any(_same_name(key, n) for n in trained.get("untouched", []))
    by_name = [p for p in params if p["shape"] == shape and any(_same_name(key, n) for n in p["names"])]
    if by_name and untouched:  # `weight` of model.enc.state_dict(): the frozen enc.weight or the trained dec.weight
        return 0.0, "its key is the ending of both a trained and an untouched parameter's name (ambiguous)", None
    if by_name:
        best = max(by_name, key=lambda p: p["allowance"])
        return best["allowance"], "by name and shape", best
    if untouched:
        return 0.0, "a parameter the optimizer never updated, or a buffer", None
    if any(_same_name(key, n) for p in params for n in p["names"]):
        return 0.0, "its parameter has another shape", None
    by_shape = [p for p in params if p["shape"] == shape]
    if by_shape:
        best = max(by_shape, key=lambda p: p["allowance"])
        return best["allowance"], "by shape only (its key names no parameter)", best
    return 0.0, "no trained parameter of its name or shape", None


def compare(mine: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], rtol: float, atol: float,
            trained: dict[str, Any] | None = None) -> dict[str, Any]:
    """A checkpoint against the reference run's: the same keys, shapes and dtypes, and every tensor within
    ``atol + (rtol + eps(dtype)) x max|reference tensor|`` of the reference's (the loss tolerances scaled to each
    tensor, and one rounding of its dtype), plus, for a tensor the job's optimizer trained, the optimizer's
    allowance (`trained`, from the probe; tools/check/optimizers.py). The worst tensor is named by its distance over
    its bound, with the allowance used and how it was matched."""
    out: dict[str, Any] = {"missing": sorted(set(theirs) - set(mine))[:20],
                           "extra": sorted(set(mine) - set(theirs))[:20],
                           "shapes": [], "dtypes": [], "values": [], "worst": None, "compared": 0,
                           "not_compared": []}
    worst = -1.0
    for key in sorted(set(mine) & set(theirs)):
        a, b = mine[key], theirs[key]
        if tuple(a.shape) != tuple(b.shape):
            out["shapes"].append([key, list(a.shape), list(b.shape)])
            continue
        if a.dtype != b.dtype:
            out["dtypes"].append([key, str(a.dtype), str(b.dtype)])
            continue
        out["compared"] += 1
        if not a.numel():
            continue
        extra: dict[str, Any] = {}
        if a.is_floating_point() or a.is_complex():
            x, y = a.detach().double(), b.detach().double()
            both_nan = torch.isnan(x) & torch.isnan(y)
            diff = torch.where(both_nan, torch.zeros_like(x), (x - y).abs()).nan_to_num(nan=float("inf"))
            distance = float(diff.max())
            eps = torch.finfo(a.dtype).eps if a.is_floating_point() else 0.0
            tight = atol + (rtol + eps) * float(y.abs().nan_to_num(nan=0.0, posinf=0.0).max())
            allowed, how, param = allowance(key, list(a.shape), trained)
            if allowed == float("inf"):
                out["not_compared"].append(key)
                continue
            bound = tight + allowed
            extra = {"tight": tight, "allowance": allowed, "matched": how,
                     "beyond_tight": int((diff > tight).sum()), "numel": int(a.numel())}
            if param is not None:
                extra.update(steps=param["steps"], lr=param["lr"])
                extra.update({k: param[k] for k in ("optimizer", "family") if k in param})
        else:
            distance = float((a.long() != b.long()).sum()) if a.dtype != torch.bool else float((a != b).sum())
            bound = 0.0
        ratio = distance / bound if bound > 0 else (0.0 if distance == 0 else float("inf"))
        if ratio > worst:
            worst = ratio
            out["worst"] = {"key": key, "max_abs_diff": distance, "bound": bound, **extra}
        if distance > bound:
            out["values"].append([key, distance, bound, extra])
    out["values"] = sorted(out["values"], key=lambda v: v[1] / v[2] if v[2] else float("inf"), reverse=True)[:20]
    out["optimizer"] = {k: trained.get(k) for k in ("optimizer", "family", "steps")} if trained else None
    return out


class PickledObjectError(Exception):
    """A file of pickled Python objects (not loadable with weights_only=True) that does not unpickle here."""


def load_torch(path: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    locations: set[str] = set()

    def where(storage: Any, location: str) -> Any:
        locations.add(location.split(":")[0])
        return storage

    note = None
    try:
        obj = torch.load(path, map_location=where, weights_only=True)
    except pickle.UnpicklingError as e:
        if "Weights only load failed" not in str(e):
            raise
        # Python objects outside the weights-only allowlist (a trainer's arguments): a file the job wrote
        # itself, loaded in this throw-away process the way its own code would (weights_only=False).
        try:
            obj = torch.load(path, map_location=where, weights_only=False)
        except Exception as full:
            raise PickledObjectError(f"{type(full).__name__}: {full}") from full
        note = "loads only with weights_only=False (it pickles Python objects: " + \
            str(e).split("Unsupported global: ")[-1].split("\n")[0][:200].strip() + ")"
    tensors = flat_tensors(obj)
    out = {**_describe(tensors), "saved_from": sorted(locations), "object": type(obj).__name__}
    if note:
        out["note"] = note
    return out, tensors


def load_safetensors(path: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    tensors = load_file(path, device="cpu")
    return _describe(tensors), tensors


def load_hf(path: str, probe_ids: list[int] | None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    from transformers import AutoModel, AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        causal = True
    except ValueError:  # not a causal LM (an encoder, a classifier): its base model
        model = AutoModel.from_pretrained(path, dtype=torch.float32).eval()
        causal = False
    tensors = dict(model.state_dict())
    out = _describe(tensors)
    if probe_ids and causal:
        ids = torch.tensor([probe_ids]) % model.config.vocab_size
        with torch.no_grad():
            out["probe_logits"] = model(ids).logits.float().tolist()
    return out, tensors


def load_dcp(path: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """A torch.distributed.checkpoint folder read whole into plain CPU tensors in this one process, with no
    process group: what torch.distributed.checkpoint.format_utils.dcp_to_torch_save does (shards of every rank
    put together by the folder's metadata)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=FileSystemReader(path), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    tensors = flat_tensors(state)
    return {**_describe(tensors), "object": "distributed checkpoint"}, tensors


def load(path: str, kind: str, probe_ids: list[int] | None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    if kind == "hf":
        return load_hf(path, probe_ids)
    if kind == "dcp":
        return load_dcp(path)
    if kind == "safetensors":
        return load_safetensors(path)
    return load_torch(path)


def main() -> None:
    request = json.loads(sys.stdin.read())
    report: dict[str, Any] = {}
    rtol, atol = float(request.get("rtol", 1e-3)), float(request.get("atol", 1e-4))
    for item in request["items"]:
        path, kind = item["path"], item["kind"]
        try:
            found, tensors = load(path, kind, request.get("probe_ids"))
            report[path] = {"ok": True, **found}
        except PickledObjectError as e:  # not a checkpoint a portable loader reads: a pickled Python object
            report[path] = {"ok": False, "pickled_object": True, "error": str(e)[:1500]}
            continue
        except Exception as e:  # every failure is the finding, reported with its message
            report[path] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:1500]}"}
            continue
        reference = item.get("reference")
        if reference:
            try:
                _, theirs = load(reference, kind, None)
                report[path]["vs_reference"] = compare(tensors, theirs, rtol, atol, item.get("trained"))
            except Exception as e:  # the reference's own file did not load: said, not compared
                report[path]["vs_reference"] = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
        del tensors
    report["_neuron_loaded"] = "torch_neuronx" in sys.modules and sys.modules["torch_neuronx"] is not None
    print(json.dumps(report))


if __name__ == "__main__":
    sys.modules["torch_neuronx"] = None  # type: ignore[assignment]  # the plugin must not be importable here
    main()
