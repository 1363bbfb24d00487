"""Make a torchtitan HF export a directory that drops in where its source was.

torchtitan's ``last_save_in_hf`` writes the weights only (safetensors, in the source's sharding when
``hf_assets_path`` holds an index, else one file). This adds the rest a user, Transformers or vLLM
expect: ``config.json`` (the source's own when there is one), ``generation_config.json``, the
tokenizer files with their chat template, and shards of at most ``checkpoint.hf_max_shard_size``
with ``model.safetensors.index.json``, as the Hub lays them out. Rank 0 runs it after the save.
"""

from __future__ import annotations

import json
import os
import shutil

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)
SOURCE_FILES = ("generation_config.json",)  # kept from the HF source, so the export drops in for it
INDEX_NAME = "model.safetensors.index.json"
SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def complete_hf_export(
    export_dir: str, config_json: str, tokenizer_dir: str, source_dir: str = "", chat_template: str = ""
) -> None:
    """Make a torchtitan HF export a directory ``from_pretrained`` loads on its own, in place of
    its source: config.json (the source's own when there is one), generation_config.json, and the
    tokenizer files with their chat template (``chat_template``: the text of the one the run
    trained through, when it is not the tokenizer's own: ``data.chat_template``)."""
    shutil.rmtree(os.path.join(export_dir, "sharded"), ignore_errors=True)
    if config_json:
        with open(os.path.join(export_dir, "config.json"), "w") as f:
            f.write(config_json)
    copies = [(tokenizer_dir, name) for name in TOKENIZER_FILES]
    copies += [(source_dir, name) for name in SOURCE_FILES if source_dir]
    for directory, name in copies:
        source = os.path.join(directory, name)
        if os.path.isfile(source):
            shutil.copy(source, os.path.join(export_dir, name))
    if chat_template:
        with open(os.path.join(export_dir, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(chat_template)


def parse_size(text: str) -> int:
    """``5GB`` -> 5e9 bytes (decimal units, as save_pretrained's max_shard_size; KiB/MiB/GiB binary)."""
    import re

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?I?B?)\s*", text.upper())
    if not match or match.group(2) not in SIZE_UNITS:
        raise ValueError(f"not a size: {text!r} (e.g. 5GB, 500MB, 2GiB)")
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2)])


ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "BF16": 2,
    "F16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


def reshard(export_dir: str, max_bytes: int) -> None:
    """Rewrite the export's safetensors as shards of at most ``max_bytes`` plus the index, as the
    Hub lays them out, when the export is larger than that (a tensor larger than it gets its own)."""
    import glob
    import math

    from safetensors import safe_open
    from safetensors.torch import save_file

    files = sorted(glob.glob(os.path.join(export_dir, "*.safetensors")))
    nbytes: dict[str, int] = {}
    home: dict[str, str] = {}
    for path in files:
        with safe_open(path, "pt") as f:
            for key in f.keys():
                view = f.get_slice(key)
                nbytes[key] = math.prod(view.get_shape()) * ITEMSIZE[view.get_dtype()]
                home[key] = path
    if sum(nbytes.values()) <= max_bytes:
        return
    groups: list[list[str]] = [[]]
    used = 0
    for key in sorted(nbytes):
        if groups[-1] and used + nbytes[key] > max_bytes:
            groups.append([])
            used = 0
        groups[-1].append(key)
        used += nbytes[key]
    staging = os.path.join(export_dir, ".reshard")
    os.makedirs(staging, exist_ok=True)
    weight_map = {}
    for i, group in enumerate(groups, 1):
        name = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        tensors = {}
        for key in group:
            with safe_open(home[key], "pt") as f:
                tensors[key] = f.get_tensor(key)
        save_file(tensors, os.path.join(staging, name), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(group, name)
    for path in files:
        os.remove(path)
    for name in os.listdir(staging):
        os.replace(os.path.join(staging, name), os.path.join(export_dir, name))
    os.rmdir(staging)
    index = {"metadata": {"total_size": sum(nbytes.values())}, "weight_map": weight_map}
    with open(os.path.join(export_dir, INDEX_NAME), "w") as f:
        json.dump(index, f, indent=2)
