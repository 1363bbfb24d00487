"""Pre-flight checks of the data group: directories, the tokenizer, Hub datasets offline."""

from __future__ import annotations

import json
import os

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent.preflight.model import model_vocab_size
from qwen3_trainium.parent.preflight.problem import Problem

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
    path = run.data.dataset_path
    chat = run.data.format.value != "text"  # a file, a directory or a cached Hub id: preflight/chat.py
    if path and os.path.isabs(path) and not os.path.isdir(path) and not chat:
        what = "is a file, not a directory" if os.path.isfile(path) else "does not exist"
        fix = (
            f"data.dataset_path={os.path.dirname(path)}"
            if os.path.isfile(path)
            else "data.dataset_path=<a directory of *.jsonl / *.txt>"
        )
        problems.append(Problem("data.dataset_path", path, what, fix))
    return problems


# data=local reads a directory with datasets.load_dataset(dir, split="train") (torchtitan
# hf_datasets/text_datasets.py, the c4_test loader), which takes every data file below it that
# is not hidden, and each record's "text" (_process_c4_text). The documented formats are checked
# here, reading at most SAMPLE_BYTES of each file; the others datasets reads are only listed.
CHECKED_SUFFIXES = (".jsonl", ".json", ".txt")
OTHER_SUFFIXES = (".parquet", ".csv", ".arrow")
SAMPLE_BYTES = 1 << 20
SAMPLED_RECORDS = 256  # JSON lines parsed per file
SAMPLED_FILES = 64  # a large corpus: its first files (sorted) stand for the rest
CORPUS_FIX = 'data.dataset_path=<a directory of *.jsonl / *.json records with a "text" field, or *.txt>'


def check_corpus(run: RunConf) -> list[Problem]:
    """A local corpus that would fail (or train on nothing) at the first batch: no data files, an
    unreadable or binary file, records without "text", no text at all. Each names the file."""
    path = run.data.dataset_path
    if not (path and os.path.isabs(path) and os.path.isdir(path)):
        return []  # check_data names a path that is not a directory
    files = _visible_files(path)
    data = [f for f in files if f.lower().endswith(CHECKED_SUFFIXES + OTHER_SUFFIXES)]
    if not data:
        what = f"{len(files)} file(s), none of them data" if files else "it is empty"
        return [Problem("data.dataset_path", path, f"no readable data files ({what})", CORPUS_FIX)]
    problems, texts = [], 0
    for file in data[:SAMPLED_FILES]:
        if not file.lower().endswith(CHECKED_SUFFIXES):
            texts += 1  # columns not checked here
            continue
        count, problem = _sample(file)
        texts += count
        if problem:
            problems.append(Problem("data.dataset_path", file, problem, CORPUS_FIX))
    if not problems and texts == 0:
        message = "the corpus is empty: no record with any text in " + ", ".join(
            os.path.basename(f) for f in data
        )
        problems.append(Problem("data.dataset_path", path, message, CORPUS_FIX))
    return problems


def _visible_files(path: str) -> list[str]:
    files = []
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        files += [os.path.join(root, name) for name in names if not name.startswith(".")]
    return sorted(files)


def _sample(file: str) -> tuple[int, str | None]:
    """(records with text in the file's first SAMPLE_BYTES, what is wrong with it or None)."""
    try:
        with open(file, "rb") as f:
            head = f.read(SAMPLE_BYTES + 1)
    except OSError as err:
        return 0, f"cannot be read ({err.strerror})"
    whole = len(head) <= SAMPLE_BYTES
    head = head[:SAMPLE_BYTES]
    if b"\0" in head:
        return 0, "a binary file (NUL bytes), not text"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        if whole or err.start < len(head) - 4:  # not just a character cut at the sample's end
            return 0, f"not UTF-8 text (byte {err.start})"
        text = head[: err.start].decode("utf-8")
    if file.lower().endswith(".txt"):
        return int(bool(text.strip())), None
    if text.lstrip().startswith("["):  # a .json list of records
        if not whole:
            return 1, None  # too large to parse here; datasets will
        try:
            records = json.loads(text)
        except json.JSONDecodeError as err:
            return 0, f"not valid JSON ({err.msg}, line {err.lineno})"
        return _records(records if isinstance(records, list) else [records], lambda i: f"record {i}")
    lines = text.splitlines()
    if not whole and lines:
        lines = lines[:-1]  # the sample may end inside a record
    lines = lines[:SAMPLED_RECORDS]
    parsed = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            parsed.append((number, json.loads(line)))
        except json.JSONDecodeError as err:
            return 0, f"line {number} is not a JSON record ({err.msg})"
    return _records([r for _, r in parsed], lambda i: f"line {parsed[i][0]}")


