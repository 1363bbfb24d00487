"""What grows with the sequence, for the estimate (``estimate.py``): attention's own buffers
(context parallel's gathered K/V, the document mask, the probabilities CPU kernels keep),
torchtitan's RoPE cache, and the grouped MoE route's routed tokens. Each function is bytes per
rank; ``estimate.py`` adds them to its parts."""

from __future__ import annotations

from qwen3_trainium.config.schema import ACMode, RunConf
from qwen3_trainium.memory.model_shape import ModelShape


def moe_routed_bytes(shape: ModelShape, tokens: int, compute: int) -> int:
    """The routed ``[T x top_k, dim]`` tensors of the MoE layer in backward (``model=native``'s
    grouped route: torchtitan's ``LocalTokenDispatcher``). ``T`` is every token of the rank's
    sequence shard: under tensor parallel the MoE runs on the sequence-parallel tokens gathered
    (``moe.py``: input "redistributed from sp_layout"). Per element: the routed input and output
    in the compute dtype, the float32 copy ``combine`` multiplies by the scores (and saves), and
    in backward the float32 gradients of that product and of the copy, and the compute-dtype
    gradient: ``3 x compute + 3 x 4`` bytes (18 in bfloat16; the 30B-A3B trace's peak at 32,768
    tokens holds four 2 GiB float32 and a 1 GiB bfloat16 ``[262,144, 2,048]``, 2026-12-06)."""
    return tokens * shape.top_k * shape.dim * (3 * compute + 12)


def attention_parts(run: RunConf, shape: ModelShape, compute: int, layers: float) -> dict[str, int]:
    """Attention's own memory per rank, on the queries this rank holds (``S / cp``).
    - Context parallel all-gathers K/V across the group (the document SDPA's CP): the full
      ``[B, S, kv_heads / tp, head_dim]`` K and V in every layer whose inputs are saved, and their
      gradients before the reduce-scatter in the layer in backward.
    - The document SDPA (``attn_backend=sdpa``) builds a boolean ``[B, 1, S, S]`` mask in each
      layer, which the kernel's backward reads again; under CP one ``[B, 1, S / cp, S]`` mask for
      the rank's queries, boolean and in the compute dtype (``ContextParallelMask.additive``,
      ``models/context_parallel.py``: made once per step, passed to every layer's SDPA).
    - The probabilities ``B x H / tp x S / cp x S``: on CPU only (torch's CPU kernels, which the
      estimate takes at their worst, the math kernel). A device keeps the output and a
      log-sum-exp per query row (flash attention: ``memory/flash.py`` says what is known and
      what is assumed for Neuron), a few bytes per token already counted with the activations.
    Without checkpointing every layer holds them; with it, the layer being recomputed."""
    par, train, ac = run.parallel, run.training, run.activation_checkpoint.mode
    batch, seq, cp, tp = (
        train.local_batch_size,
        train.seq_len,
        par.context_parallel_degree,
        par.tensor_parallel_degree,
    )
    alive = layers if ac is ACMode.none else 1
    rows = seq // cp
    parts: dict[str, int] = {}
    if cp > 1:
        kv = 2 * batch * seq * shape.kv_dim / tp * compute
        parts["CP gathered K/V (+ grad)"] = int(kv * alive + kv)
    if cp > 1:  # the rank's one mask, boolean and its float form, made once per step, read by every layer
        parts["CP mask (bool + float)"] = batch * rows * seq * (1 + compute)
    elif run.model.attn_backend.value == "sdpa":  # each layer builds its own
        parts["attention mask (bool)"] = int(batch * rows * seq * alive)
    if run.device.type.value == "cpu":
        heads = shape.n_heads / tp
        parts["attention matrices"] = int(batch * heads * rows * seq * 2 * compute * alive)
    return parts


def rope_table_bytes(run: RunConf, shape: ModelShape) -> int:
    """torchtitan's RoPE cache: ``[seq_len, 2 x head_dim]`` cos and sin in float32, one per
    attention layer (``CosSinRoPE._precompute_cache``, a non-persistent buffer of each layer's
    ``RoPE`` module; ``Decoder.update_from_config`` rebuilds it at ``training.seq_len``), on every
    rank: nothing shards it. The HF path computes cos/sin per step from ``inv_freq`` instead."""
    if run.model.path.value == "hf":
        return 0
    layers = shape.n_layers / run.parallel.pipeline_parallel_degree
    return int(layers * run.training.seq_len * 2 * shape.head_dim * 4)


def tp_gathered_bytes(run: RunConf, shape: ModelShape, tokens: int, compute: int) -> int:
    """Tensor parallel's full-sequence tensors in the layer in backward: sequence parallel keeps
    ``S / tp`` tokens between layers, but the column-parallel matmuls (attention's q/k/v, the
    FFN's w1/w3) take the all-gathered ``[B x S / cp, dim]`` input and save it, and the
    row-parallel ones (wo, w2) hand backward a full-sequence gradient before its reduce-scatter:
    three ``[T, dim]`` tensors in the compute dtype (1 GiB each for Qwen3-8B at 131,072 tokens,
    the largest tensors of that trace's peak, 2026-12-06). None without tensor parallel."""
    if run.parallel.tensor_parallel_degree == 1:
        return 0
    return 3 * tokens * shape.dim * compute
