"""The emulated machine of this process, read from the environment once, on
first use of the device (as the Neuron runtime reads it when it starts).

Variables:
  TORCH_NEURONX_INSTANCE_TYPE   instance to emulate (default trn2.48xlarge)
  NEURON_LOGICAL_NC_CONFIG      1 or 2 physical cores per logical core (Trn2 only; default 2)
  NEURON_RT_VISIBLE_CORES       the logical cores this process sees: "3", "0-3", "0,2,5"
  TORCH_NEURONX_HBM_PER_CORE    override the HBM capacity per core, e.g. "256MiB"
                                (for tests and what-if planning)
"""

from __future__ import annotations

import os
import re
import warnings
from typing import NamedTuple

from torch_neuronx import _C
from torch_neuronx.runtime.instances import DEFAULT_INSTANCE, INSTANCES, Instance

# torch's device index is an int8: a process addresses neuron:0 .. neuron:126 (csrc/neuron.h, kMaxDevices).
MAX_VISIBLE_CORES: int = _C._MAX_DEVICES
MAX_HBM_BYTES = 1 << 50  # 1 PiB per core: far beyond any chip, and far inside an int64


class NeuronConfigError(ValueError):
    """The environment describes a machine the emulator cannot stand in for."""


class RuntimeConfig(NamedTuple):
    instance: Instance
    lnc: int  # physical cores per logical core
    visible_cores: tuple[int, ...]  # logical core ids on the instance, in device-index order
    hbm_per_core: int  # bytes
    hbm_overridden: bool

    @property
    def logical_cores(self) -> int:
        return self.instance.physical_cores // self.lnc

    @property
    def device_count(self) -> int:
        return len(self.visible_cores)

    def describe(self) -> str:
        return f"{self.instance.name}, LNC={self.lnc}, {self.logical_cores} logical NeuronCores"


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str) -> int:
    """Parse "1073741824", "512MiB", "1.5GiB" or "2G" into bytes (binary units)."""
    match = _SIZE.match(text)
    if not match:
        raise NeuronConfigError(f"cannot read {text!r} as a size: use bytes or a unit, e.g. '256MiB' or '2GiB'")
    number, unit = match.groups()
    return int(float(number) * _UNITS[(unit or "")[:1].lower()])


def format_bytes(n: float) -> str:
    """Bytes as people read them, in binary units: "512 B", "1.50 KiB", "24.00 GiB" (the one Python formatter)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def parse_core_list(text: str, available: int) -> tuple[int, ...]:
    """Parse NEURON_RT_VISIBLE_CORES ("3", "0-3", "0,2,5-7") against `available` cores."""
    cores: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        bounds = part.split("-")
        if len(bounds) > 2 or not all(b.isdigit() for b in bounds):
            raise NeuronConfigError(
                f"NEURON_RT_VISIBLE_CORES={text!r}: expected core ids or ranges such as '0', '0-3' or '0,2,5'"
            )
        lo, hi = int(bounds[0]), int(bounds[-1])
        if hi < lo:
            raise NeuronConfigError(f"NEURON_RT_VISIBLE_CORES={text!r}: range {part!r} is empty")
        if hi >= available:  # checked before the range is expanded: '0-99999999999' must not exhaust memory
            raise NeuronConfigError(
                f"NEURON_RT_VISIBLE_CORES={text!r} names core {max(lo, available)}, but the instance has only "
                f"{available} logical NeuronCores (0-{available - 1})"
            )
        cores.extend(range(lo, hi + 1))
    if not cores:
        raise NeuronConfigError(f"NEURON_RT_VISIBLE_CORES={text!r} names no core")
    if len(set(cores)) != len(cores):
        raise NeuronConfigError(f"NEURON_RT_VISIBLE_CORES={text!r} names a core twice")
    return tuple(cores)


def from_environment(env: dict[str, str] | None = None) -> RuntimeConfig:
    """Read the emulated machine from `env` (default: os.environ)."""
    env = os.environ if env is None else env
    name = env.get("TORCH_NEURONX_INSTANCE_TYPE", DEFAULT_INSTANCE).strip() or DEFAULT_INSTANCE
    instance = INSTANCES.get(name)
    if instance is None:
        known = ", ".join(sorted(INSTANCES))
        raise NeuronConfigError(f"TORCH_NEURONX_INSTANCE_TYPE={name!r} is not a known instance; choose one of {known}")
    lnc_text = env.get("NEURON_LOGICAL_NC_CONFIG", "").strip()
    lnc = instance.default_lnc if not lnc_text else int(lnc_text) if lnc_text.isdigit() else -1
    if lnc not in (1, 2):
        raise NeuronConfigError(f"NEURON_LOGICAL_NC_CONFIG={lnc_text!r}: must be 1 or 2")
    if lnc == 2 and not instance.chip.supports_lnc2:
        raise NeuronConfigError(
            f"NEURON_LOGICAL_NC_CONFIG=2 needs Trn2; {instance.name} ({instance.chip.name}) supports only 1"
        )
    logical = instance.physical_cores // lnc
    visible_text = env.get("NEURON_RT_VISIBLE_CORES", "").strip()
    visible = parse_core_list(visible_text, logical) if visible_text else tuple(range(logical))
    if len(visible) > MAX_VISIBLE_CORES:
        warnings.warn(
            f"{instance.name} at LNC={lnc} has {len(visible)} logical NeuronCores, but one PyTorch process can "
            f"address at most {MAX_VISIBLE_CORES} devices; exposing neuron:0-{MAX_VISIBLE_CORES - 1}. "
            "Launch one process per core group (NEURON_RT_VISIBLE_CORES) as on the real instance.",
            stacklevel=2,
        )
        visible = visible[:MAX_VISIBLE_CORES]
    hbm_text = env.get("TORCH_NEURONX_HBM_PER_CORE", "").strip()
    hbm = instance.chip.hbm_bytes // instance.chip.physical_cores * lnc
    if hbm_text:
        try:
            hbm = parse_bytes(hbm_text)
        except NeuronConfigError as exc:
            raise NeuronConfigError(f"TORCH_NEURONX_HBM_PER_CORE: {exc}") from None
        if not 0 < hbm <= MAX_HBM_BYTES:
            raise NeuronConfigError(
                f"TORCH_NEURONX_HBM_PER_CORE={hbm_text!r} must be a size between 1 byte and "
                f"{MAX_HBM_BYTES >> 40} TiB, e.g. '256MiB' or '16GiB'"
            )
    return RuntimeConfig(instance, lnc, visible, hbm, bool(hbm_text))