def _records(records: list, where) -> tuple[int, str | None]:
    for i, record in enumerate(records):
        if not isinstance(record, dict) or "text" not in record:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            return 0, f'{where(i)} has no "text" field (it has: {keys})'
        if not isinstance(record["text"], str):
            return 0, f'{where(i)}: "text" is {type(record["text"]).__name__}, not a string'
    return sum(1 for r in records if r["text"].strip()), None


def check_dataset_name(run: RunConf) -> list[Problem]:
    """data.dataset against torchtitan's registry (imports torchtitan)."""
    from torchtitan.hf_datasets.text_datasets import DATASETS

    if run.data.dataset.lower() in DATASETS:
        return []
    fix = f"one of {', '.join(sorted(DATASETS))}, or data=local data.dataset_path=<dir>"
    return [Problem("data.dataset", run.data.dataset, "not a torchtitan dataset name", fix)]


def _tokenizer_identity(directory: str) -> tuple[dict, dict]:
    """(vocabulary with added tokens, special tokens of tokenizer_config.json) of a tokenizer dir."""
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(os.path.join(directory, "tokenizer.json")).get_vocab(with_added_tokens=True)
    special = {}
    config = os.path.join(directory, "tokenizer_config.json")
    if os.path.isfile(config):
        with open(config) as f:
            special = {k: v for k, v in json.load(f).items() if k.endswith("_token")}
    return vocab, special


def check_tokenizer_matches(run: RunConf, notes: list[str]) -> list[Problem]:
    """A fine-tune from an HF directory must train on that model's tokenizer (or say it means not to)."""
    from qwen3_trainium.config.runconfig import checkpoint_tokenizer_dir

    assets, source = run.data.hf_assets_path, checkpoint_tokenizer_dir(run)
    why = "the checkpoint's own" if source == assets else "data.hf_assets_path"
    notes.append(f"tokenizer: {assets} ({why})")
    if source is None or source == assets or not os.path.isfile(os.path.join(assets, "tokenizer.json")):
        return []
    (theirs, their_special), (ours, our_special) = _tokenizer_identity(source), _tokenizer_identity(assets)
    if theirs == ours and their_special == our_special:
        return []
    what = (
        f"vocab {len(ours)} vs the checkpoint's {len(theirs)}" if theirs != ours else "special tokens differ"
    )
    message = f"not the tokenizer of {source} ({what}): the model would train and export on other token ids"
    if run.data.allow_other_tokenizer:
        notes.append(f"WARNING data.allow_other_tokenizer=true: {message}")
        return []
    fix = "leave data.hf_assets_path unset (the checkpoint's tokenizer), or data.allow_other_tokenizer=true if deliberate"
    return [Problem("data.hf_assets_path", assets, message, fix)]


def needs_hub(run: RunConf) -> bool:
    path = run.data.dataset_path
    return not (path and os.path.isabs(path)) and run.data.format.value == "text"


def hub_offline() -> bool:
    """True when the Hugging Face Hub is switched off or cannot be reached (``network.reachable``:
    bounded, the name lookup included)."""
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return True
    from qwen3_trainium.parent.preflight.network import reachable

    return reachable(os.environ.get("HF_ENDPOINT", "https://huggingface.co")) is not None


def _hub_cached(repo: str) -> bool:
    from qwen3_trainium.config.hub import cached_snapshot

    return cached_snapshot(repo, repo_type="dataset") is not None


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
