"""The collectives of one training step, priced: ``parallel=auto`` adds them to the roofline
(``roofline.py`` prices them at zero), so it can tell TP4 x FSDP16 from FSDP64. Standard library
only (the parent imports it); ``gloo_links.measure_gloo`` measured this CPU's links.

The fabric (``Fabric``) has three levels: ranks of one chip, chips of one instance (NeuronLink),
instances (EFA). Each ``Link`` is what ONE rank can send at once when every rank of its node
communicates, so the chip's or instance's published figure is divided among its ranks.

A collective over ``size`` ranks of stride ``stride`` (``collective_seconds``) is a ring. Within a
node: ``k (p-1)/p x N / B + k' (p-1) x latency`` over the slowest level the group crosses (``p`` its
ranks, ``N`` the full tensor, ``k = 1``, ``k' = 1``; all-reduce ``k = k' = 2``: reduce-scatter then
all-gather). A group over ``m`` nodes with ``p`` ranks in each is hierarchical: the ring within
the node on ``N``, then a ring across the ``m`` nodes on the rank's ``N / p`` slice over the
network link. An all-to-all sends ``N / size`` to each peer: ``(p-1)/size x N`` within the node and
``(size-p)/size x N`` over the network, one latency per peer.

Per optimizer step (``step_comm``; ``accum`` micro-batches of ``local_batch`` sequences):
- FSDP over ``dp_shard x cp`` (stride ``tp``), as torchtitan 0.3.0 shards it: each unit (a layer,
  the embedding, the output head) is all-gathered in the compute dtype in forward, and again in
  backward when it was resharded after forward; its trainable parameters' gradients are
  reduce-scattered in ``reduce_bytes``, every micro-batch (torchtitan never turns FSDP2's
  gradient sync off between micro-batches). A rank gathers ``1 / tp`` of each unit; under expert
  parallel the routed experts are sharded over ``ep`` and FSDP'd over ``world / ep`` instead.
- TP (stride 1): per layer and micro-batch, two all-reduces of the ``[B x S / cp, dim]``
  activations in forward (attention's output, the FFN's), two in backward, two more in the
  recomputed forward under full checkpointing; sequence parallel's all-gather plus reduce-scatter
  move the same bytes. MoE layers do the same when TP splits the experts (torchtitan's MoE TP).
- CP (stride ``tp``): per layer and micro-batch, K and V ``[B, S, kv_dim / tp]`` all-gathered in
  forward (again in full checkpointing's recompute), their gradients reduce-scattered in backward.
- EP (stride 1: torchtitan's ``ep`` is the innermost axis of its sparse mesh): per MoE layer and
  micro-batch, the dispatch and combine all-to-alls of the rank's ``T x top_k`` routed rows
  (``dim`` wide, compute dtype) in forward and both again in backward.
The overlap rules are ``OVERLAP``: each is also a note of every ``StepComm``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from qwen3_trainium.memory.fabric import Fabric, Link, fabric_for  # noqa: F401  (re-exported: comm.fabric_for)
from qwen3_trainium.memory.layout import Layout
from qwen3_trainium.memory.model_shape import ModelShape

# torchtitan 0.3.0 distributed/parallel_dims.py build_mesh (lines 278-279, 336-340): the sparse
# mesh is ("pp", "dp_replicate", "efsdp", "ep") with efsdp = dp_shard x cp x tp / ep, so an EP
# group is ``ep`` consecutive ranks (``layout.py`` says stride ``tp``: the source says 1).
EP_STRIDE = 1
# Gradient accumulation: torchtitan 0.3.0 trainer.py train_step (lines 885-924) runs
# forward_backward_step once per micro-batch and never calls FSDP2's set_requires_gradient_sync
# (only components/loss.py's ChunkedLossWrapper does, for the output head's chunks, lines 731-771),
# so FSDP2 reduce-scatters every unit's gradients in every micro-batch.
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")

OVERLAP = (
    "FSDP's all-gathers and reduce-scatters run on their own stream and hide behind compute, but for"
    " each micro-batch's first all-gather (the embedding: nothing to compute before it) and the"
    " step's last reduce-scatter (the embedding's gradient: nothing to compute after it)",
    "FSDP beyond the compute it can hide behind is exposed: max(0, FSDP total - those - compute)",
    "TP, CP and EP collectives sit on the critical path: exposed in full",
    "selective checkpointing recomputes no collective (torchtitan's SelectiveAC saves the outputs"
    " of reduce-scatters and all-to-alls; the all-gathers before the matmuls it recomputes are"
    " assumed saved too); full checkpointing repeats the forward's TP, CP and EP collectives",
)


def _ring(kind: str, nbytes: float, ranks: int, link: Link) -> float:
    """One flat ring of ``ranks`` over ``link`` (all-to-all: pairwise, one latency per peer)."""
    if ranks <= 1:
        return 0.0
    twice = 2 if kind == "all_reduce" else 1
    moved = twice * (ranks - 1) / ranks * nbytes
    return moved / link.rate(kind) + twice * (ranks - 1) * link.latency_s


def _local_link(ranks: int, stride: int, fabric: Fabric) -> Link:
    """The slowest level a group's ranks within one node cross: one chip, or NeuronLink."""
    span = (ranks - 1) * stride + 1  # from rank 0, chips aligned to ranks_per_chip
    return fabric.chip if span <= fabric.ranks_per_chip else fabric.node


