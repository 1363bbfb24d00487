"""HF model directories laid out as the Hub publishes them, without the gigabytes.

``config.json`` holds the published values; the weights are the Hub's sharded safetensors with
``model.safetensors.index.json``, every tensor named and shaped as ``save_pretrained`` writes it
(bf16), in sparse files: the headers are real, the data is holes. Pre-flight reads headers only.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

BF16 = 2


def hf_tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor name and shape of a published Qwen3 / Qwen3-MoE checkpoint (the Hub's names:
    per-expert ``mlp.experts.{e}.{gate,up,down}_proj`` and ``mlp.gate`` for MoE; no ``lm_head``
    when the embeddings are tied)."""
    h, v = config["hidden_size"], config["vocab_size"]
    d = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (v, h)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}"
        shapes |= {
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (q, h),
            f"{p}.self_attn.k_proj.weight": (kv, h),
            f"{p}.self_attn.v_proj.weight": (kv, h),
            f"{p}.self_attn.o_proj.weight": (h, q),
            f"{p}.self_attn.q_norm.weight": (d,),
            f"{p}.self_attn.k_norm.weight": (d,),
        }
        if config.get("num_experts"):
            width = config["moe_intermediate_size"]
            shapes[f"{p}.mlp.gate.weight"] = (config["num_experts"], h)
            for e in range(config["num_experts"]):
                shapes |= {
                    f"{p}.mlp.experts.{e}.gate_proj.weight": (width, h),
                    f"{p}.mlp.experts.{e}.up_proj.weight": (width, h),
                    f"{p}.mlp.experts.{e}.down_proj.weight": (h, width),
                }
        else:
            width = config["intermediate_size"]
            shapes |= {
                f"{p}.mlp.gate_proj.weight": (width, h),
                f"{p}.mlp.up_proj.weight": (width, h),
                f"{p}.mlp.down_proj.weight": (h, width),
            }
    shapes["model.norm.weight"] = (h,)
    if not config.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (v, h)
    return shapes


def write_sparse_safetensors(path: Path, shapes: dict[str, tuple[int, ...]]) -> int:
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = math.prod(shape) * BF16
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        f.truncate(8 + len(blob) + offset)
    return offset


GENERATION_CONFIG = {  # Qwen3 dense checkpoints' generation_config.json on the Hub
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
    "transformers_version": "4.51.0",
}


def write_hub_model(directory: Path, config: dict, shards: int, tokenizer_dir: Path) -> Path:
    """``directory`` as the Hub lays it out: config.json, generation_config.json, N shards + index
    (one file and no index when ``shards`` is 1, as for Qwen3-0.6B), tokenizer files."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=4))
    names = list(hf_tensor_shapes(config).items())
    if shards == 1:
        write_sparse_safetensors(directory / "model.safetensors", dict(names))
        names = []
    per_shard = -(-len(names) // shards)
    weight_map, total = {}, 0
    for i in range(shards if names else 0):
        part = dict(names[i * per_shard : (i + 1) * per_shard])
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        total += write_sparse_safetensors(directory / file, part)
        weight_map |= dict.fromkeys(part, file)
    if weight_map:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    for source in tokenizer_dir.glob("*.json"):
        shutil.copy(source, directory / source.name)
    return directory
