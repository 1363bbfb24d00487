"""What decides which rows a data-parallel rank reads: saved with each checkpoint, and checked
when a run resumes, by pre-flight before any process starts and by each rank as it loads.

A checkpoint's data state is a position in a stream (an epoch, a record, samples read but not yet
placed). It means the same rows only if everything that made the stream is the same: the records
and which of them train, the tokenizer, the chat template, the masks, ``seq_len``, packing and
the seed of the order. Each stream saves those as its ``identity`` beside its position (a dict of
strings and numbers, pickled with the rest of torchtitan's dataloader state); a resume whose
identity differs is refused, naming the key that changed, the value the checkpoint was written
with and ours, and the fix. A state with no identity (written before this check) is accepted:
there is nothing to compare.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass

# identity field -> the config key that sets it (the order is the order of the messages)
KEYS = {
    "records": "data.dataset_path",
    "held_out": "eval.enable",  # with data.validation_fraction: which records training skips
    "tokenizer": "data.hf_assets_path",
    "template": "data.chat_template",
    "chat_template_kwargs": "data.chat_template_kwargs",
    "loss_on": "data.loss_on",
    "history_thinking": "data.history_thinking",
    "overflow": "data.overflow",
    "seq_len": "training.seq_len",
    "packing": "data.packing",
    "seed": "debug.seed",
    "masks": "objective.kind",  # objective=dpo's rows: TRL's completion rule (data/preference/masks.py)
}
SETTABLE = ("seq_len", "packing", "seed", "loss_on", "history_thinking", "overflow", "chat_template_kwargs")


@functools.lru_cache(maxsize=32)
def _file_digest(path: str, size: int, mtime_ns: int, content: bool) -> str:
    h = hashlib.sha256()
    if content:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    else:
        h.update(str(size).encode())
    return h.hexdigest()


CONTENT_BYTES = 1 << 30  # data up to this size is fingerprinted by its bytes; larger, by sizes


def files(paths: list[str], root: str | None = None) -> str:
    """A fingerprint of data files: their names below ``root`` (a moved dataset is the same one)
    and their bytes; past ``CONTENT_BYTES`` in all, their sizes (a pretraining corpus is not read
    twice at every start: an edit that keeps every file's size is then not seen)."""
    stats = [os.stat(p) for p in paths]
    total = sum(st.st_size for st in stats)
    content = total <= CONTENT_BYTES
    h = hashlib.sha256()
    for path, st in zip(paths, stats, strict=True):
        name = os.path.relpath(path, root) if root and os.path.isdir(root) else os.path.basename(path)
        h.update(f"{name}\0{_file_digest(path, st.st_size, st.st_mtime_ns, content)}\0".encode())
    what = "bytes" if content else "names and sizes"
    return f"{len(paths)} files, {total} bytes, sha256 of {what} {h.hexdigest()[:16]}"


def text(value: str) -> str:
    return "sha256 " + hashlib.sha256(value.encode()).hexdigest()[:16]


def tokenizer(directory: str) -> str:
    """The tokenizer files that decide token ids (``tokenizer.json`` and its config)."""
    names = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
    found = [os.path.join(directory, n) for n in names if os.path.isfile(os.path.join(directory, n))]
    return files(found, directory)


@dataclass(frozen=True)
class Change:
    field: str
    saved: object
    ours: object

    @property
    def key(self) -> str:
        return KEYS.get(self.field, self.field)

    def line(self) -> str:
        return f"{self.key}: {self.saved!r} when the checkpoint was written, {self.ours!r} now"


def changes(saved: dict | None, ours: dict) -> list[Change]:
    """The identity fields that differ (a field either side lacks is not compared)."""
    if not saved:
        return []
    return [Change(f, saved[f], ours[f]) for f in KEYS if f in saved and f in ours and saved[f] != ours[f]]


def _hydra(value) -> str:
    """A value as a command-line override writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_hydra(v)}" for k, v in value.items()) + "}"
    return str(value)


def fix(change: Change, step_dir: str = "<its step folder>") -> str:
    restart = f"a new run directory with checkpoint.initial_load_path={step_dir} (its weights, the new data)"
    if change.field in SETTABLE:
        return f"{change.key}={_hydra(change.saved)} to resume it, or {restart}"
    if change.field == "held_out":
        written = f"training skipped: {change.saved}"
        return (
            f"eval.enable / data.validation_fraction as it was written ({written}) to resume it, or {restart}"
        )
    return f"the {change.key} it was written with, to resume it, or {restart}"


def check(saved: dict | None, ours: dict) -> None:
    """A rank's own check as it loads a checkpoint's data state (pre-flight's runs first)."""
    found = changes(saved, ours)
    if found:
        raise ValueError(
            "the checkpoint was written reading other data rows; resuming would read other rows than "
            "the run it continues: " + "; ".join(c.line() for c in found) + ". Fix: " + fix(found[0])
        )
