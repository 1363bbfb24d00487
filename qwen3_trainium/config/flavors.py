"""Qwen3 model specs: torchtitan's flavors plus two for CPU: ``tiny`` (3.3M-parameter dense
Qwen3) and ``tiny_moe`` (the same with 8-expert top-2 MoE layers).

``tiny`` is built with torchtitan's public per-layer builders, so it is the same Qwen3
architecture (GQA with QK-norm, SwiGLU, CosSinRoPE, tied embeddings) at a size where a
10-step smoke run takes seconds on a laptop CPU.
"""

from __future__ import annotations

from functools import partial

TINY_FLAVORS = ("tiny", "tiny_moe")
MOE_FLAVORS = ("tiny_moe", "debugmodel_moe", "30B-A3B", "235B-A22B", "235B-A22B-2507")


def grouped_mm_route(path: str, flavor: str) -> bool:
    """model=native with a MoE flavor: torchtitan's own experts on ``torch._grouped_mm``, AWS's MoE
    route from Neuron SDK 2.34 (``config/neuron_sdk.py``)."""
    return path == "native" and flavor in MOE_FLAVORS


# Flavors of published checkpoints whose RoPE base differs from torchtitan's flavor of that shape
# (the config.json on the Hub): name -> (torchtitan flavor, rope_theta).
# - Qwen/Qwen3-235B-A22B has rope_theta 1e6; torchtitan's "235B-A22B" uses 5e6, the value of the
#   2507 releases, so the original checkpoint would train on the wrong RoPE.
# - Qwen/Qwen3-4B-Instruct-2507 (the guide's example) is the 4B shape with rope_theta 5e6.
PUBLISHED_FLAVORS = {
    "235B-A22B": ("235B-A22B", 1e6),
    "235B-A22B-2507": ("235B-A22B", 5e6),
    "4B-Instruct-2507": ("4B", 5e6),
}
# The tiny flavor's dimensions; make_assets saves an HF Qwen3 of the same shape for model=hf.
# max_seq_len is every published Qwen3's max_position_embeddings, 40960 (Qwen3-8B, Qwen3-30B-A3B
# config.json, tests/support/published_configs.py), as torchtitan 0.3.0's real Qwen3 flavors.
TINY_DIMS = dict(
    vocab=512, dim=256, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=64, hidden=768,
    max_seq_len=40960, rope_theta=1e6,
)  # fmt: skip
QWEN3_TABLE = 40960  # torchtitan 0.3.0 models/qwen3/__init__.py: every Qwen3 flavor but debugmodel*
DEBUG_TABLE = 4096  # torchtitan's debugmodel and debugmodel_moe
# tiny_moe: the same attention, every layer an MoE of 8 experts, top-2 (Qwen3-MoE routing).
TINY_MOE_DIMS = dict(num_experts=8, top_k=2, moe_hidden=256)


def titan_flavors() -> tuple[str, ...]:
    from torchtitan.models.qwen3 import qwen3_configs

    return tuple(qwen3_configs)


def all_flavors() -> tuple[str, ...]:
    return TINY_FLAVORS + titan_flavors() + tuple(k for k in PUBLISHED_FLAVORS if k not in titan_flavors())


def rope_table(flavor: str) -> int:
    """The flavor's RoPE table size (its max_position_embeddings) without importing torchtitan;
    tests/models/test_rope_config.py holds it against every flavor's built spec."""
    if flavor in TINY_FLAVORS:
        return TINY_DIMS["max_seq_len"]
    return DEBUG_TABLE if flavor.startswith("debugmodel") else QWEN3_TABLE


def default_flavor(device_type: str, moe: bool = False) -> str:
    if device_type == "cpu":
        return "tiny_moe" if moe else "tiny"
    return "30B-A3B" if moe else "0.6B"


