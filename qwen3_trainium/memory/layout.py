"""One parallel layout of a job, as ``parallel=auto`` plans it (``parent/auto``) and the
communication model prices it (``comm.py``). Standard library only.

torchtitan's mesh order puts ``tp`` innermost, then ``cp``, then the FSDP shard
(``ParallelDims``: ``["pp", "dp_replicate", "fsdp", "cp", "tp"]``), so a TP group is ``tp``
consecutive ranks, a CP group has stride ``tp``, FSDP shards over ``dp_shard x cp`` with stride
``tp``; expert parallel is the innermost axis of the sparse mesh (its groups are ``ep``
consecutive ranks: torchtitan 0.3.0 ``distributed/parallel_dims.py``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    world: int  # nnodes x ranks_per_node
    ranks_per_node: int
    tp: int = 1
    cp: int = 1
    ep: int = 1
    ac: str = "none"  # activation_checkpoint.mode: none | selective | full
    local_batch: int = 1  # sequences per rank per micro-batch
    accum: int = 1  # micro-batches per optimizer step (gradient accumulation)

    @property
    def dp_shard(self) -> int:
        return self.world // (self.tp * self.cp)

    @property
    def nnodes(self) -> int:
        return max(self.world // self.ranks_per_node, 1)

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step."""
        return self.local_batch * self.dp_shard * self.accum

    def name(self) -> str:
        parts = [f"TP{self.tp}"] if self.tp > 1 else []
        parts += [f"CP{self.cp}"] if self.cp > 1 else []
        parts += [f"FSDP{self.dp_shard}"] if self.dp_shard > 1 or not parts else []
        parts += [f"EP{self.ep}"] if self.ep > 1 else []
        return " x ".join(parts)
