"""Which NeuronCore generation a kernel is checked against, and that generation's limits.

``NEURON_PLATFORM_TARGET_OVERRIDE`` (``trn1``/``inf2``/``gen2``, ``trn2``/``gen3``,
``trn3``/``gen4``) wins, as in AWS's tools; otherwise the emulated instance
(``TORCH_NEURONX_INSTANCE_TYPE``) decides: trn1/trn1n/inf2 are NeuronCore-v2,
trn2 is NeuronCore-v3. Figures: NKI API reference (``nl.tile_size``,
``nisa.nc_matmul``) and the Trainium architecture guides.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True)
class Target:
    name: str  # "trn1", "trn2", "trn3"
    nc_version: int  # 2, 3, 4
    sbuf_partition_bytes: int  # SBUF bytes per partition
    pmax: int = 128  # partitions
    psum_banks: int = 8
    psum_bank_bytes: int = 2 * KIB  # per partition
    gemm_stationary_fmax: int = 128
    gemm_moving_fmax: int = 512  # fp32 elements of one PSUM bank (v2, v3); v4 streams up to 8 banks

    @property
    def psum_partition_bytes(self) -> int:
        return self.psum_banks * self.psum_bank_bytes


TARGETS = {
    "trn1": Target("trn1", 2, 192 * KIB),
    "trn2": Target("trn2", 3, 224 * KIB),
    "trn3": Target("trn3", 4, 256 * KIB),
}
_ALIASES = {"trn1": "trn1", "trn1n": "trn1", "inf2": "trn1", "gen2": "trn1", "trn2": "trn2", "gen3": "trn2",
            "trn3": "trn3", "gen4": "trn3"}


def resolve(name: str) -> Target:
    key = _ALIASES.get(str(name).strip().lower())
    if key is None:
        raise ValueError(f"unknown NKI target {name!r}: use one of trn1, inf2, gen2, trn2, gen3, trn3, gen4 "
                         "(NEURON_PLATFORM_TARGET_OVERRIDE or nki.jit(platform_target=...))")
    return TARGETS[key]


def current_target(override: str | None = None) -> Target:
    """The explicit override, else NEURON_PLATFORM_TARGET_OVERRIDE, else the emulated instance's chip."""
    if override:
        return resolve(override)
    from torch_neuronx.runtime import env

    text = str(env.get("NEURON_PLATFORM_TARGET_OVERRIDE") or "").strip()
    if text:
        return resolve(text)
    from torch_neuronx.runtime.instances import DEFAULT_INSTANCE, INSTANCES

    instance = INSTANCES.get(str(env.get("TORCH_NEURONX_INSTANCE_TYPE") or "").strip() or DEFAULT_INSTANCE)
    if instance is None:  # the device layer reports the bad variable; kernels check against the default
        instance = INSTANCES[DEFAULT_INSTANCE]
    return TARGETS["trn1"] if instance.chip.core_version == "v2" else TARGETS["trn2"]
