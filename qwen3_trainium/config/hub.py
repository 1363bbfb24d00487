"""Is this Hugging Face Hub repository in the local cache? The one answer for every layer: a model
(``models/hf.py``), a chat dataset (``data/chat/records.py``) and a text dataset the pre-flight
looks for (``parent/preflight/data.py``). No network: ``huggingface_hub.snapshot_download`` with
``local_files_only=True`` returns the cached snapshot of the revision ``refs/main`` names, or raises
(``LocalEntryNotFoundError`` when it is not there), wherever ``HF_HUB_CACHE`` points.
"""

from __future__ import annotations

PATH_PREFIXES = (".", "/", "~")  # what a user types for a directory, never a repo id


def is_repo_id(name: str) -> bool:
    """Whether ``name`` can be a Hub repo id: ``name`` or ``namespace/name`` (the Hub's rule,
    ``huggingface_hub.utils.validate_repo_id``: at most one "/"), not a path."""
    return bool(name) and not name.startswith(PATH_PREFIXES) and name.count("/") <= 1


def cached_snapshot(repo_id: str, repo_type: str = "model") -> str | None:
    """The directory of ``repo_id``'s cached snapshot (``repo_type``: "model" or "dataset"), or
    None: not a repo id, not in the cache, or no Hub client installed."""
    if not is_repo_id(repo_id):
        return None
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id, repo_type=repo_type, local_files_only=True)
    except Exception:  # not cached (LocalEntryNotFoundError), an invalid id (HFValidationError), no client
        return None
