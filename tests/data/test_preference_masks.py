"""Preference masks against TRL 1.16.0's own tokenization: ``DPOTrainer(...).train_dataset``'s
``prompt_ids``, ``chosen_ids`` and ``rejected_ids`` for the shipped corpus and hand-made records,
and ``DataCollatorForPreference``'s ``keep_start`` truncation for ``data.overflow=truncate``."""

from __future__ import annotations

import json
import os

import pytest
from conftest import resolve

trl = pytest.importorskip("trl")

from qwen3_trainium.data.assets import TOKENIZER_DIR, ensure_hf_model  # noqa: E402
from qwen3_trainium.data.chat.template import ChatTokenizer  # noqa: E402
from qwen3_trainium.data.preference import records as rec  # noqa: E402
from qwen3_trainium.data.preference import source  # noqa: E402
from qwen3_trainium.data.preference.masks import PairCounts, PairMasker, encode  # noqa: E402

SHIPPED = 24  # the shipped corpus's first records compared with TRL's

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "capital",
            "description": "The capital of a country",
            "parameters": {"type": "object", "properties": {"country": {"type": "string"}}},
        },
    }
]
USER, SYSTEM = {"role": "user", "content": "What is 2 plus 3?"}, {"role": "system", "content": "Be brief."}
ANSWER, WRONG = (
    {"role": "assistant", "content": "2 plus 3 is 5."},
    {"role": "assistant", "content": "It is 99."},
)
HAND = {
    "explicit": {"prompt": [USER], "chosen": [ANSWER], "rejected": [WRONG]},
    "multi_turn_prompt": {
        "prompt": [SYSTEM, USER, ANSWER, {"role": "user", "content": "And 3 plus 3?"}],
        "chosen": [{"role": "assistant", "content": "6."}],
        "rejected": [WRONG],
    },
    "implicit": {"chosen": [SYSTEM, USER, ANSWER], "rejected": [SYSTEM, USER, WRONG]},
    "string": {"prompt": "What is 2 plus 3?", "chosen": "5.", "rejected": "I do not know."},
    "implicit_string": {"chosen": "The sky is blue.", "rejected": "The sky is green."},
    "tools": {"prompt": [USER], "chosen": [ANSWER], "rejected": [WRONG], "tools": json.dumps(TOOLS)},
    "no_thinking": {
        "prompt": [USER],
        "chosen": [ANSWER],
        "rejected": [WRONG],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "reasoning": {
        "prompt": [USER],
        "chosen": [{**ANSWER, "reasoning_content": "Count 3 up from 2."}],
        "rejected": [WRONG],
    },
}


def conversational(record: dict) -> dict:
    """The record as TRL must be given it to render it through the chat template: strings become a
    user prompt and assistant responses, after TRL's own ``extract_prompt`` for implicit ones."""
    if not isinstance(record["chosen"], str):
        return record
    if "prompt" not in record:
        record = {**record, **trl.extract_prompt(record)}
    out = {k: v for k, v in record.items() if k not in ("prompt", "chosen", "rejected")}
    out["prompt"] = [{"role": "user", "content": record["prompt"]}]
    for side in ("chosen", "rejected"):
        out[side] = [{"role": "assistant", "content": record[side]}]
    return out


@pytest.fixture(scope="module")
def trl_ids(tmp_path_factory):
    """(records, template=None) -> TRL's (prompt_ids, chosen_ids, rejected_ids) of each: one
    DPOTrainer (the tiny checkpoint and the shipped tokenizer) per group of records with the same
    keys (a datasets table needs one schema; TRL looks at the first record to decide explicit or
    implicit)."""
    os.environ.setdefault("CI", "1")  # no telemetry ping (trl's base_trainer)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(ensure_hf_model()))
    out_dir = str(tmp_path_factory.mktemp("trl"))
    args = trl.DPOConfig(output_dir=out_dir, max_length=None, report_to="none", use_cpu=True, bf16=False)

    def ids(records: list[dict], template: str | None = None) -> list[tuple]:
        tok = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
        tok.chat_template = template or tok.chat_template
        given = [conversational(r) for r in records]
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(given):
            groups.setdefault(tuple(sorted(r)), []).append(i)
        found = {}
        for members in groups.values():
            data = Dataset.from_list([given[i] for i in members])
            trainer = trl.DPOTrainer(model=model, args=args, processing_class=tok, train_dataset=data)
            for j, i in enumerate(members):
                ex = trainer.train_dataset[j]
                found[i] = (ex["prompt_ids"], ex["chosen_ids"], ex["rejected_ids"])
        return [found[i] for i in range(len(records))]

    return ids


def trl_shaped(docs) -> tuple[list[int], list[int], list[int]]:
    """(prompt_ids, chosen_ids, rejected_ids) as the rows train on them: each side's completion is
    its labels that are not -100, which must be the end of its document, after the same prompt."""
    out = []
    for doc in (docs.chosen, docs.rejected):
        _, labels = doc.inputs_labels()
        completion = [t for t in labels if t != -100]
        assert doc.ids[len(doc.ids) - len(completion) :] == completion, "the completion ends the document"
        out.append((doc.ids[: len(doc.ids) - len(completion)], completion))
    assert out[0][0] == out[1][0], "one prompt"
    return out[0][0], out[0][1], out[1][1]


def _ours(records: list[dict], tmp_path, template: str | None = None) -> list[tuple]:
    """Our TRL-shaped ids of ``records``, read from a JSONL file as a run reads them."""
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    tok = ChatTokenizer.load(str(TOKENIZER_DIR))
    masker = PairMasker(ChatTokenizer(tok.tokenizer_dir, template, "test") if template else tok)
    return [trl_shaped(masker.docs(p)) for p in rec.load([str(path)])]


def test_the_shipped_corpus_masks_equal_trls(trl_ids):
    run = resolve("objective=dpo", "smoke=on")
    with open(os.path.join(run.data.dataset_path, "train.jsonl")) as f:
        raw = [json.loads(line) for line, _ in zip(f, range(SHIPPED), strict=False)]
    forms = {("prompt" in r, isinstance(r["chosen"], str)) for r in raw}
    assert forms == {(True, True), (True, False), (False, True), (False, False)}, "every form of record"
    assert any("chat_template_kwargs" in r for r in raw) and any('"system"' in json.dumps(r) for r in raw)
    masker = source.masker(run)
    ours = [trl_shaped(masker.docs(p)) for p in source.records(run)[:SHIPPED]]
    assert ours == trl_ids(raw)


@pytest.mark.parametrize("case", sorted(HAND))
def test_hand_made_records_masks_equal_trls(case, trl_ids, tmp_path):
    ours = _ours([HAND[case]], tmp_path)
    assert ours == trl_ids([HAND[case]])
    prompt, chosen, rejected = ours[0]
    assert (
        chosen[-2:] == rejected[-2:] and chosen[-1] != ChatTokenizer.load(str(TOKENIZER_DIR)).end_of_turn_id
    )


# A generation prompt that ends inside the response's first word ("Th" of "The"): the prompt's
# last tokens differ from the full render's, and the completion starts where the ids diverge.
SPLIT_WORD = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\nTh{% endif %}"
)