def _tiny(attn_backend: str, moe: bool = False):
    import torch.nn as nn
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    from torchtitan.models.common.config_utils import (
        get_attention_config,
        make_ffn_config,
        make_gqa_config,
        make_moe_config,
        make_routed_experts_config,
        make_router_config,
    )
    from torchtitan.models.common.nn_modules import RMSNorm
    from torchtitan.models.common.param_init import skip_param_init
    from torchtitan.models.qwen3 import Qwen3Model
    from torchtitan.models.qwen3.model import Qwen3TransformerBlock

    d = TINY_DIMS
    vocab, dim, n_layers, n_heads, n_kv_heads, head_dim, hidden = (
        d["vocab"], d["dim"], d["n_layers"], d["n_heads"], d["n_kv_heads"], d["head_dim"], d["hidden"]
    )  # fmt: skip
    linear_init = {"weight": partial(nn.init.normal_, std=0.02), "bias": nn.init.zeros_}

    def norm(size: int) -> RMSNorm.Config:
        return RMSNorm.Config(normalized_shape=size, eps=1e-6, param_init={"weight": nn.init.ones_})

    def block() -> Qwen3TransformerBlock.Config:
        return Qwen3TransformerBlock.Config(
            attention_norm=norm(dim),
            ffn_norm=norm(dim),
            attention=make_gqa_config(
                dim=dim,
                n_heads=n_heads,
                n_kv_heads=n_kv_heads,
                head_dim=head_dim,
                wqkv_param_init=linear_init,
                wo_param_init=linear_init,
                inner_attention=get_attention_config(attn_backend),
                fuse_qkv=True,
                rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=d["max_seq_len"], theta=d["rope_theta"]),
                qk_norm=norm(head_dim),
            ),
            **({"moe": moe_layer()} if moe else {"feed_forward": ffn_layer()}),
        )

    def ffn_layer():
        return make_ffn_config(
            dim=dim, hidden_dim=hidden, w1_param_init=linear_init, w2w3_param_init=linear_init
        )

    def moe_layer():
        m = TINY_MOE_DIMS
        experts_init = {name: linear_init["weight"] for name in ("w1_EFD", "w2_EDF", "w3_EFD")}
        router = make_router_config(
            dim=dim, num_experts=m["num_experts"], gate_param_init=linear_init,
            top_k=m["top_k"], score_func="softmax", route_norm=True,
        )  # fmt: skip
        routed = make_routed_experts_config(
            dim=dim, hidden_dim=m["moe_hidden"], num_experts=m["num_experts"], top_k=m["top_k"],
            param_init=experts_init, comm_backend="standard",
        )  # fmt: skip
        return make_moe_config(num_experts=m["num_experts"], router=router, routed_experts=routed)

    return Qwen3Model.Config(
        vocab_size=vocab,
        dim=dim,
        norm=norm(dim),
        enable_weight_tying=not moe,  # like torchtitan's MoE flavors
        tok_embeddings=Embedding.Config(
            num_embeddings=vocab,
            embedding_dim=dim,
            param_init={"weight": skip_param_init if not moe else linear_init["weight"]},
        ),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=linear_init),
        layers=[block() for _ in range(n_layers)],
    )


def model_spec(flavor: str, titan_attn_backend: str):
    """torchtitan ``ModelSpec`` for a flavor; ``titan_attn_backend`` is flex or varlen."""
    from torchtitan.models.qwen3 import model_registry

    if flavor in PUBLISHED_FLAVORS:
        base, theta = PUBLISHED_FLAVORS[flavor]
        spec = model_registry(base, attn_backend=titan_attn_backend)
        spec.flavor = flavor
        for layer in spec.model.layers:
            layer.attention.rope.theta = theta
        return spec
    if flavor not in TINY_FLAVORS:
        return model_registry(flavor, attn_backend=titan_attn_backend)
    spec = model_registry("debugmodel", attn_backend=titan_attn_backend)
    spec.flavor = flavor
    spec.model = _tiny(titan_attn_backend, moe=flavor in MOE_FLAVORS)
    return spec


def vocab_size(flavor: str) -> int:
    if flavor in TINY_FLAVORS:
        return TINY_DIMS["vocab"]
    from torchtitan.models.qwen3 import qwen3_configs

    return qwen3_configs[PUBLISHED_FLAVORS.get(flavor, (flavor,))[0]]("flex").vocab_size
