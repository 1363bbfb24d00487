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

# huggingface.co/Qwen/Qwen3-4B-Instruct-2507/blob/main/config.json (the values that shape the model)
QWEN3_4B_INSTRUCT_2507 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2560,
    "initializer_range": 0.02,
    "intermediate_size": 9728,
    "max_position_embeddings": 262144,
    "max_window_layers": 36,
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 5000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
BF16 = 2


def hf_tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor ``save_pretrained`` writes for this config (tied lm_head left out)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        shapes.pop("lm_head.weight", None)
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


def write_hub_model(directory: Path, config: dict, shards: int, tokenizer_dir: Path) -> Path:
    """``directory`` as the Hub lays it out: config.json, N shards + index, tokenizer files."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    names = list(hf_tensor_shapes(config).items())
    per_shard = -(-len(names) // shards)
    weight_map, total = {}, 0
    for i in range(shards):
        part = dict(names[i * per_shard : (i + 1) * per_shard])
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        total += write_sparse_safetensors(directory / file, part)
        weight_map |= dict.fromkeys(part, file)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    for source in tokenizer_dir.glob("*.json"):
        shutil.copy(source, directory / source.name)
    return directory
