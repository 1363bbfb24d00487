"""Held-out data for ``eval=on``: what torchtitan's ``Validator`` reads, and what training skips.

Which records are held out, in this order:
1. ``data.validation_path``: every record of that file or directory; the training stream is
   unchanged (the user keeps the two apart).
2. The corpus directory's own validation split: a file whose name says so (``validation.jsonl``,
   ``valid.txt``, ``dev.jsonl``, ...), as ``datasets`` infers splits from file names
   (``datasets.get_dataset_split_names``). The training stream already reads only the ``train``
   split (torchtitan's ``c4_test`` loader: ``load_dataset(path, split="train")``), so it never
   sees them. The shipped corpus has one (``validation.jsonl``, ``make_assets.py``).
3. A local corpus without one: record ``i`` is held out when ``floor((i+1) f) > floor(i f)``,
   ``f = data.validation_fraction`` (exactly ``floor(n f)`` records, evenly spread, the same
   ones in every process), and the training stream skips exactly those.
4. A Hub dataset: its ``validation`` split (``c4``: torchtitan's own ``c4_validation``).

The loaders are entries of torchtitan's dataset registry (``DATASETS``,
``torchtitan/hf_datasets/text_datasets.py``: "Add your dataset here"), so torchtitan's own
``HuggingFaceTextDataset`` reads them (through ``data/text.py``), in the training loop and in the
``Validator``, where each data-parallel rank reads its share once and then padding.
``register`` adds the ones a run uses, in the parent and in every rank (``data/loaders.py``).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

VALIDATION_DATASET = "q3t_validation_split"  # the corpus directory's validation split
FILES_DATASET = "q3t_files"  # every record of data.validation_path
HUB_VALIDATION_DATASET = "q3t_hub_validation"  # a Hub dataset's validation split (streamed)
TRAIN_PREFIX = "q3t_train_without_"  # + fraction: the train split less the held-out records
HELDOUT_PREFIX = "q3t_heldout_"  # + fraction: the held-out records of the train split
STREAMED = {"c4": "c4_validation"}  # torchtitan's Hub datasets with a validation twin


@dataclass(frozen=True)
class Source:
    kind: str  # "path", "split", "fraction", "hub"
    train_dataset: str
    train_path: str | None
    val_dataset: str
    val_path: str | None

    def describe(self, fraction: float) -> str:
        where = self.val_path or self.val_dataset
        return {
            "path": f"every record of data.validation_path ({where})",
            "split": f"the corpus's validation split ({where})",
            "fraction": f"{fraction:g} of the corpus's records ({where}), which training skips",
            "hub": f"the Hub dataset's validation split ({where})",
        }[self.kind]


def _fraction_key(fraction: float) -> str:
    return f"{fraction:g}"


def local_dir(run) -> str | None:
    path = run.data.dataset_path
    return path if path and os.path.isabs(path) and os.path.isdir(path) else None


@functools.lru_cache(maxsize=64)
def has_validation_split(directory: str) -> bool:
    from datasets import get_dataset_split_names

    try:
        return "validation" in get_dataset_split_names(directory)
    except Exception:  # no data files, unreadable: check_corpus names the problem
        return False


def source(run) -> Source:
    """Where the run's held-out records come from (see the module docstring). The answer depends
    only on the run config and the corpus's file names, so every process reaches the same one."""
    data = run.data
    train = (data.dataset, data.dataset_path)
    if data.validation_path:
        return Source("path", *train, FILES_DATASET, data.validation_path)
    directory = local_dir(run)
    if directory is not None:
        if has_validation_split(directory):
            return Source("split", *train, VALIDATION_DATASET, directory)
        key = _fraction_key(data.validation_fraction)
        return Source("fraction", TRAIN_PREFIX + key, directory, HELDOUT_PREFIX + key, directory)
    name = data.dataset.lower()
    if not data.dataset_path and name in STREAMED:
        return Source("hub", *train, STREAMED[name], None)
    return Source("hub", *train, HUB_VALIDATION_DATASET, data.dataset_path or _registry()[name].path)


def _registry() -> dict:
    from torchtitan.hf_datasets.text_datasets import DATASETS

    return DATASETS


def heldout(index: int, fraction: float) -> bool:
    return math.floor((index + 1) * fraction) > math.floor(index * fraction)


def _text(sample: dict) -> str:
    return sample["text"]


def _split(path: str, split: str):
    from datasets import load_dataset

    return load_dataset(path, split=split)


def _train_part(path: str, fraction: float, held: bool):
    ds = _split(path, "train")
    return ds.filter(lambda _, i: heldout(i, fraction) == held, with_indices=True)


DATA_SUFFIXES = {".jsonl": "json", ".json": "json", ".txt": "text", ".parquet": "parquet", ".csv": "csv"}


def data_files(path: str) -> dict[str, list[str]]:
    """The data files of a file or directory (hidden ones skipped, sorted), by ``datasets`` builder."""
    if os.path.isfile(path):
        found = [path]
    else:
        found = []
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found += [os.path.join(root, n) for n in sorted(names) if not n.startswith(".")]
    by_builder: dict[str, list[str]] = {}
    for file in found:
        builder = DATA_SUFFIXES.get(os.path.splitext(file)[1].lower())
        if builder:
            by_builder.setdefault(builder, []).append(file)
    return by_builder


def _files(path: str):
    from datasets import concatenate_datasets, load_dataset

    parts = [load_dataset(b, data_files=f, split="train") for b, f in sorted(data_files(path).items())]
    return parts[0] if len(parts) == 1 else concatenate_datasets(parts)


def _hub_validation(path: str):
    from datasets import load_dataset

    return load_dataset(path, split="validation", streaming=True)


def register(run) -> Source:
    """Add the loaders ``source(run)`` names to torchtitan's dataset registry; returns it."""
    from torchtitan.hf_datasets import DatasetConfig

    registry = _registry()
    src = source(run)
    fraction = run.data.validation_fraction
    loaders = {
        VALIDATION_DATASET: functools.partial(_split, split="validation"),
        FILES_DATASET: _files,
        HUB_VALIDATION_DATASET: _hub_validation,
        TRAIN_PREFIX + _fraction_key(fraction): functools.partial(_train_part, fraction=fraction, held=False),
        HELDOUT_PREFIX + _fraction_key(fraction): functools.partial(
            _train_part, fraction=fraction, held=True
        ),
    }
    for name in (src.train_dataset, src.val_dataset):
        if name in loaders and name not in registry:
            registry[name] = DatasetConfig(
                path=src.val_path or "", loader=loaders[name], sample_processor=_text
            )
    return src


def load_validation(run):
    """The held-out records as a ``datasets`` dataset (pre-flight counts their tokens)."""
    src = register(run)
    config = _registry()[src.val_dataset]
    return config.loader(src.val_path or config.path)
