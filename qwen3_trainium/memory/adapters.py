"""What LoRA on the routed experts adds to the estimate (``estimate.py``), beyond the adapters'
own gradients and AdamW states (those follow from the model's trainable parameters, sharded as
the experts are: the adapters are stored expert dim first, ``models/expert_lora.py``).

Per route (``models/expert_lora.py``, issue 40):
- torchtitan's grouped experts (``model=native``): each adapted projection adds a low-rank path,
  ``(x A_e^T) B_e^T``, as two grouped GEMMs over the routed rows. Its input (``x``, or SwiGLU's
  ``h`` for ``down``) is the one the base GEMM saves already; the second GEMM saves its
  ``[T x top_k, r]`` input, the new tensor per routed row. ``torch._grouped_mm`` is not in
  torchtitan's selective-checkpointing save list (``activation_checkpoint._get_default_save_ops``),
  so with checkpointing only the layer being recomputed holds it. In backward the layer holds
  gradients as wide as the paths' outputs (``low_rank_grad_bytes``).
- the blockwise op (``model=nki_moe``): the kernel takes merged weights ``W + s B A``; they are
  not saved (a ``saved_tensors_hooks`` pair keeps the recipe and merges again in backward), so
  the cost is a transient of the layer running: its merged experts, and, in backward, their
  gradient before it reduces to the adapters' (both ``[E, D, 2F]`` + ``[E, F, D]`` in the
  compute dtype; tensor parallel would split ``F``, but pre-flight refuses TP and EP with expert
  targets today, ``parent/preflight/peft.py``).
Standard library only: the parent plans memory without importing torch."""

from __future__ import annotations

from qwen3_trainium.config.schema import ACMode, RunConf
from qwen3_trainium.memory.model_shape import ModelShape


def expert_adapters(layer) -> tuple[tuple[str, int], ...]:
    """(adapted expert projection, rank) of one built decoder layer: ``expert_lora.py`` registers
    ``lora_a_<part> [E, r, in]`` on the experts module, one per adapted part (``gate_up``,
    ``down``)."""
    found = {
        name.rsplit(".", 1)[-1].removeprefix("lora_a_"): param.shape[1]
        for name, param in layer.named_parameters()
        if name.rsplit(".", 1)[-1].startswith("lora_a_") and param.dim() == 3
    }
    return tuple(sorted(found.items()))


def low_rank_elements(shape: ModelShape) -> int:
    """Elements per token and layer the grouped route's low-rank paths save: one ``r``-wide row
    per adapted projection and routed copy of the token (``top_k`` of them)."""
    return shape.top_k * sum(rank for _, rank in shape.expert_adapters)


def low_rank_kept(shape: ModelShape, ac: ACMode) -> int:
    """Of ``low_rank_elements``, what the layers not being recomputed keep under ``ac``."""
    return low_rank_elements(shape) if ac is ACMode.none else 0


def low_rank_grad_bytes(shape: ModelShape, tokens: int, compute: int) -> int:
    """The grouped route's low-rank paths in the layer in backward, per routed row, in the compute
    dtype: ``gate_up``'s output gradient ``[R, 2F]`` (summed from the gate and up slices' own full
    ones), ``down``'s scaled output gradient ``[R, D]`` with the path's ``[R, F]`` share of
    SwiGLU's gradient before that is accumulated. Traced (device=neuron, 2026-12-06): 30B-A3B on
    FSDP 64 with selective checkpointing holds 0.173 GiB more activations than with LoRA on
    attention alone, down's ``[32,768, 2,048 + 768]`` in bfloat16; tiny_moe without checkpointing
    twice its parts (the estimate reads 0.89 of that trace)."""
    parts = dict(shape.expert_adapters)
    width = (2 * shape.expert_width if "gate_up" in parts else 0) + (
        shape.dim + shape.expert_width if "down" in parts else 0
    )
    return tokens * shape.top_k * width * compute


def merged_expert_bytes(run: RunConf, shape: ModelShape, compute: int) -> int:
    """The blockwise route's transient in the layer in backward: its merged expert weights and
    their gradient, one ``[E, D, 2F]`` and ``[E, F, D]`` pair each (only the adapted parts are
    merged; an unadapted part passes its base weight, already counted with FSDP's unit). What
    the route is designed to hold: with activation checkpointing its trace kept far more on
    2026-12-06 (the hooks sit inside the checkpointed layer; docs/memory.md, "LoRA on the
    experts")."""
    parts = dict(shape.expert_adapters)
    width = shape.expert_width // run.parallel.tensor_parallel_degree
    per_expert = (2 if "gate_up" in parts else 0) * shape.dim * width + (
        shape.dim * width if "down" in parts else 0
    )
    return 2 * shape.num_experts * per_expert * compute
