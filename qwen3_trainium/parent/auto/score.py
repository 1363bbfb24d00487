"""What one layout costs (``parallel=auto``): memory per rank and the predicted step time.

- **Memory**: the estimate (``memory/estimate.py``) for every candidate; the trace (the second step of
  the real model as rank 0, ``memory/trace.py``) for the few that would win, which then decides.
- **Compute**: before a trace, torchtitan's model FLOPs per token times the tokens a rank computes
  per optimizer step, with activation checkpointing's recompute (``RECOMPUTE``), at the rank's
  peak; after it, the traced roofline (every op of the step at max(FLOPs / peak, bytes /
  bandwidth), ``memory/roofline.py``) times the micro-batches. An untraced row is scaled by what
  the most similar traced row measured against its FLOP count (``calibrate``).
- **Communication**: ``memory/comm.py`` (FSDP, TP, CP, EP collectives over NeuronLink and EFA, and
  what of them compute hides).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.memory import comm, estimate
from qwen3_trainium.memory.layout import Layout
from qwen3_trainium.memory.model_shape import ModelShape

# Compute per step with checkpointing, against none: full recomputes each layer's forward (1 of
# the 3 passes of forward + backward); torchtitan's selective policy recomputes every other matmul
# of a layer (``activation_checkpoint.py``: ``mm_count % 2`` is recomputed) and the cheap ops.
# A layout fits where its peak is at most this share of a rank's memory: pre-flight warns above it
# (``preflight/system.py``), and AWS's best practices ask for "memory headroom".
HEADROOM = 0.9
RECOMPUTE = {"none": 1.0, "selective": 1.0 + 0.5 / 3, "full": 1.0 + 1.0 / 3}


@dataclass
class Scored:
    layout: Layout
    run: RunConf
    capacity: int | None  # bytes a rank has
    estimate: int  # bytes per rank, estimated
    flops_seconds: float  # the FLOP count at the peak, recompute included (before calibration)
    trace: object | None = None  # memory.trace.Trace once traced
    trace_error: str = ""
    compute_seconds: float = 0.0
    comm: comm.StepComm | None = None
    verdict: str = ""
    overrides: list[str] = field(default_factory=list)

    @property
    def peak(self) -> int:
        return self.trace.total if self.trace is not None else self.estimate

    @property
    def traced(self) -> bool:
        return self.trace is not None

    @property
    def fits(self) -> bool:
        """Under pre-flight's warning line (``HEADROOM`` of the rank's memory)."""
        return not self.capacity or self.peak <= HEADROOM * self.capacity

    @property
    def step_seconds(self) -> float:
        return self.compute_seconds + (self.comm.exposed if self.comm else 0.0)

    def tokens_per_second(self, seq_len: int) -> float:
        """Per rank, as torchtitan counts it: a data-parallel rank's tokens over the step, over
        the ranks that share them (tp x cp)."""
        tokens = self.layout.global_batch * seq_len / self.layout.world
        return tokens / self.step_seconds if self.step_seconds else 0.0


def screen(run: RunConf, layout: Layout, shape: ModelShape, capacity: int | None) -> int:
    """The estimated peak per rank of ``run`` (already on ``layout``)."""
    return estimate.estimate(run, shape, dp_shard=layout.dp_shard, capacity=capacity).total


def flops_seconds(layout: Layout, flops_per_token: float, seq_len: int, peak: float) -> float:
    """One optimizer step's model FLOPs on one rank at the peak: the global batch's tokens split
    over every rank (TP and CP split a data-parallel rank's work), with the recompute."""
    tokens = layout.global_batch * seq_len / layout.world
    return tokens * flops_per_token * RECOMPUTE[layout.ac] / peak


def price_comm(row: Scored, shape: ModelShape, fabric: comm.Fabric) -> None:
    run = row.run
    compute = 2 if run.training.mixed_precision_param.value == "bfloat16" else 4
    reduce = 4 if run.training.mixed_precision_reduce.value == "float32" else compute
    reshard = run.parallel.fsdp_reshard_after_forward.value != "never"
    row.comm = comm.step_comm(
        row.layout, shape, seq_len=run.training.seq_len, compute_bytes=compute, reduce_bytes=reduce,
        reshard_after_forward=reshard, compute_seconds=row.compute_seconds, fabric=fabric,
    )  # fmt: skip


def calibrate(row: Scored, rows: list[Scored]) -> float:
    """Traced compute over the FLOP count (what the roofline adds to pure FLOPs: memory-bound
    ops, per-op costs) of the traced row most like ``row``: the same TP, CP, EP and checkpointing
    first, then the nearest micro-batch; 1 with none traced."""
    traced = [r for r in rows if r.traced and r.flops_seconds]
    if not traced:
        return 1.0
    a = row.layout

    def distance(r: Scored) -> tuple:
        b = r.layout
        differs = (a.tp != b.tp, a.cp != b.cp, a.ep != b.ep, a.ac != b.ac)
        return (sum(differs), differs, abs(a.local_batch - b.local_batch), a.world != b.world)

    like = min(traced, key=distance)
    return like.compute_seconds / like.flops_seconds
