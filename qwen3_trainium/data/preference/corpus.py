"""The shipped preference pairs (``data/preference_corpus``), made deterministically by
``python -m qwen3_trainium.make_assets`` from the chat corpus's question templates
(``data/assets.py``: capitals, sums, differences, counting).

The chosen response is the correct answer. The rejected one is either unhelpful (one of a few
refusals) or an answer of the same form that is wrong in the same telling way every time (the
capital is "Atlantis", the sum or difference is 99, the count runs backwards): a preference a
tiny random-init model learns within a few steps, so that ``rewards/accuracies`` rises in a
smoke run. The records cover every path of the reader (``records.py``): explicit and implicit
prompts, message lists and strings, system prompts, earlier turns, and
``chat_template_kwargs: {enable_thinking: false}``.
"""

from __future__ import annotations

import json
import random

from qwen3_trainium.data.assets import _CAPITALS, _NUMBERS, _QUESTIONS, PREFERENCE_DIR, SYSTEM_PROMPT

REFUSALS = ("I do not know.", "I cannot answer that.", "No idea, sorry.")
WRONG_CITY, WRONG_NUMBER = "Atlantis", 99


def _question(rng: random.Random) -> tuple[str, str, str]:
    """(question, correct answer, wrong answer of the same form)."""
    kind = rng.choice(sorted(_QUESTIONS))
    country = rng.choice(sorted(_CAPITALS))
    x, y = rng.randint(0, 20), rng.randint(0, 20)
    start = rng.randint(0, 5)
    stop = start + rng.randint(2, 4)
    words = _NUMBERS[start : stop + 1]
    values = dict(
        country=country,
        city=_CAPITALS[country],
        x=x,
        y=y,
        z=x + y,
        a=_NUMBERS[start],
        b=_NUMBERS[stop],
        words=" ".join(words).capitalize(),
    )
    wrong = dict(values, city=WRONG_CITY, words=" ".join(reversed(words)).capitalize())
    wrong.update({"z": WRONG_NUMBER} if kind == "plus" else {"x": WRONG_NUMBER} if kind == "minus" else {})
    question, answer, _ = (t.format(**values) for t in _QUESTIONS[kind])
    return question, answer, _QUESTIONS[kind][1].format(**wrong)


def _prompt(rng: random.Random, question: str) -> list[dict]:
    """The user's question, after a system prompt (a fifth) and an earlier exchange (a fifth)."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}] if rng.random() < 0.2 else []
    if rng.random() < 0.2:
        earlier, answer, _ = _question(rng)
        messages += [{"role": "user", "content": earlier}, {"role": "assistant", "content": answer}]
    return messages + [{"role": "user", "content": question}]


def _pair(rng: random.Random) -> dict:
    question, chosen, wrong = _question(rng)
    refuse = rng.random() < 0.5
    rejected = rng.choice(REFUSALS) if refuse else wrong
    form = rng.random()
    if form < 0.06 and refuse:  # implicit prompt, strings: TRL's character prefix (a refusal differs early)
        record = {"chosen": f"{question} {chosen}", "rejected": f"{question} {rejected}"}
    elif form < 0.14:  # explicit, strings: a user message and assistant messages
        record = {"prompt": question, "chosen": chosen, "rejected": rejected}
    else:
        prompt = _prompt(rng, question)
        sides = [[{"role": "assistant", "content": text}] for text in (chosen, rejected)]
        if form < 0.26:  # implicit prompt, messages: the common prefix of the two conversations
            record = {"chosen": prompt + sides[0], "rejected": prompt + sides[1]}
        else:
            record = {"prompt": prompt, "chosen": sides[0], "rejected": sides[1]}
    if rng.random() < 0.15:
        record["chat_template_kwargs"] = {"enable_thinking": False}
    return record


def make_pairs(num: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [_pair(rng) for _ in range(num)]


def make_preference_corpus() -> tuple[list[dict], list[dict]]:
    """(train, validation): 400 and 40 records, the held-out ones none of the training ones."""
    train = make_pairs(400, seed=0)
    seen = {json.dumps(r, sort_keys=True) for r in train}
    val = [r for r in make_pairs(60, seed=1) if json.dumps(r, sort_keys=True) not in seen][:40]
    return train, val


def write_preference_corpus() -> None:
    train, val = make_preference_corpus()
    PREFERENCE_DIR.mkdir(parents=True, exist_ok=True)
    for name, records in (("train.jsonl", train), ("validation.jsonl", val)):
        with open(PREFERENCE_DIR / name, "w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
