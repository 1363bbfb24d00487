"""Device memory per rank, estimated from the config before launch (HBM on Trainium).

Per rank, with FSDP sharding over ``dp_shard x cp`` and tensor parallel ``tp`` (pipeline stages
divide the layers):
- parameters, gradients: float32 master copies, sharded; AdamW: two float32 states, sharded;
- FSDP working set: about two layers unsharded in the compute dtype (current + prefetch) plus
  one layer's unsharded float32 gradients before the reduce-scatter;
- activations saved for backward: per layer and token, counted tensor by tensor (norm outputs,
  q/k/v, rotated q/k, attention output, SwiGLU's four ``F``-wide tensors, residuals), divided
  by ``tp`` and ``cp``; attention probabilities ``B x H x S x S`` where SDPA runs its math
  kernel (CPU); selective checkpointing keeps the matmul outputs only, full keeps each layer's
  input (plus one layer recomputed); the logits and their gradient in float32.
The model's parameter counts come from the model itself, built on the meta device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the parent plans memory without importing torch
    import torch

from qwen3_trainium.schema import ACMode, RunConf

GiB = 2**30


@dataclass(frozen=True)
class ModelShape:
    params: int
    largest_layer: int
    n_layers: int
    dim: int
    q_dim: int
    kv_dim: int
    ffn: int  # per token: FFN width (dense) or top_k x expert width (MoE)
    n_heads: int
    n_kv_heads: int
    vocab: int
    num_experts: int


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
        ffn = (
            moe.router.top_k * moe.routed_experts.inner_experts.hidden_dim
            if moe
            else first.feed_forward.w1.out_features
        )
    else:  # HF backend config
        c = model_config
        heads, kv_heads = c.num_attention_heads, c.num_key_value_heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        dim, vocab, n_layers = c.hidden_size, c.vocab_size, c.num_hidden_layers
        experts = getattr(c, "num_experts", 0) or 0
        ffn = c.num_experts_per_tok * c.moe_intermediate_size if experts else c.intermediate_size
    params = largest = 0
    if model is not None:
        layers = list(model.layers.values() if hasattr(model.layers, "values") else model.layers)
        params = sum(p.numel() for p in model.parameters())
        largest = max(sum(p.numel() for p in layer.parameters()) for layer in layers)
    return ModelShape(
        params=params, largest_layer=largest, n_layers=n_layers, dim=dim,
        q_dim=heads * head_dim, kv_dim=kv_heads * head_dim, ffn=ffn, n_heads=heads,
        n_kv_heads=kv_heads, vocab=vocab, num_experts=experts,
    )  # fmt: skip


def _activation_elems_per_token(shape: ModelShape, ac: ACMode) -> float:
    h, q, kv, f = shape.dim, shape.q_dim, shape.kv_dim, shape.ffn
    saved_all = 4 * h + 3 * q + 3 * kv + 4 * f  # norms, residuals, q/k/v, rotated q/k, attn out, SwiGLU
    matmul_outputs = h + q + 2 * kv + 2 * f  # what selective checkpointing keeps
    return {ACMode.none: saved_all, ACMode.selective: matmul_outputs, ACMode.full: h}[ac] * shape.n_layers + (
        saved_all if ac is ACMode.full else 0
    )


def estimate(run: RunConf, shape: ModelShape, *, dp_shard: int, capacity: int | None) -> Estimate:
    par, train = run.parallel, run.training
    shard = max(dp_shard, 1) * par.context_parallel_degree
    split = shard * par.tensor_parallel_degree * par.pipeline_parallel_degree
    compute = 2 if train.mixed_precision_param.value == "bfloat16" else 4
    tokens = (
        train.local_batch_size * train.seq_len / (par.context_parallel_degree * par.tensor_parallel_degree)
    )
    stage_layers = shape.n_layers / par.pipeline_parallel_degree
    act = _activation_elems_per_token(shape, run.activation_checkpoint.mode) * stage_layers / shape.n_layers
    parts = {
        "parameters (fp32)": 4 * shape.params // split,
        "gradients (fp32)": 4 * shape.params // split,
        "AdamW states (fp32)": 8 * shape.params // split,
        "FSDP working set": (2 * compute + 4) * shape.largest_layer // par.tensor_parallel_degree,
        "activations": int(act * tokens * compute),
        "logits + grad (fp32)": int(
            2 * 4 * tokens * shape.vocab / (8 if run.model.path.value != "hf" else 1)
        ),
    }
    if run.device.type.value == "cpu":  # SDPA's math kernel materialises the attention matrix
        per_layer = (
            train.local_batch_size
            * shape.n_heads
            * train.seq_len**2
            * 2
            * compute
            / par.tensor_parallel_degree
        )
        saved_layers = stage_layers if run.activation_checkpoint.mode is ACMode.none else 1
        parts["attention matrices"] = int(per_layer * saved_layers)
    return Estimate(parts, capacity)