def test_a_prompt_whose_last_tokens_merge_with_the_response_starts_where_the_ids_diverge(trl_ids, tmp_path):
    record = {"prompt": "What is 2 plus 3?", "chosen": "The sum is 5.", "rejected": "The 99."}
    ours = _ours([record], tmp_path, SPLIT_WORD)
    tok = ChatTokenizer(str(TOKENIZER_DIR), SPLIT_WORD, "test")
    prompt_render = tok.render([{"role": "user", "content": record["prompt"]}], add_generation_prompt=True)
    assert 0 < len(ours[0][0]) < len(tok.encode(prompt_render)[0]), "the case this test is about"
    assert ours == trl_ids([record], SPLIT_WORD)


def test_a_template_whose_prompt_render_is_no_prefix_skips_the_pair_counted(tmp_path):
    tok = ChatTokenizer.load(str(TOKENIZER_DIR))
    odd = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\nSure: {% endif %}"
    )
    masker = PairMasker(ChatTokenizer(tok.tokenizer_dir, odd, "test"))
    pair = rec.pair(HAND["explicit"], "pairs.jsonl:7")
    counts = PairCounts()
    assert encode(masker, pair, 256, "drop", counts) is None
    assert counts.pairs == 0 and counts.first_skip == {next(iter(counts.skipped)): "pairs.jsonl:7"}
    assert "not a prefix" in next(iter(counts.skipped))
    assert encode(PairMasker(tok), pair, 256, "drop", counts) is not None and counts.pairs == 1


def test_overflow_drops_or_cuts_each_side_as_trls_keep_start_counted(trl_ids):
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    run = resolve("objective=dpo", "smoke=on")
    tok = source.tokenizer(run)
    pair = rec.pair(HAND["multi_turn_prompt"], "x:1")
    full = PairMasker(tok).docs(pair)
    seq_len = full.length - 3
    counts = PairCounts()
    assert encode(PairMasker(tok), pair, seq_len, "drop", counts) is None
    assert (counts.dropped, counts.truncated, counts.pairs, counts.first_dropped) == (1, 0, 0, "x:1")
    cut = encode(PairMasker(tok), pair, seq_len, "truncate", counts)
    assert (counts.dropped, counts.truncated, counts.pairs) == (1, 1, 1) and cut.length <= seq_len
    m = max(len(cut.chosen.ids), len(cut.rejected.ids))  # the per-sequence max_length TRL would use
    longer = min(len(full.chosen.ids), m + 1) - 1 + min(len(full.rejected.ids), m + 1) - 1
    assert longer > seq_len, "the longest cut that fits"
    prompt, chosen, rejected = trl_ids([HAND["multi_turn_prompt"]])[0]
    batch = DataCollatorForPreference(pad_token_id=tok.pad_id, max_length=m)(
        [{"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected}]
    )
    for i, doc in enumerate((cut.chosen, cut.rejected)):
        n = int(batch["attention_mask"][i].sum())
        assert batch["input_ids"][i, :n].tolist() == doc.ids
        assert batch["completion_mask"][i, :n].tolist() == [int(s) for s in doc.supervised]
    assert encode(PairMasker(tok), pair, len(prompt) - 1, "truncate", counts) is None, "the prompt alone"
    assert counts.dropped == 2 and counts.tokens_cut == full.length - cut.length
