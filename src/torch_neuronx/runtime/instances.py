"""The Trainium and Inferentia instances the emulator can stand in for.

AWS's published figures (sources in docs/hardware.md): NeuronCores and HBM
per chip, how Trn2 groups physical cores into logical ones, peak compute,
and the bandwidth of HBM, of NeuronLink between chips and of EFA between
instances (the last three feed ``torch-neuronx plan``'s time model).
"""

from __future__ import annotations

from typing import NamedTuple

GIB = 1 << 30


class Chip(NamedTuple):
    """One Neuron device (chip) generation."""

    name: str  # what get_device_properties().name reports: "trn1", "trn1n", "inf2", "trn2"
    core_version: str  # NeuronCore-v2 or -v3
    physical_cores: int
    hbm_bytes: int
    hbm_bandwidth_gbps: float  # GB/s per chip
    bf16_tflops: float  # dense, per chip
    fp32_tflops: float  # dense, per chip
    sbuf_bytes: int  # per physical core
    psum_bytes: int  # per physical core
    supports_lnc2: bool  # logical NeuronCore config 2 (two physical cores as one)
    neuronlink_gbps: float  # chip-to-chip NeuronLink bandwidth, GB/s per chip (0: a single-chip part)


# Trainium's HBM: "32 GiB of device memory ... with 820 GiB/sec of bandwidth" (AWS, about-neuron/arch/neuron-hardware/
# trainium.rst): 820 x 2^30 B/s = 880.47 GB/s
TRN1_HBM_GBPS = 820 * GIB / 1e9
TRN1 = Chip(name="trn1", core_version="v2", physical_cores=2, hbm_bytes=32 * GIB, hbm_bandwidth_gbps=TRN1_HBM_GBPS,
            bf16_tflops=190.0, fp32_tflops=47.5, sbuf_bytes=24 << 20, psum_bytes=2 << 20, supports_lnc2=False,
            neuronlink_gbps=384.0)
TRN1N = Chip(name="trn1n", core_version="v2", physical_cores=2, hbm_bytes=32 * GIB, hbm_bandwidth_gbps=TRN1_HBM_GBPS,
             bf16_tflops=190.0, fp32_tflops=47.5, sbuf_bytes=24 << 20, psum_bytes=2 << 20, supports_lnc2=False,
             neuronlink_gbps=768.0)
# Inferentia2's: "32GiB of high-bandwidth device memory (HBM) ... with 820 GiB/sec of bandwidth" (AWS,
# about-neuron/arch/neuron-hardware/inferentia2.rst; SDK 2.9's page said "820 GB/sec"): the same 880.47 GB/s
INF2_HBM_GBPS = 820 * GIB / 1e9
INF2 = Chip(name="inf2", core_version="v2", physical_cores=2, hbm_bytes=32 * GIB, hbm_bandwidth_gbps=INF2_HBM_GBPS,
            bf16_tflops=190.0, fp32_tflops=47.5, sbuf_bytes=24 << 20, psum_bytes=2 << 20, supports_lnc2=False,
            neuronlink_gbps=192.0)
TRN2 = Chip(name="trn2", core_version="v3", physical_cores=8, hbm_bytes=96 * GIB, hbm_bandwidth_gbps=2900.0,
            bf16_tflops=667.0, fp32_tflops=181.0, sbuf_bytes=28 << 20, psum_bytes=2 << 20, supports_lnc2=True,
            neuronlink_gbps=1024.0)


class Instance(NamedTuple):
    name: str
    chip: Chip
    chips: int
    efa_gbps: float  # EFA network bandwidth of the instance, Gbit/s (0: no multi-node)

    @property
    def physical_cores(self) -> int:
        return self.chip.physical_cores * self.chips

    @property
    def default_lnc(self) -> int:
        return 2 if self.chip.supports_lnc2 else 1


INSTANCES: dict[str, Instance] = {
    i.name: i
    for i in (
        Instance(name="trn1.2xlarge", chip=TRN1, chips=1, efa_gbps=0.0),
        Instance(name="trn1.32xlarge", chip=TRN1, chips=16, efa_gbps=800.0),
        Instance(name="trn1n.32xlarge", chip=TRN1N, chips=16, efa_gbps=1600.0),
        Instance(name="inf2.xlarge", chip=INF2, chips=1, efa_gbps=0.0),
        Instance(name="inf2.8xlarge", chip=INF2, chips=1, efa_gbps=0.0),
        Instance(name="inf2.24xlarge", chip=INF2, chips=6, efa_gbps=0.0),
        Instance(name="inf2.48xlarge", chip=INF2, chips=12, efa_gbps=0.0),
        Instance(name="trn2.3xlarge", chip=TRN2, chips=1, efa_gbps=0.0),
        Instance(name="trn2.48xlarge", chip=TRN2, chips=16, efa_gbps=3200.0),
    )
}

DEFAULT_INSTANCE = "trn2.48xlarge"
