"""Which precomputed reference log-probs a DPO run may reuse, and where they live (no torch:
pre-flight reads it too). The table itself and its pre-pass are ``dpo_reference.py``.

A table holds, per record of a split, the reference model's summed log-probs of the chosen and
the rejected completion (TRL 1.16.0's ``precompute_ref_log_probs``: ``DPOTrainer._precompute_ref_logps``,
``trl/trainer/dpo_trainer.py``). Its key is everything those numbers depend on:

- the data identity (``data/preference/source.identity``): the records, which of them are held
  out, the tokenizer, the chat template and its kwargs, the mask rule: what decides the token ids
  of each side. Not ``training.seq_len``, ``data.packing`` or ``debug.seed``: the order and the
  rows a pair is packed into do not change its sums (a document mask keeps the documents of a
  row apart; the sums of a packed row and of a row per pair differ by float noise only). One
  exception: with ``data.overflow=truncate`` a side is cut to fit ``seq_len``, so ``seq_len``
  decides its ids. With ``drop``, a longer ``seq_len`` keeps more pairs: the table records the
  ``seq_len`` it was computed at (``dpo_reference.ReferenceTable.covers``);
- the split and its records (the held-out table is another file);
- the reference weights: the files of ``objective.dpo.reference_path`` when set, else of the
  initial checkpoint (``checkpoint.initial_load_path``: its safetensors and config.json). TRL
  keys its cache by the sha256 of the reference's state dict (``hash_module``, ``trl/trainer/utils.py``);
  hashing the files that hold it is the same without loading them;
- ``model.path`` and the numerics (``training.mixed_precision_param``, ``training.dtype``,
  ``model.moe_compute_dtype``): the same weights run in bfloat16 give other sums.

A run with no checkpoint (a random init) is keyed by its flavor, seed and parallel layout: the
same command builds the same weights. That case is for smoke runs only: a DPO reference that is
random weights says nothing about preferences.

Where: ``<dataset dir>/.ref_logps/<key>.safetensors`` when the dataset is a writable local path
(hidden: the record readers skip hidden files and folders, ``data/chat/records.py``
``data_files``), else ``$XDG_CACHE_HOME/qwen3-trainium/ref_logps/`` (``~/.cache`` by default): a
Hub dataset's snapshot and the corpora shipped inside the package are never written into.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os

from qwen3_trainium.data import identity as ident

SUBDIR = ".ref_logps"
# How the pre-pass computes a table (rank/dpo.py dpo_side_sums: float32 log-softmax of the lm_head,
# summed over TRL's completion tokens, the model in eval mode). Change it whenever the pre-pass or
# the model code changes what a table holds: tables of another version are never read.
PREPASS = "1: fp32 completion log-prob sums, eval mode, torchtitan 0.3.0 models"
# data identity fields that do not decide a pair's token ids (see the module docstring)
NOT_IN_KEY = ("seq_len", "packing", "seed")


def _source():
    from qwen3_trainium.data.preference import source

    return source


def _weights_files(path: str) -> list[str]:
    """The files that hold a checkpoint's weights: an HF directory's safetensors and config.json,
    else (a torchtitan DCP step folder) every file in it."""
    hf = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if hf:
        config = os.path.join(path, "config.json")
        return hf + ([config] if os.path.isfile(config) else [])
    return sorted(
        os.path.join(root, name)
        for root, _, names in os.walk(path)
        for name in names
        if not name.startswith(".")
    )


def checkpoint_identity(run) -> dict:
    """The reference weights: where they come from, and a fingerprint of their files."""
    ref = run.objective.dpo.reference_path
    start = run.checkpoint.initial_load_path if run.checkpoint.enable else None
    if run.model.path.value == "hf" and run.model.load_weights and not (ref or start):
        start = run.model.hf_model
    if ref or start:  # the weights, wherever they are named from: the same files, the same table
        path = ref or start
        if os.path.isdir(path):
            return {"checkpoint": ident.files(_weights_files(path), path)}
        return {"checkpoint": path}  # a Hub id (model=hf): its cached snapshot is named by its revision
    par = run.parallel
    layout = [
        par.data_parallel_replicate_degree,
        par.data_parallel_shard_degree,
        par.tensor_parallel_degree,
        par.pipeline_parallel_degree,
        par.context_parallel_degree,
    ]
    # only smoke runs train from a random init: the weights are the flavor's init under the seed,
    # made by the installed torch and torchtitan (their init code and RNG decide the numbers)
    from importlib.metadata import version

    made_by = f"torch {version('torch')}, torchtitan {version('torchtitan')}"
    return {"random_init": f"{run.model.flavor} seed {run.debug.seed} layout {layout}, {made_by}"}


def key_fields(run, split: str) -> dict:
    """Everything the reference sums of ``split``'s pairs depend on (the module docstring)."""
    data = dict(_source().identity(run))
    truncating = run.data.overflow.value == "truncate"
    for name in NOT_IN_KEY:
        if not (name == "seq_len" and truncating):
            data.pop(name, None)
    return {
        "prepass": PREPASS,
        "data": data,
        "split": split,
        "split_records": split_records(run, split),
        "weights": checkpoint_identity(run),
        "model_path": run.model.path.value,
        "flavor": run.model.flavor,
        "mixed_precision_param": run.training.mixed_precision_param.value,
        "dtype": run.training.dtype.value,
        "moe_compute_dtype": run.model.moe_compute_dtype.value,
    }


