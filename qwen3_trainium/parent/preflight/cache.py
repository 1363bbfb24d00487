"""A pre-flight pass, remembered: the same config, code, versions and inputs pass again.

``check`` imports torchtitan and builds the model on the meta device (6-10 s on 2 CPU cores);
a dry run, or the same job run again, need not pay that twice. The key is a hash of
- the resolved config (without ``run_name`` and ``dry_run``) and whether it is launching;
- the installed versions of the stack, and this package's source files (name, size, mtime);
- the inputs the checks read: the tokenizer, data (a cached Hub dataset's snapshot), chat
  template and checkpoint paths (each entry's name, size and mtime, one level deep), the run directory's checkpoint folder (what a resume finds);
- the environment the checks read (Slurm's variables, visible devices, Hugging Face offline
  switches, ``PATH`` and ``CXX``, where Inductor's C++ compiler is looked up) and whether an
  accelerator is present.
Only passes are stored, with their notes and facts (the parameter counts, all and trainable, that
the disk check reads); what a config cannot determine (files, folders, host, trackers, free disk)
is checked every time; a config with a problem is checked afresh every time.
Entries live in ``$XDG_CACHE_HOME/qwen3-trainium/preflight`` (``~/.cache`` by default);
``preflight_cache=false`` checks everything every time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent import compose

PACKAGE = Path(__file__).resolve().parents[2]
ENV_PREFIXES = ("SLURM_", "CUDA_VISIBLE_DEVICES", "NEURON_", "HF_", "TRANSFORMERS_OFFLINE", "CXX", "PATH")


def cache_dir(environ=os.environ) -> Path:
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "qwen3-trainium" / "preflight"


def _listing(path: str | None) -> list:
    if not path or not os.path.exists(path):
        return [path, None]
    if os.path.isfile(path):
        st = os.stat(path)
        return [path, st.st_size, st.st_mtime_ns]
    entries = []
    with os.scandir(path) as it:
        for entry in it:
            st = entry.stat()
            entries.append([entry.name, st.st_size, st.st_mtime_ns])
    return [path, sorted(entries)]


def _sources() -> list:
    return sorted(
        [str(p.relative_to(PACKAGE)), p.stat().st_size, p.stat().st_mtime_ns] for p in PACKAGE.rglob("*.py")
    )


def key(run: RunConf, run_dir: str, *, launching: bool, versions: dict[str, str | None]) -> str:
    from qwen3_trainium.config import devices

    config = dataclasses.replace(run, run_name="", dry_run=False)
    ck = run.checkpoint
    parts = {
        "config": compose.to_yaml(config),
        "launching": launching,
        "versions": versions,
        "sources": _sources(),
        "inputs": [
            _listing(p)
            for p in (
                run.data.hf_assets_path,
                run.data.dataset_path,
                run.data.validation_path,
                run.data.chat_template,
                _hub_dataset(run),
                ck.initial_load_path,
                run.model.hf_model,
            )
        ],
        "resume": _listing(os.path.join(run_dir, ck.folder)) if ck.enable else None,
        "env": sorted((k, v) for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)),
        "accelerator": devices.accelerator_present(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _hub_dataset(run: RunConf) -> str | None:
    """Chat data from a cached Hub dataset: its snapshot directory (a new commit is new input)."""
    path = run.data.dataset_path
    if run.data.format.value == "text" or not path or os.path.exists(path):
        return None
    from qwen3_trainium.config.hub import cached_snapshot

    return cached_snapshot(path, repo_type="dataset")


def load(digest: str) -> tuple[list[str], dict] | None:
    """The notes and facts (``preflight.check``'s) of a remembered pass, or None."""
    try:
        with open(cache_dir() / f"{digest}.json") as f:
            entry = json.load(f)
        return list(entry["notes"]), dict(entry.get("facts") or {})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(digest: str, notes: list[str], facts: dict | None = None) -> None:
    """Remember a pass; a cache that cannot be written is only a missed speed-up."""
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f"{digest}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"notes": notes, "facts": facts or {}}))
        os.replace(tmp, directory / f"{digest}.json")
    except OSError:
        pass
