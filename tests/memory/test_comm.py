"""The communication model of ``parallel=auto`` (``memory/comm.py``): the ring formula, which
level of a trn2 a group crosses, and the collectives of one step of Qwen3-30B-A3B's layouts.
Standard library only: nothing here imports torch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qwen3_trainium.memory.comm import KINDS, collective_seconds, fabric_for, step_comm
from qwen3_trainium.memory.layout import Layout
from tests.support.published_shapes import QWEN3_30B_A3B

GiB = 2**30
TRN2 = fabric_for("neuron", lnc=2, ranks_per_node=64)

# Qwen3-30B-A3B (Qwen/Qwen3-30B-A3B config.json): 48 layers, hidden 2048, 32 heads, 4 kv heads,
# head_dim 128, 128 experts, top 8, moe_intermediate_size 768, vocab 151,936; 30.5B parameters.
A3B = replace(QWEN3_30B_A3B, params=30_500_000_000, largest_layer=30_500_000_000 // 48)
STEP = dict(seq_len=4096, compute_bytes=2, reduce_bytes=4, reshard_after_forward=True, fabric=TRN2)


def _ring(nbytes: float, ranks: int, link, *, twice: int = 1) -> float:
    return twice * (ranks - 1) / ranks * nbytes / link.bytes_per_second + twice * (ranks - 1) * link.latency_s


@pytest.mark.parametrize("kind", KINDS)
def test_a_group_of_one_rank_costs_nothing(kind):
    assert collective_seconds(kind, GiB, size=1, stride=1, fabric=TRN2) == 0.0
    assert collective_seconds(kind, GiB, size=1, stride=64, fabric=TRN2) == 0.0


def test_the_ring_formula_on_eight_ranks_of_one_node():
    node = TRN2.node  # 8 consecutive ranks span 2 chips at LNC=2: NeuronLink, 1,024 GB/s / 4 ranks
    assert node.bytes_per_second == pytest.approx(256e9)
    expected = 7 / 8 * GiB / 256e9 + 7 * node.latency_s
    assert collective_seconds("all_gather", GiB, size=8, stride=1, fabric=TRN2) == pytest.approx(expected)
    assert collective_seconds("reduce_scatter", GiB, size=8, stride=1, fabric=TRN2) == pytest.approx(expected)
    twice = 2 * 7 / 8 * GiB / 256e9 + 2 * 7 * node.latency_s
    assert collective_seconds("all_reduce", GiB, size=8, stride=1, fabric=TRN2) == pytest.approx(twice)


def test_tp4_with_stride_1_stays_within_one_chip_at_lnc2():
    assert TRN2.ranks_per_chip == 4
    seconds = collective_seconds("all_reduce", GiB, size=4, stride=1, fabric=TRN2)
    assert seconds == pytest.approx(_ring(GiB, 4, TRN2.chip, twice=2))
    assert TRN2.chip.bytes_per_second > TRN2.node.bytes_per_second


def test_fsdp16_with_stride_4_crosses_chips_over_neuronlink():
    seconds = collective_seconds("all_gather", GiB, size=16, stride=4, fabric=TRN2)
    assert seconds == pytest.approx(_ring(GiB, 16, TRN2.node))


def test_a_group_over_two_nodes_uses_the_network():
    across = collective_seconds("all_gather", GiB, size=2, stride=64, fabric=TRN2)
    assert TRN2.network.bytes_per_second == pytest.approx(3200e9 / 8 / 64)
    assert across == pytest.approx(_ring(GiB, 2, TRN2.network))
    # 128 consecutive ranks: a ring of 64 over NeuronLink, then 2 nodes on a 64th of the tensor each
    hierarchical = _ring(GiB, 64, TRN2.node) + _ring(GiB / 64, 2, TRN2.network)
    assert collective_seconds("all_gather", GiB, size=128, stride=1, fabric=TRN2) == pytest.approx(
        hierarchical
    )


def test_cuda_has_no_fabric_and_the_cpu_prices_each_kind_at_its_measured_rate():
    with pytest.raises(ValueError):
        fabric_for("cuda", ranks_per_node=8)
    cpu = fabric_for("cpu", ranks_per_node=2)
    gather = collective_seconds("all_gather", GiB, size=2, stride=1, fabric=cpu)
    reduce = collective_seconds("all_reduce", GiB, size=2, stride=1, fabric=cpu)
    assert gather == pytest.approx(GiB / 2 / cpu.node.per_kind["all_gather"] + cpu.node.latency_s)
    assert reduce < gather  # gloo's all-reduce is the fastest of its collectives on this machine


def _layout(tp: int = 1, **kw) -> Layout:
    return Layout(world=64, ranks_per_node=64, tp=tp, **kw)


def _fsdp(comm) -> float:
    return comm.parts["FSDP all-gather"] + comm.parts["FSDP reduce-scatter"]


def test_tp4_x_fsdp16_moves_a_quarter_of_fsdp64s_fsdp_volume_and_adds_tp_all_reduces():
    fsdp64 = step_comm(_layout(), A3B, compute_seconds=0.0, **STEP)
    tp4 = step_comm(_layout(tp=4), A3B, compute_seconds=0.0, **STEP)
    assert 0.2 < _fsdp(tp4) / _fsdp(fsdp64) < 0.3  # 15/16 x 1/4 over 63/64, both over NeuronLink
    assert "TP all-reduce" not in fsdp64.parts
    assert tp4.parts["TP all-reduce"] > 0


def test_lora_cuts_the_reduce_scatter_not_the_all_gather():
    full = step_comm(_layout(), A3B, compute_seconds=0.0, **STEP)
    lora = step_comm(_layout(), replace(A3B, trainable=A3B.params // 1000), compute_seconds=0.0, **STEP)
    assert lora.parts["FSDP all-gather"] == pytest.approx(full.parts["FSDP all-gather"])
    assert lora.parts["FSDP reduce-scatter"] < full.parts["FSDP reduce-scatter"] / 100


def test_accumulation_repeats_every_collective_torchtitan_repeats_per_micro_batch():
    one = step_comm(_layout(tp=4, cp=2), A3B, compute_seconds=0.0, **STEP)
    four = step_comm(_layout(tp=4, cp=2, accum=4), A3B, compute_seconds=0.0, **STEP)
    assert set(one.parts) == {"FSDP all-gather", "FSDP reduce-scatter", "TP all-reduce", "CP K/V"}
    for family, seconds in one.parts.items():
        assert four.parts[family] == pytest.approx(4 * seconds), family


def test_full_checkpointing_repeats_the_forward_tp_collectives():
    none = step_comm(_layout(tp=4), A3B, compute_seconds=0.0, **STEP)
    full = step_comm(_layout(tp=4, ac="full"), A3B, compute_seconds=0.0, **STEP)
    assert full.parts["TP all-reduce"] == pytest.approx(1.5 * none.parts["TP all-reduce"])


def test_expert_parallel_adds_the_all_to_alls():
    ep = step_comm(_layout(ep=8), A3B, compute_seconds=0.0, **STEP)
    assert ep.parts["EP all-to-all"] > 0
    assert "EP all-to-all" not in step_comm(_layout(), A3B, compute_seconds=0.0, **STEP).parts


def test_with_compute_to_hide_behind_only_the_first_gather_and_last_reduce_scatter_are_exposed():
    layout = _layout()
    busy = step_comm(layout, A3B, compute_seconds=1e6, **STEP)
    embedding = A3B.vocab * A3B.dim
    group = dict(size=64, stride=1, fabric=TRN2)
    first = collective_seconds("all_gather", embedding * 2, **group)
    last = collective_seconds("reduce_scatter", embedding * 4, **group)
    assert busy.exposed == pytest.approx(first + last)
    idle = step_comm(layout, A3B, compute_seconds=0.0, **STEP)
    assert idle.exposed == pytest.approx(_fsdp(idle))
    assert any("own stream" in note for note in busy.notes)
