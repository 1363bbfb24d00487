"""Published model shapes written out by hand, for the memory and communication tests."""

from qwen3_trainium.memory.model_shape import ModelShape

# Qwen3-30B-A3B's shape (torchtitan's flavor; Hub config.json: 48 layers, 32 x 128 query heads,
# 4 KV heads, hidden 2048, 128 experts, top 8 of width 768), written out by hand
QWEN3_30B_A3B = ModelShape(
    params=30_532_122_624,
    largest_layer=0,
    n_layers=48,
    dim=2048,
    q_dim=32 * 128,
    kv_dim=4 * 128,
    ffn=8 * 768,
    n_heads=32,
    n_kv_heads=4,
    vocab=151_936,
    num_experts=128,
    top_k=8,
    expert_width=768,
)
