"""The directory the docs' commands assume, as a user would have it: HF directories of the Hub's
layout (fake weights) under ./assets/hf, ./my_chats.jsonl, ./my_chats/, ./my_corpus/, and
HUB_DATASET in a local Hugging Face cache (``hf_cache/hub``, its splits named as the Hub names
them)."""

from __future__ import annotations

import shutil
from pathlib import Path

from qwen3_trainium.config import runconfig
from tests.support import hub_layout
from tests.support.published_configs import PUBLISHED

HUB_DATASET = "HuggingFaceH4/ultrachat_200k"
MODELS = (("Qwen3-0.6B", 1), ("Qwen3-4B-Instruct-2507", 3), ("Qwen3-8B", 5), ("Qwen3-30B-A3B", 16))


def write_user_dir(root: Path) -> Path:
    """``root`` holding what the docs' commands name; returns it."""
    tokenizer = runconfig.ASSETS_DIR / "tokenizer"
    for name, shards in MODELS:
        directory = root / "assets" / "hf" / name
        hub_layout.write_hub_model(
            directory, PUBLISHED[f"Qwen/{name}"][3], shards=shards, tokenizer_dir=tokenizer
        )
        shutil.copy(tokenizer / "chat_template.jinja", directory)  # the Hub's Qwen3 repos carry one
    chats = runconfig.ASSETS_DIR / "chat_corpus"
    shutil.copy(chats / "train.jsonl", root / "my_chats.jsonl")
    shutil.copytree(chats, root / "my_chats")
    shutil.copytree(runconfig.ASSETS_DIR / "corpus", root / "my_corpus")
    _hub_dataset(hub_cache_dir(root), chats / "train.jsonl")
    return root


def hub_cache_dir(root: Path) -> Path:
    return root / "hf_cache" / "hub"


def use_hub_cache(root: Path, monkeypatch) -> None:
    """Point huggingface_hub at ``root``'s cache (the constant is read at import)."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache_dir(root)))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache_dir(root)))


def _hub_dataset(cache: Path, records: Path) -> None:
    """HUB_DATASET in the Hub cache's layout, its splits named as the Hub names them."""
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    org, name = HUB_DATASET.split("/")
    commit = "0" * 40
    base = cache / f"datasets--{org}--{name}"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    data = base / "snapshots" / commit / "data"
    data.mkdir(parents=True)
    table = pj.read_json(records)
    for split, rows in (("train_sft", table.slice(0, 500)), ("test_sft", table.slice(500))):
        pq.write_table(rows, data / f"{split}-00000-of-00001.parquet")
