"""Device memory per rank, estimated from the config before launch (HBM on Trainium).

A modelled figure, calibrated against ``memory=trace`` (``memory/trace.py``), whose peak it follows:
early in backward, on FSDP over ``dp_shard x cp`` with tensor parallel ``tp`` (pipeline stages
divide the layers). Per rank:
- parameters float32 and AdamW's two states, sharded;
- FSDP: the largest unit (a layer, the embedding or the output head) gathered in the compute
  dtype, with the unit it prefetches, and that unit's gradients before their reduce-scatter (in
  the compute dtype plus the float32 copy FSDP reduces);
- activations saved for backward, per layer and token, tensor by tensor (the layer's input,
  norms, residuals, q/k/v, q/k norms, rotated q/k, attention output, SwiGLU's four ``F``-wide
  tensors), divided by ``tp`` and ``cp``: selective checkpointing keeps the matmul outputs,
  full the layer's input, both plus the layer being recomputed;
- attention (``attention_parts``): on CPU the probabilities ``B x H x S/cp x S`` (torch's CPU
  kernels, at their worst); on a device none (flash: ``memory/flash.py``); the document SDPA's
  boolean mask; context parallel's all-gathered K/V;
- torchtitan's RoPE cache, float32 in every layer (``rope_table_bytes``); on the grouped MoE
  route, the routed ``[T x top_k, dim]`` tensors of the layer in backward (``moe_routed_bytes``);
- ``model=nki_moe``'s blockwise op: what it saves for backward over every padded block slot
  (``kernels.rules.num_blocks``), in every layer without checkpointing, else in one;
- one chunk of logits (all of them on the HF path) with their float32 copy and gradient;
- gradients beyond the activations they replace (the end of backward, where that is higher);
- ``peft=lora``: gradients and AdamW states for the adapters only, and the matmul outputs that
  selective checkpointing keeps once each adapter adds its two matmuls (``_lora_saved_matmuls``);
  on the experts (``adapters.py``), the grouped route's rank-wide rows and its low-rank paths'
  gradients in the layer in backward, or the blockwise route's merged weights and their gradient.
The model's parameter counts come from the model itself, built on the meta device. On the
docs' trn2 lines (but their Slurm examples and ``model=hf``, which ``memory=auto`` traces) it is
within 15% of the trace (``tests/parent/test_readme_trainium.py``, make test-heavy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the parent plans memory without importing torch
    import torch

from qwen3_trainium.config.schema import ACMode, RunConf
from qwen3_trainium.memory import adapters as expert_lora
from qwen3_trainium.memory.model_shape import ModelShape  # noqa: F401  (re-exported: estimate.ModelShape)
from qwen3_trainium.memory.sequence import (
    attention_parts,
    moe_routed_bytes,
    rope_table_bytes,
    tp_gathered_bytes,
)

GiB = 2**30


@dataclass(frozen=True)
class Estimate:
    parts: dict[str, int]  # bytes per rank
    capacity: int | None

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def table(self) -> str:
        lines = [f"  {name:24s} {value / GiB:8.3f} GiB" for name, value in self.parts.items()]
        lines.append(f"  {'total per rank':24s} {self.total / GiB:8.3f} GiB")
        if self.capacity:
            lines.append(
                f"  {'device memory per rank':24s} {self.capacity / GiB:8.3f} GiB ({100 * self.total / self.capacity:.0f}%)"
            )
        return "\n".join(lines)


def model_shape(model_config, model: torch.nn.Module | None = None) -> ModelShape:
    """Dims from a torchtitan model config (native, or HF after update_from_config); parameter
    counts from the (meta-device) model when given, else 0."""
    if hasattr(model_config, "layers"):  # native Decoder config
        first = model_config.layers[0]
        attn, moe = first.attention, getattr(first, "moe", None)
        heads, kv_heads = attn.n_heads, attn.n_kv_heads or attn.n_heads
        head_dim = attn.head_dim or model_config.dim // heads
        dim, vocab, n_layers = model_config.dim, model_config.vocab_size, len(model_config.layers)
        experts = moe.num_experts if moe else 0
        top_k, width = (moe.router.top_k, moe.routed_experts.inner_experts.hidden_dim) if moe else (0, 0)
        ffn = top_k * width if moe else first.feed_forward.w1.out_features
    else:  # HF backend config
        c = model_config
        heads, kv_heads = c.num_attention_heads, c.num_key_value_heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        dim, vocab, n_layers = c.hidden_size, c.vocab_size, c.num_hidden_layers
        experts = getattr(c, "num_experts", 0) or 0
        top_k, width = (c.num_experts_per_tok, c.moe_intermediate_size) if experts else (0, 0)
        ffn = top_k * width if experts else c.intermediate_size
    params = largest = 0
    trainable, adapters, expert_adapters = -1, (), ()
    if model is not None:
        layers = list(model.layers.values() if hasattr(model.layers, "values") else model.layers)
        params = sum(p.numel() for p in model.parameters())
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        largest = max(sum(p.numel() for p in layer.parameters()) for layer in layers)
        adapters = tuple(
            sorted((name.rsplit(".", 1)[-1], m.lora_a.weight.shape[0])
                   for name, m in layers[0].named_modules() if hasattr(m, "lora_a"))
        )  # fmt: skip
        expert_adapters = expert_lora.expert_adapters(layers[0])
    return ModelShape(
        params=params, largest_layer=largest, n_layers=n_layers, dim=dim,
        q_dim=heads * head_dim, kv_dim=kv_heads * head_dim, ffn=ffn, n_heads=heads,
        n_kv_heads=kv_heads, vocab=vocab, num_experts=experts,
        largest_unit=max(largest, vocab * dim), top_k=top_k, expert_width=width, trainable=trainable,
        adapters=adapters, expert_adapters=expert_adapters,
    )  # fmt: skip


def _per_token_layer(shape: ModelShape, ac: ACMode, blockwise: bool) -> tuple[int, int]:
    """Elements saved per token and layer: (what ``ac`` keeps, all of them). A blockwise MoE layer's
    FFN is one op whose saved tensors ``blockwise_layer_bytes`` counts."""
    h, q, kv, f = shape.dim, shape.q_dim, shape.kv_dim, shape.ffn
    ffn_all, ffn_matmuls = (0, 0) if blockwise else (4 * f, 2 * f)  # SwiGLU's four F-wide tensors
    # the input, two norms, two residuals (5h); q/k/v, q/k norms, rotated q/k, attention out (4q + 4kv)
    saved_all = 5 * h + 4 * q + 4 * kv + ffn_all
    kept = {ACMode.none: saved_all, ACMode.selective: h + q + 2 * kv + ffn_matmuls, ACMode.full: h}[ac]
    if not blockwise:  # LoRA on the grouped experts: the low-rank paths' rank-wide rows
        saved_all += expert_lora.low_rank_elements(shape)
        kept += expert_lora.low_rank_kept(shape, ac)
    if ac is ACMode.selective:
        kept += _lora_saved_matmuls(shape)
    elif ac is ACMode.none:  # each adapter's rank-wide intermediate (its input is saved already)
        kept += sum(rank for _, rank in shape.adapters)
    return kept, saved_all


def _lora_saved_matmuls(shape: ModelShape) -> int:
    """What peft=lora adds per token and layer under selective checkpointing. torchtitan's policy
    saves every other matmul's output in a layer, in forward order (``activation_checkpoint.py``:
    ``meta[mm_count_key] % 2 == 0`` recomputes), and an adapter puts two matmuls (``lora_a``, rank
    wide, then ``lora_b``, as wide as its base) behind its base Linear, so the saved set shifts."""
    if not shape.adapters:
        return 0
    h, q, kv, f = shape.dim, shape.q_dim, shape.kv_dim, shape.ffn
    ffn = [("gate", shape.num_experts)] if shape.num_experts else [("w1", f), ("w3", f), ("w2", h)]
    order = [("wqkv", q + 2 * kv), ("wo", h), *ffn]  # the layer's matmuls in forward order
    ranks = dict(shape.adapters)

    def saved(adapted: dict) -> int:
        widths = []
        for name, width in order:
            widths += [width] + ([adapted[name], width] if name in adapted else [])
        return sum(widths[0::2])  # the 1st, 3rd, ... matmul of the layer is saved

    return saved(ranks) - saved({})


def blockwise_layer_bytes(run: RunConf, shape: ModelShape, tokens: int) -> int:
    """What the ``moe_blockwise`` op saves for its backward in one layer: its activation checkpoints
    over every block slot, padding included (``gate_up [N, 2, I, B]`` and ``down [N, B, H]`` in the
    MoE compute dtype), the hidden states with their padding row and the affinities."""
    from qwen3_trainium.models.kernels.rules import num_blocks

    block = run.model.moe_block_size
    slots = num_blocks(tokens, shape.top_k, shape.num_experts, block) * block
    moe_bytes = 2 if run.model.moe_compute_dtype.value == "bfloat16" else 4
    param_bytes = 2 if run.training.mixed_precision_param.value == "bfloat16" else 4
    width = shape.expert_width // run.parallel.tensor_parallel_degree
    return slots * (2 * width + shape.dim) * moe_bytes + (tokens + 1) * (
        shape.dim * param_bytes + shape.num_experts * 4
    )


def estimate(run: RunConf, shape: ModelShape, *, dp_shard: int, capacity: int | None) -> Estimate:
    """The peak per rank early in backward, where the traces put it: the sharded state, FSDP's
    gathered unit and the one it prefetches, that unit's gradients before their reduce-scatter,
    every saved activation (with checkpointing: plus the layer being recomputed), the logits.
    Gradients count as far as they outgrow the activations they replace."""
    par, train, ac = run.parallel, run.training, run.activation_checkpoint.mode
    shard = max(dp_shard, 1) * par.context_parallel_degree
    split = shard * par.tensor_parallel_degree * par.pipeline_parallel_degree
    compute = 2 if train.mixed_precision_param.value == "bfloat16" else 4
    reduce_copy = 4 if train.mixed_precision_reduce.value == "float32" and compute != 4 else 0
    local_tokens = train.local_batch_size * train.seq_len // par.context_parallel_degree
    tokens = local_tokens / par.tensor_parallel_degree  # sequence parallel splits the rest
    layers = shape.n_layers / par.pipeline_parallel_degree
    blockwise = shape.num_experts > 0 and "moe_experts" in run.model.kernels
    kept, saved_all = _per_token_layer(shape, ac, blockwise)
    activations = (kept * layers + (saved_all if ac is not ACMode.none else 0)) * tokens * compute
    unit = (shape.largest_unit or shape.largest_layer) / par.tensor_parallel_degree
    # peft=lora: gradients and AdamW states for the adapters only (the base is frozen)
    trained_share = shape.trained / shape.params if shape.params else 1.0
    parts = {
        "parameters (fp32)": 4 * shape.params // split,
        "AdamW states (fp32)": 8 * shape.trained // split,
        "FSDP gathered (2 units)": int(2 * compute * unit),
        "FSDP unit gradients": int((compute + reduce_copy) * unit * trained_share),
        "activations": int(activations),
    }
    if blockwise:  # without checkpointing every layer's; with it the recomputed layer's
        per_layer = blockwise_layer_bytes(run, shape, local_tokens)
        parts["MoE blocks (padded)"] = int(per_layer * (layers if ac is ACMode.none else 1))
        if shape.expert_adapters:
            parts["expert LoRA merged"] = expert_lora.merged_expert_bytes(run, shape, compute)
    # torchtitan's chunked loss (native paths): one chunk's logits at a time, in the compute dtype,
    # upcast and their gradient in float32; the HF path computes all of them at once
    chunks = 8 if run.model.path.value != "hf" else 1
    parts["logits (+ grad)"] = int((compute + 8) * tokens * shape.vocab / chunks)
    if shape.num_experts and not blockwise:
        parts["MoE routed tokens"] = int(moe_routed_bytes(shape, local_tokens, compute))
        if shape.expert_adapters:
            parts["expert LoRA gradients"] = expert_lora.low_rank_grad_bytes(shape, local_tokens, compute)
    if par.tensor_parallel_degree > 1:
        parts["TP gathered sequence"] = tp_gathered_bytes(run, shape, local_tokens, compute)
    parts.update(attention_parts(run, shape, compute, layers))
    parts["RoPE cache (fp32)"] = rope_table_bytes(run, shape)
    freed = sum(v for k, v in parts.items() if not k.startswith(("parameters", "AdamW", "FSDP")))
    if 4 * shape.trained // split > freed:  # the end of backward: gradients where activations were
        parts["gradients (fp32)"] = 4 * shape.trained // split - freed
    return Estimate(parts, capacity)
