"""The embedded assets: corpus, tokenizer, tiny flavor."""

from __future__ import annotations

import json

import torch

from qwen3_trainium.config import flavors
from qwen3_trainium.data import assets


def test_corpus_is_deterministic_and_shipped_tokenizer_covers_it():
    from tokenizers import Tokenizer

    docs = assets.make_corpus(num_docs=50)
    assert docs == assets.make_corpus(num_docs=50)
    shipped = [json.loads(line)["text"] for line in (assets.CORPUS_DIR / "train.jsonl").open()]
    assert shipped[:50] == docs
    tok = Tokenizer.from_file(str(assets.TOKENIZER_DIR / "tokenizer.json"))
    assert tok.get_vocab_size() <= flavors.vocab_size("tiny")
    text = shipped[0]
    assert tok.decode(tok.encode(text).ids) == text
    assert tok.token_to_id(assets.EOS) is not None


def test_tiny_flavor_is_a_few_million_parameters():
    from torchtitan.protocols.model_spec import ModelSpec

    spec = flavors.model_spec("tiny", "varlen")
    assert isinstance(spec, ModelSpec) and spec.name == "qwen3"
    with torch.device("meta"):
        model = spec.model.build()
    params = sum(p.numel() for p in model.parameters())
    assert 1_000_000 < params < 10_000_000
