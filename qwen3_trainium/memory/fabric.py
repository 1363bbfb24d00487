"""The network a step's collectives cross (``comm.py``): per rank, within a chip, between the
chips of an instance (NeuronLink), between instances (EFA); on a CPU, gloo as measured here
(``gloo_links.py``). Each ``Link`` is what ONE rank can send at once when every rank of its node
communicates, so a chip's or an instance's published figure is divided among its ranks.
Standard library only."""

from __future__ import annotations

from dataclasses import dataclass, field

from qwen3_trainium.config.devices import NEURON_INSTANCES


@dataclass(frozen=True)
class Link:
    name: str  # "within a chip", "NeuronLink-v3", "EFA", "gloo (this CPU)"
    bytes_per_second: float  # one rank's send (and receive) rate while every rank of its node communicates
    latency_s: float  # per ring step
    source: str  # citation, or "assumed: <why>"
    per_kind: dict[str, float] = field(default_factory=dict)  # a collective's own rate where it differs

    def rate(self, kind: str) -> float:
        return self.per_kind.get(kind, self.bytes_per_second)


@dataclass(frozen=True)
class Fabric:
    ranks_per_chip: int  # ranks sharing a chip (trn2 LNC=2: 4; CPU: 1)
    ranks_per_node: int
    chip: Link  # between ranks of one chip
    node: Link  # between chips of one instance (NeuronLink)
    network: Link  # between instances (EFA), per rank when every rank of a node crosses it


# trn2 (Neuron docs, "Amazon EC2 Trn2 Architecture", instance specifications:
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trn2-arch.html):
# - "16 Trainium2 chips connected using a 4x4, 2D Torus topology";
# - "Intra-instance NeuronLink-v3 bandwidth (GB/sec/chip) 1,024" (the Trainium2 page's "1.28 TB/sec
#   bandwidth per chip" is that plus the UltraServer's 256 inter-instance: aws-neuron/aws-neuron-sdk
#   about-neuron/arch/neuron-hardware/trainium2.rst); we take it as what a chip can send at once,
#   shared by its ranks;
# - "EFAv3 bandwidth (Gbps) 3,200" per instance, shared by its ranks.
TRN2_CHIPS = 16
NEURONLINK_V3_BYTES_PER_CHIP = 1024e9
EFA_V3_BYTES_PER_INSTANCE = 3200e9 / 8
# Latencies: AWS publishes none for a NeuronLink or EFA ring step. Third-party: EFAv3 "6.5
# microsecond packet latency" (SemiAnalysis, "Amazon's AI Self Sufficiency | Trainium2
# Architecture & Networking", 2024). Assumed here: 5 us within a chip, 10 us over NeuronLink (a
# DMA descriptor round plus the CC-core's synchronization), 20 us over EFA (its packet latency
# with the libfabric stack around it).
CHIP_LATENCY_S = 5e-6
NEURONLINK_LATENCY_S = 10e-6
EFA_LATENCY_S = 20e-6

# gloo on this project's CPU machine (2 cores, shared), fitted by ``measure_gloo`` on 2026-12-07:
#   .venv/bin/python -c "from qwen3_trainium.memory.gloo_links import measure_gloo; print(measure_gloo(repeats=5))"
# 2 ranks, float32 at 1, 16 and 64 MiB, best of 3 (first run) or 5; three runs, the median run per kind here
# (MB/s, all_gather 198 / 300 / 143, reduce_scatter 131 / 261 / 130, all_reduce 834 / 1,643 /
# 1,048, all_to_all 219 / 310 / 243: the machine was shared, load average 1.7). The rates are the
# bytes of ``collective_seconds``'s ring, k (size-1)/size x N, per second. gloo's all-reduce is
# 5-8x its all-gather and reduce-scatter on this machine (a single in-place buffer); only the
# all-reduce fits a latency (313 / 1,821 / 325 us a step; the others fit none: taken as it).
GLOO_LATENCY_S = 325e-6
GLOO_BYTES_PER_SECOND = {
    "all_gather": 198e6,
    "reduce_scatter": 131e6,
    "all_reduce": 1048e6,
    "all_to_all": 243e6,
}
GLOO_SOURCE = (
    "measured: measure_gloo(repeats=5), 2 gloo ranks on this project's 2-core CPU machine,"
    " 2026-12-07, median of three runs"
)


def fabric_for(
    device_type: str, *, instance: str = "trn2.48xlarge", lnc: int = 2, ranks_per_node: int
) -> Fabric:
    """The fabric of ``device_type``: a trn2 instance's published figures, or gloo on a CPU."""
    if device_type == "neuron":
        return _neuron_fabric(instance, lnc, ranks_per_node)
    if device_type == "cpu":
        return _cpu_fabric(ranks_per_node)
    raise ValueError(f"no communication model for device type {device_type!r} (neuron and cpu only)")


def _neuron_fabric(instance: str, lnc: int, ranks_per_node: int) -> Fabric:
    facts = NEURON_INSTANCES[instance]
    per_chip = facts.physical_cores // TRN2_CHIPS // lnc
    chip = Link(
        "within a chip",
        facts.hbm_bytes_per_second_per_physical_core * lnc,
        CHIP_LATENCY_S,
        "assumed: AWS publishes no core-to-core figure; the chip's HBM bandwidth (2.9 TB/s, Neuron"
        " docs 'Trainium2 Architecture Guide for NKI'), which a collective within the chip moves"
        " through, shared by its ranks",
    )
    node = Link(
        "NeuronLink-v3",
        NEURONLINK_V3_BYTES_PER_CHIP / per_chip,
        NEURONLINK_LATENCY_S,
        "trn2-arch.html: 'Intra-instance NeuronLink-v3 bandwidth (GB/sec/chip) 1,024', shared by the"
        " chip's ranks; latency assumed",
    )
    network = Link(
        "EFA",
        EFA_V3_BYTES_PER_INSTANCE / ranks_per_node,
        EFA_LATENCY_S,
        "trn2-arch.html: 'EFAv3 bandwidth (Gbps) 3,200' per instance, shared by its ranks; latency assumed",
    )
    return Fabric(per_chip, ranks_per_node, chip, node, network)


def _cpu_fabric(ranks_per_node: int) -> Fabric:
    rates = dict(GLOO_BYTES_PER_SECOND)
    gloo = Link("gloo (this CPU)", rates["all_reduce"], GLOO_LATENCY_S, GLOO_SOURCE, rates)
    network = Link(
        "network (gloo over TCP)",
        rates["all_reduce"],
        GLOO_LATENCY_S,
        "assumed: as gloo on one machine",
        rates,
    )
    return Fabric(1, ranks_per_node, gloo, gloo, network)