def collective_seconds(kind: str, nbytes: float, *, size: int, stride: int, fabric: Fabric) -> float:
    """Seconds of one collective over ranks ``0, stride, ..., (size-1) x stride`` (the module
    docstring gives the formula). ``nbytes`` is the full tensor: all-gather's output,
    reduce-scatter's input, all-reduce's tensor, what one rank sends in an all-to-all."""
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r}: {KINDS}")
    if size <= 1 or nbytes <= 0:
        return 0.0
    local = min(size, max(math.ceil(fabric.ranks_per_node / stride), 1))
    nodes = math.ceil(size / local)
    link = _local_link(local, stride, fabric)
    if kind == "all_to_all":
        inside = (local - 1) / size * nbytes / link.rate(kind) + (local - 1) * link.latency_s
        net = fabric.network
        outside = (size - local) / size * nbytes / net.rate(kind) + (size - local) * net.latency_s
        return inside + outside
    return _ring(kind, nbytes, local, link) + _ring(kind, nbytes / local, nodes, fabric.network)


@dataclass(frozen=True)
class StepComm:
    parts: dict[str, float]  # seconds per optimizer step per family, raw (not overlapped)
    exposed: float  # seconds the step waits on communication after the overlap rules
    notes: tuple[str, ...] = ()


def _expert_params(shape: ModelShape) -> int:
    """The routed experts' parameters: three ``dim x expert_width`` matrices per expert and layer."""
    return shape.n_layers * shape.num_experts * 3 * shape.dim * shape.expert_width


@dataclass(frozen=True)
class _Fsdp:
    gather: float  # seconds per micro-batch: every unit's all-gathers
    reduce: float  # seconds per micro-batch: every unit's reduce-scatters
    first_gather: float  # the embedding's all-gather
    last_reduce: float  # the embedding's reduce-scatter


