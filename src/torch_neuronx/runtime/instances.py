"""The Trainium and Inferentia instances the emulator can stand in for.

Numbers from AWS's published specifications (see docs/hardware.md): NeuronCores
per chip, HBM per chip, and how Trn2 groups physical cores into logical ones.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class Chip:
    """One Neuron device (chip) generation."""

    name: str  # what get_device_properties().name reports: "trn1", "trn1n", "inf2", "trn2"
    core_version: str  # NeuronCore-v2 or -v3
    physical_cores: int
    hbm_bytes: int
    hbm_bandwidth_gbps: float  # GB/s per chip
    bf16_tflops: float  # dense, per chip
    sbuf_bytes: int  # per physical core
    psum_bytes: int  # per physical core
    supports_lnc2: bool  # logical NeuronCore config 2 (two physical cores as one)


TRN1 = Chip("trn1", "v2", 2, 32 * GIB, 820.0, 190.0, 24 << 20, 2 << 20, False)
TRN1N = Chip("trn1n", "v2", 2, 32 * GIB, 820.0, 190.0, 24 << 20, 2 << 20, False)
INF2 = Chip("inf2", "v2", 2, 32 * GIB, 820.0, 190.0, 24 << 20, 2 << 20, False)
TRN2 = Chip("trn2", "v3", 8, 96 * GIB, 2900.0, 667.0, 28 << 20, 2 << 20, True)


@dataclass(frozen=True)
class Instance:
    name: str
    chip: Chip
    chips: int

    @property
    def physical_cores(self) -> int:
        return self.chip.physical_cores * self.chips

    @property
    def default_lnc(self) -> int:
        return 2 if self.chip.supports_lnc2 else 1


INSTANCES: dict[str, Instance] = {
    i.name: i
    for i in (
        Instance("trn1.2xlarge", TRN1, 1),
        Instance("trn1.32xlarge", TRN1, 16),
        Instance("trn1n.32xlarge", TRN1N, 16),
        Instance("inf2.xlarge", INF2, 1),
        Instance("inf2.8xlarge", INF2, 1),
        Instance("inf2.24xlarge", INF2, 6),
        Instance("inf2.48xlarge", INF2, 12),
        Instance("trn2.3xlarge", TRN2, 1),
        Instance("trn2.48xlarge", TRN2, 16),
    )
}

DEFAULT_INSTANCE = "trn2.48xlarge"
