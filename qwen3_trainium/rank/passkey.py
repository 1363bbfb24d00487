"""The passkey check after training (``eval.long_context=on``): can the trained model repeat a key
hidden at each depth of a prompt as long as it was trained on?

Every rank (``trainer.SampleAfterTraining`` calls ``passkey_on_ranks`` under the trainer's
``train_context``, as it calls the samples) builds the same prompts (``data/passkey.py``: a key
per depth of ``eval.long_context_depths`` and trial, seeded by ``debug.seed``), decodes greedily,
one full forward per token (``probe.model_logits``: the same forwards on every rank, as FSDP and
TP need; rank 0's id is the one every rank continues with), in the run's own precision (the model
as trained; no float32 copy of a long forward), and stops once the answer's first digits are
complete. An answer is right when its first run of digits is the key. Rank 0 writes
``passkey.json`` (every prompt's facts and answer) and ``passkey.md`` (accuracy per depth) and
returns the figures the metrics processor logs (``metrics.PASSKEY_PREFIX``).

On a tiny model the accuracy means nothing; the harness is what the tests check.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field

PASSKEY_JSON = "passkey.json"
PASSKEY_MD = "passkey.md"


@dataclass(kw_only=True, slots=True)
class PasskeyConfig:
    length: int = 0
    """Tokens of each prompt, the answer's room included (``eval.long_context_length``, 0 read as
    ``training.seq_len`` by ``titan_eval.evaluation``); 0 here: no check."""
    depths: list[float] = field(default_factory=list)
    trials: int = 1
    """Keys per depth."""
    seed: int = 0
    path: str = ""
    """Where rank 0 writes passkey.json (passkey.md beside it)."""
    tokenizer_dir: str = ""
    chat_template: str = ""
    """data=chat: the template file; the question is a user turn with a generation prompt."""
    chat_template_kwargs: dict = field(default_factory=dict)


def _complete(tokenizer, ids: list[int]) -> bool:
    """The answer so far has a run of digits followed by something else (the key is said)."""
    import re

    from qwen3_trainium.data.passkey import answer

    text = tokenizer.decode(ids, skip_special_tokens=False).split("</think>")[-1]
    return answer(text) is not None and re.search(r"\d+\D", text) is not None


def _builder(config: PasskeyConfig):
    from tokenizers import Tokenizer

    from qwen3_trainium.data.passkey import Builder

    tokenizer = Tokenizer.from_file(os.path.join(config.tokenizer_dir, "tokenizer.json"))
    chat = None
    if config.chat_template:
        from qwen3_trainium.data.chat.template import ChatTokenizer

        chat = ChatTokenizer.load(config.tokenizer_dir, config.chat_template)
    return tokenizer, chat, Builder(tokenizer, chat, config.chat_template_kwargs)


def passkey_on_ranks(model, config: PasskeyConfig, group=None, **facts) -> dict:
    """Every rank: the check on ``model`` (one torchtitan model part); rank 0 writes the files.
    ``group``: a gloo group of every rank (None: one process); ``facts`` go into passkey.json.
    Returns the record; its ``metrics`` are the figures to log."""
    import torch.distributed as dist

    from qwen3_trainium.data.passkey import ANSWER_TOKENS, answer, make_key, scores
    from qwen3_trainium.rank.probe import model_logits
    from qwen3_trainium.rank.samples import _rank0_id, eos_ids, greedy

    tokenizer, chat, builder = _builder(config)
    eos = eos_ids(config.tokenizer_dir, tokenizer) + ([chat.end_of_turn_id] if chat else [])
    agree = functools.partial(_rank0_id, group) if group is not None else None
    logits = functools.partial(model_logits, model)
    trials = []
    for depth in config.depths:
        for trial in range(config.trials):
            prompt = builder.build(config.length, depth, make_key(config.seed, depth, trial))
            out = greedy(
                logits, prompt.ids, ANSWER_TOKENS, eos, agree, stop=functools.partial(_complete, tokenizer)
            )
            text = tokenizer.decode(out, skip_special_tokens=False)
            trials.append(
                {"depth": depth, "trial": trial, "key": prompt.key, "answer": answer(text), "text": text}
                | {"correct": answer(text) == prompt.key, "prompt_tokens": len(prompt.ids)}
                | {"key_at": prompt.key_at, "filler_before": prompt.before, "filler": prompt.filler}
            )
    accuracy = scores(trials)
    record = {
        "length": config.length,
        "depths": list(config.depths),
        "trials_per_depth": config.trials,
        "seed": config.seed,
        "chat_template": config.chat_template,
        "accuracy": {str(d): a for d, a in accuracy.items()},
        "mean_accuracy": sum(accuracy.values()) / len(accuracy) if accuracy else None,
        "metrics": metrics(accuracy),
        **facts,
        "trials": trials,
    }
    if not dist.is_initialized() or dist.get_rank() == 0:
        write(config.path, record)
    return record


def metrics(accuracy: dict[float, float]) -> dict[str, float]:
    """The figures for the metrics processor: the mean, and each depth's accuracy."""
    out = {f"passkey/depth_{d:g}": a for d, a in accuracy.items()}
    if accuracy:
        out["passkey/accuracy"] = sum(accuracy.values()) / len(accuracy)
    return out


def write(path: str, record: dict) -> None:
    """passkey.json at ``path`` and passkey.md beside it."""
    for name, text in ((path, json.dumps(record, indent=2) + "\n"), (_md_path(path), render(record))):
        with open(f"{name}.tmp", "w") as f:
            f.write(text)
        os.replace(f"{name}.tmp", name)


def _md_path(path: str) -> str:
    return os.path.join(os.path.dirname(path), PASSKEY_MD)


def render(record: dict) -> str:
    """passkey.md: accuracy per depth, and each trial's key and answer."""
    kind = "a user turn of the chat template" if record["chat_template"] else "plain text"
    lines = [
        f"# Passkey retrieval after step {record.get('step', '?')}",
        "",
        f"Prompts of {record['length']} tokens (the answer's room included), {kind}; a random key at"
        f" each depth of the filler, {record['trials_per_depth']} key{'s' if record['trials_per_depth'] != 1 else ''}"
        f" per depth (seed {record['seed']});"
        " greedy decoding; right when the answer's first number is the key.",
        "",
        "| depth | accuracy | keys | answers |",
        "|---|---|---|---|",
    ]
    for depth, accuracy in record["accuracy"].items():
        at = [t for t in record["trials"] if str(t["depth"]) == depth]
        keys = ", ".join(t["key"] for t in at)
        answers = ", ".join(t["answer"] or "(none)" for t in at)
        lines.append(f"| {float(depth):g} | {accuracy:.2f} | {keys} | {answers} |")
    if record["mean_accuracy"] is not None:
        lines += ["", f"Mean accuracy: {record['mean_accuracy']:.2f}."]
    return "\n".join(lines) + "\n"