def _fsdp_groups(layout: Layout, shape: ModelShape, moe_tp_experts: bool) -> list[tuple[float, int, int]]:
    """``(parameters a rank gathers, group size, stride)`` per FSDP group: dense parameters over
    ``dp_shard x cp`` (stride ``tp``; torchtitan 0.3.0 ``distributed/parallel_dims.py``
    build_mesh, "fsdp = dp_shard x cp", and ``distributed/full_dtensor.py`` resolve_fsdp_mesh,
    shard axes ``dp_shard`` plus ``cp``), each rank gathering a ``1 / tp`` slice; routed experts
    under EP over ``efsdp = world / ep`` (stride ``ep``), each rank ``1 / ep`` of them; experts TP
    does not split (``moe_tp_experts=False``) gathered whole."""
    dense_group = (layout.dp_shard * layout.cp, layout.tp)
    experts = _expert_params(shape) if shape.num_experts > 0 else 0
    if layout.ep > 1:
        return [
            ((shape.params - experts) / layout.tp, *dense_group),
            (experts / layout.ep, layout.world // layout.ep, layout.ep),
        ]
    if experts and layout.tp > 1 and not moe_tp_experts:
        return [((shape.params - experts) / layout.tp, *dense_group), (experts, *dense_group)]
    return [(shape.params / layout.tp, *dense_group)]


def _fsdp(
    layout: Layout, shape: ModelShape, compute: int, reduce: int, fabric: Fabric, moe_tp: bool
) -> _Fsdp:
    """One micro-batch's FSDP collectives priced (``_fsdp_groups``). Gradients are reduce-scattered
    for the trainable parameters only (``shape.trained``: LoRA's adapters), taken in proportion
    across the groups."""
    trained = shape.trained / shape.params if shape.params else 1.0
    gather = reduce_s = 0.0
    for params, size, stride in _fsdp_groups(layout, shape, moe_tp):
        group = dict(size=size, stride=stride, fabric=fabric)
        gather += collective_seconds("all_gather", params * compute, **group)
        reduce_s += collective_seconds("reduce_scatter", params * trained * reduce, **group)
    embedding = shape.vocab * shape.dim / layout.tp
    dense = dict(size=layout.dp_shard * layout.cp, stride=layout.tp, fabric=fabric)
    first = collective_seconds("all_gather", embedding * compute, **dense)
    last = collective_seconds("reduce_scatter", embedding * trained * reduce, **dense)
    return _Fsdp(gather, reduce_s, first, last)


def _tp_calls(layout: Layout) -> int:
    """All-reduce equivalents per layer and micro-batch: 2 forward, 2 backward, 2 recomputed (full)."""
    return 4 + (2 if layout.ac == "full" else 0)


def step_comm(
    layout: Layout,
    shape: ModelShape,
    *,
    seq_len: int,
    compute_bytes: int,
    reduce_bytes: int,
    reshard_after_forward: bool,
    compute_seconds: float,
    fabric: Fabric,
    moe_tp_experts: bool = True,
) -> StepComm:
    """The collectives of one optimizer step of ``layout``, per family, and what of them the step
    waits on (``OVERLAP``). ``moe_tp_experts=False``: TP does not split the experts, so a MoE
    layer's FFN does no TP collective (each TP rank routes its own sequence-parallel tokens) and
    its ranks gather the experts whole."""
    accum, full_ac = layout.accum, layout.ac == "full"
    moe = shape.num_experts > 0
    notes = list(OVERLAP)
    parts: dict[str, float] = {}
    fsdp = _fsdp(layout, shape, compute_bytes, reduce_bytes, fabric, moe_tp_experts)
    if fsdp.gather or fsdp.reduce:
        passes = 2 if reshard_after_forward else 1
        parts["FSDP all-gather"] = accum * passes * fsdp.gather
        parts["FSDP reduce-scatter"] = accum * fsdp.reduce
    if layout.tp > 1:
        rows = layout.local_batch * seq_len / layout.cp
        acts = rows * shape.dim * compute_bytes
        one = collective_seconds("all_reduce", acts, size=layout.tp, stride=1, fabric=fabric)
        per_layer = _tp_calls(layout)
        if moe and (layout.ep > 1 or not moe_tp_experts):
            per_layer //= 2  # attention's only
            notes.append("MoE under TP: experts not split by TP, attention's TP collectives only")
        elif moe:
            notes.append("MoE under TP: torchtitan's MoE TP splits the experts: 2 + 2 per layer, as dense")
        parts["TP all-reduce"] = accum * shape.n_layers * per_layer * one
    if layout.cp > 1:
        kv = 2 * layout.local_batch * seq_len * shape.kv_dim / layout.tp * compute_bytes
        cp = dict(size=layout.cp, stride=layout.tp, fabric=fabric)
        gathers = 2 if full_ac else 1
        per_layer = gathers * collective_seconds("all_gather", kv, **cp)
        per_layer += collective_seconds("reduce_scatter", kv, **cp)
        parts["CP K/V"] = accum * shape.n_layers * per_layer
    if moe and layout.ep > 1:
        tokens = layout.local_batch * seq_len / (layout.cp * layout.tp)
        sent = tokens * shape.top_k * shape.dim * compute_bytes
        one = collective_seconds("all_to_all", sent, size=layout.ep, stride=EP_STRIDE, fabric=fabric)
        calls = 4 + (2 if full_ac else 0)
        parts["EP all-to-all"] = accum * shape.n_layers * calls * one
        notes.append(
            "EP: each rank dispatches its own S / (cp x tp) sequence-parallel tokens x top_k rows,"
            " ep innermost (stride 1) as torchtitan's sparse mesh puts it"
        )
    exposed = _exposed(parts, fsdp, accum, compute_seconds)
    return StepComm(parts, exposed, tuple(notes))


def _exposed(parts: dict[str, float], fsdp: _Fsdp, accum: int, compute_seconds: float) -> float:
    fsdp_total = parts.get("FSDP all-gather", 0.0) + parts.get("FSDP reduce-scatter", 0.0)
    edges = (accum * fsdp.first_gather + fsdp.last_reduce) if fsdp_total else 0.0
    fsdp_exposed = edges + max(0.0, fsdp_total - edges - compute_seconds)
    critical = sum(v for k, v in parts.items() if not k.startswith("FSDP"))
    return fsdp_exposed + critical