def split_records(run, split: str) -> str:
    """A fingerprint of the files ``split``'s records come from (training's are in the data
    identity already; the held-out ones are not), by the held-out rule of ``data/chat/source.py``."""
    from qwen3_trainium.data.chat import records as rec

    root = rec.resolve(run.data.dataset_path)
    if root is None:
        raise FileNotFoundError(run.data.dataset_path)
    splits = rec.split_files(root)
    if split == "train" or not run.eval.enable:
        return ident.files(splits["train"], root)
    if run.data.validation_path:
        return ident.files(rec.data_files(run.data.validation_path), run.data.validation_path)
    if splits["validation"]:
        return ident.files(splits["validation"], root)
    fraction = run.data.validation_fraction
    return f"{ident.files(splits['train'], root)}, the records the fraction {fraction:g} picks"


def key(run, split: str) -> str:
    text = json.dumps(key_fields(run, split), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cache_dir(environ=os.environ) -> str:
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "qwen3-trainium", "ref_logps")


def table_dir(run, environ=os.environ) -> str:
    """``<dataset dir>/.ref_logps`` when the dataset is a writable local path, else the cache."""
    from qwen3_trainium.config.runconfig import ASSETS_DIR

    path = os.path.abspath(run.data.dataset_path)
    # a Hub id's snapshot belongs to the Hub cache, a shipped corpus to the installed package
    local = os.path.exists(path) and not path.startswith(str(ASSETS_DIR) + os.sep)
    if local:
        folder = path if os.path.isdir(path) else os.path.dirname(path)
        if os.access(folder, os.W_OK):
            return os.path.join(folder, SUBDIR)
    return cache_dir(environ)


def table_path(run, split: str, environ=os.environ) -> str:
    return os.path.join(table_dir(run, environ), f"{key(run, split)}.safetensors")


def missing_on_resume(path: str, split: str, step: int) -> str:
    """Why a resumed run cannot go on without the table, and the fix."""
    return (
        f"objective=dpo: the precomputed reference log-probs of the {split} pairs are missing: {path}. "
        f"This run resumes at step {step}; the weights now loaded are the trained policy's, not the "
        "reference's, so they cannot be computed again. Fix: restore that file (it was written by "
        "the run's first start, beside the data or in ~/.cache/qwen3-trainium/ref_logps), or start "
        "the run again from step 0 (a new run directory)"
    )


def short_on_resume(path: str, split: str, step: int, computed: int, seq_len: int) -> str:
    """Why a resumed run cannot go on with a table made at a shorter ``seq_len`` (data.overflow=drop
    kept fewer pairs then), and the fix."""
    return (
        f"objective=dpo: the precomputed reference log-probs of the {split} pairs ({path}) were computed at "
        f"training.seq_len={computed}, without the pairs that only training.seq_len={seq_len} keeps "
        f"(data.overflow=drop). This run resumes at step {step}: its weights are the trained policy's, "
        f"which cannot give the reference. Fix: training.seq_len={computed} (or shorter) to resume it, or "
        "start the run again from step 0 (a new run directory)"
    )
