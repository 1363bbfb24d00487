"""An HF ``config.json`` read the way Transformers reads it, and compared with a flavor.

``transformers.AutoConfig`` parses the file, so attribute maps apply (``num_local_experts`` is
``num_experts`` for Qwen3-MoE as Transformers 5 saves it; ``rope_theta`` lives in
``rope_parameters``, YaRN's keys with it: a YaRN checkpoint never matches a default-RoPE flavor).
In Qwen3-MoE's config, ``intermediate_size`` is a dense MLP's width, unused
when every layer is sparse; the experts' width is ``moe_intermediate_size``.
"""

from __future__ import annotations

import math

COMMON = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "tie_word_embeddings", "rope_theta",
)  # fmt: skip
ROPE = ("rope_type", "rope_factor", "rope_original_max_position_embeddings")  # YaRN's shape of RoPE
DENSE = ("intermediate_size",)
MOE = ("moe_intermediate_size", "num_experts", "num_experts_per_tok", "norm_topk_prob")


def load(hf_dir: str):
    """``AutoConfig`` of a local HF model directory (never the network)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(hf_dir, local_files_only=True)


def is_moe(cfg) -> bool:
    return int(getattr(cfg, "num_experts", 0) or 0) > 0


def rope_theta(cfg) -> float | None:
    params = getattr(cfg, "rope_parameters", None) or {}
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return theta if theta is not None else getattr(cfg, "rope_theta", None)


def published_fields(cfg) -> dict:
    """The fields that define the model's shape and math, from a parsed config."""
    values = {key: getattr(cfg, key, None) for key in COMMON + (MOE if is_moe(cfg) else DENSE)}
    values["head_dim"] = values["head_dim"] or cfg.hidden_size // cfg.num_attention_heads
    values["rope_theta"] = rope_theta(cfg)
    params = getattr(cfg, "rope_parameters", None) or {}
    return values | _rope(
        params.get("rope_type", "default"),
        params.get("factor"),
        params.get("original_max_position_embeddings"),
    )


def _rope(rope_type: str, factor, original) -> dict:
    scaled = rope_type != "default"
    return dict(zip(ROPE, (rope_type, factor if scaled else None, original if scaled else None), strict=True))


def unsupported(cfg) -> list[tuple[str, object, str]]:
    """(field, value, why) for an MoE layout this code cannot represent."""
    if not is_moe(cfg):
        return []
    found = []
    if getattr(cfg, "decoder_sparse_step", 1) != 1:
        found.append(
            ("decoder_sparse_step", cfg.decoder_sparse_step, "dense layers mixed in between MoE layers")
        )
    if getattr(cfg, "mlp_only_layers", None):
        found.append(
            ("mlp_only_layers", list(cfg.mlp_only_layers), "dense layers mixed in between MoE layers")
        )
    if getattr(cfg, "shared_expert_intermediate_size", 0):
        found.append(
            ("shared_expert_intermediate_size", cfg.shared_expert_intermediate_size, "shared experts")
        )
    return found


def flavor_fields(model_config) -> dict:
    """The same fields for a torchtitan Qwen3 model config (dense or MoE)."""
    first = model_config.layers[0]
    attn, moe = first.attention, getattr(first, "moe", None)
    values = {
        "vocab_size": model_config.vocab_size,
        "hidden_size": model_config.dim,
        "num_hidden_layers": len(model_config.layers),
        "num_attention_heads": attn.n_heads,
        "num_key_value_heads": attn.n_kv_heads or attn.n_heads,
        "head_dim": attn.head_dim or model_config.dim // attn.n_heads,
        "tie_word_embeddings": model_config.enable_weight_tying,
        "rope_theta": attn.rope.theta,
    }
    rope = attn.rope
    yarn = rope.scaling == "yarn" and rope.rope_factor > 1.0  # torchtitan CosSinRoPE's own condition
    values |= _rope("yarn" if yarn else "default", rope.rope_factor, rope.original_seq_len)
    if moe is None:
        return values | {"intermediate_size": first.feed_forward.w1.out_features}
    return values | {
        "moe_intermediate_size": moe.routed_experts.inner_experts.hidden_dim,
        "num_experts": moe.num_experts,
        "num_experts_per_tok": moe.router.top_k,
        "norm_topk_prob": moe.router.route_norm,
    }


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b) and b is not None
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b))
    return a == b


def differences(flavor: dict, published: dict) -> list[str]:
    """``key: flavor X, config.json Y`` for every field that differs (or only one side has)."""
    keys = list(flavor) + [k for k in published if k not in flavor]
    return [
        f"{key}: flavor {flavor.get(key)}, config.json {published.get(key)}"
        for key in keys
        if not _same(flavor.get(key), published.get(key))
    ]


def matching_flavor(cfg) -> str | None:
    """The flavor whose fields equal this config's, if one does."""
    from qwen3_trainium.config import flavors

    published = published_fields(cfg)
    for name in flavors.all_flavors():
        if not differences(flavor_fields(flavors.model_spec(name, "flex").model), published):
            return name
    return None
