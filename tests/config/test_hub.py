"""One answer to "is this Hub repo cached?" (``config/hub.py``) for the three places that ask it:
a model for ``model=hf`` (``models/hf.py``), a chat dataset (``data/chat/records.py``) and a text
dataset the pre-flight looks for (``parent/preflight/data.py``). The cache is made by hand the way
the Hub lays it out (``<type>s--<org>--<name>/refs/main`` naming ``snapshots/<commit>``)."""

from __future__ import annotations

import pytest

from qwen3_trainium.config import hub
from qwen3_trainium.data.chat import records
from qwen3_trainium.models import hf
from qwen3_trainium.parent.preflight import data

COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


def _cached(root, kind: str, repo: str) -> str:
    """A cached snapshot of ``repo`` (``kind``: "model" or "dataset") under ``root``: its directory."""
    base = root / f"{kind}s--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(COMMIT)
    snapshot = base / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / ("config.json" if kind == "model" else "train.jsonl")).write_text("{}\n")
    return str(snapshot)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants

    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    # read at import: an earlier test may have imported huggingface_hub already
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root))
    return root


def test_a_cached_snapshot_is_found_by_type_and_nothing_else_is(hub_cache):
    model = _cached(hub_cache, "model", "q3t/tiny-model")
    dataset = _cached(hub_cache, "dataset", "q3t/chat-sft")
    assert hub.cached_snapshot("q3t/tiny-model") == model
    assert hub.cached_snapshot("q3t/chat-sft", repo_type="dataset") == dataset
    assert hub.cached_snapshot("q3t/chat-sft") is None  # a dataset is not a model
    assert hub.cached_snapshot("q3t/not-cached", repo_type="dataset") is None
    for path in ("", "./q3t/chat-sft", "/q3t/chat-sft", "~/chat-sft", "assets/q3t/chat-sft"):
        assert hub.cached_snapshot(path, repo_type="dataset") is None, path


@pytest.mark.parametrize("repo", ["q3t/chat-sft", "legacy-chat", "q3t/not-cached", "./q3t/chat-sft"])
def test_every_layer_gives_the_same_answer(hub_cache, repo):
    """A repo id without a namespace (the Hub's older datasets, ``wikitext``) is an id too: the
    pre-flight found it cached while the chat loader refused it before there was one rule."""
    for cached in ("q3t/chat-sft", "legacy-chat"):
        _cached(hub_cache, "dataset", cached)
        _cached(hub_cache, "model", cached)
    dataset = hub.cached_snapshot(repo, repo_type="dataset")
    assert (dataset is not None) == (repo in ("q3t/chat-sft", "legacy-chat"))
    assert records.hub_snapshot(repo) == records.resolve(repo) == dataset
    assert data._hub_cached(repo) is (dataset is not None)
    assert hf.local_model_dir(repo) == hub.cached_snapshot(repo)
