"""Pre-flight checks of the data group: directories, the tokenizer, Hub datasets offline."""

from __future__ import annotations

import json
import os
import socket

from qwen3_trainium.preflight.model import model_vocab_size
from qwen3_trainium.preflight.problem import Problem
from qwen3_trainium.schema import RunConf

STREAMED_DATASETS = ("c4", "c4_validation")  # torchtitan streams these: no offline cache


def check_data(run: RunConf) -> list[Problem]:
    problems = []
    assets = run.data.hf_assets_path
    if not os.path.isfile(os.path.join(assets, "tokenizer.json")):
        problems.append(
            Problem(
                "data.hf_assets_path",
                assets,
                "no tokenizer.json in this directory",
                "point data.hf_assets_path at a directory with tokenizer.json (and tokenizer_config.json)",
            )
        )
    from torchtitan.hf_datasets.text_datasets import DATASETS

    if run.data.dataset.lower() not in DATASETS:
        fix = f"one of {', '.join(sorted(DATASETS))}, or data=local data.dataset_path=<dir>"
        problems.append(Problem("data.dataset", run.data.dataset, "not a torchtitan dataset name", fix))
    path = run.data.dataset_path
    if path and os.path.isabs(path) and not os.path.isdir(path):
        what = "is a file, not a directory" if os.path.isfile(path) else "does not exist"
        fix = (
            f"data.dataset_path={os.path.dirname(path)}"
            if os.path.isfile(path)
            else "data.dataset_path=<a directory of *.jsonl / *.txt>"
        )
        problems.append(Problem("data.dataset_path", path, what, fix))
    return problems


def needs_hub(run: RunConf) -> bool:
    path = run.data.dataset_path
    return not (path and os.path.isabs(path))


def hub_offline() -> bool:
    """True when the Hugging Face Hub is switched off or cannot be reached (5 s probe)."""
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return True
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or ""
    try:
        socket.create_connection((host, 443), timeout=5).close()
    except OSError:
        return True
    return False


def _hub_cached(repo: str) -> bool:
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(repo, repo_type="dataset", local_files_only=True)
    except Exception:  # LocalEntryNotFoundError and friends: not in the cache
        return False
    return True


def check_hub_dataset(run: RunConf) -> list[Problem]:
    from torchtitan.hf_datasets.text_datasets import DATASETS

    name = run.data.dataset.lower()
    repo = run.data.dataset_path or DATASETS[name].path
    streamed = name in STREAMED_DATASETS and not run.data.dataset_path
    if (streamed or not _hub_cached(repo)) and hub_offline():
        return [
            Problem(
                "data.dataset", repo,
                "a Hugging Face Hub dataset that is not in the local cache, and the Hub cannot be reached from here",
                f"download it where there is network (hf download --repo-type dataset {repo} --local-dir ./assets/data) "
                "and run with data=local data.dataset_path=./assets/data",
            )
        ]  # fmt: skip
    return []


def check_tokenizer_fits(run: RunConf) -> list[Problem]:
    tokenizer = os.path.join(run.data.hf_assets_path, "tokenizer.json")
    if not os.path.isfile(tokenizer):
        return []
    with open(tokenizer) as f:
        data = json.load(f)
    ids = list(data["model"]["vocab"].values()) + [t["id"] for t in data.get("added_tokens", [])]
    vocab = max(ids) + 1
    model_vocab = model_vocab_size(run)
    if vocab <= model_vocab:
        return []
    message = f"the tokenizer has {vocab} ids but the model ({run.model.flavor}) has vocab_size {model_vocab}"
    return [
        Problem(
            "data.hf_assets_path",
            run.data.hf_assets_path,
            message,
            "use the model's own tokenizer, or a larger flavor",
        )
    ]
