"""Pre-flight of ``eval.long_context``, the passkey check after training (``rank/passkey.py``;
with or without eval=on's held-out loss): it runs on the whole model, at depths within the filler, on prompts that fit the
rotary table and hold the key and the question.

The length: each greedy forward is the prompt plus the answer so far, padded to a multiple of 256
(``probe.model_logits``), and torchtitan sizes the rotary table of every layer to
``training.seq_len`` (``torchtitan/models/common/decoder.py``, ``Decoder.update_from_config``;
positions past it fail the ``_maybe_check_max_pos`` assert of ``models/common/rope.py``), so the
longest forward, ``length - 1`` tokens padded, must fit ``training.seq_len``, whatever RoPE
scaling the model has: scaling lets a model be trained at a longer ``training.seq_len``, which
then is the length the check runs at.
"""

from __future__ import annotations

import os

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent.preflight.problem import Problem

PADDED_TO = 256  # probe.PROBE_MULTIPLE: each greedy forward is padded to a multiple of it
OFF = "eval.long_context=false"


def check_long_context(run: RunConf) -> list[Problem]:
    ev = run.eval
    if not ev.long_context:
        return []
    if run.parallel.pipeline_parallel_degree > 1:
        what = (
            "the passkey check decodes on the whole model, and pipeline stages split it "
            f"(parallel.pipeline_parallel_degree={run.parallel.pipeline_parallel_degree})"
        )
        return [Problem("eval.long_context", True, what, OFF)]
    return _depths(run) + _trials(run) + _length(run)


def _depths(run: RunConf) -> list[Problem]:
    depths = list(run.eval.long_context_depths)
    bad = [d for d in depths if not 0.0 <= float(d) <= 1.0]
    if depths and not bad:
        return []
    what = f"holds {bad[0]}, outside [0, 1]" if bad else "is empty"
    fix = "eval.long_context_depths='[0.0,0.25,0.5,0.75,1.0]' (fractions of the filler before the key)"
    return [Problem("eval.long_context_depths", depths, what, fix)]


def _trials(run: RunConf) -> list[Problem]:
    trials = run.eval.long_context_trials
    if trials >= 1:
        return []
    return [
        Problem(
            "eval.long_context_trials", trials, "must be >= 1 (keys per depth)", "eval.long_context_trials=2"
        )
    ]


def seed(run: RunConf) -> int:
    """The keys' seed: debug.seed (0 when unset), as ``titan_eval.evaluation`` hands it to the ranks."""
    return run.debug.seed if run.debug.seed is not None else 0


def length(run: RunConf) -> int:
    """The prompts' length: eval.long_context_length, 0 read as training.seq_len."""
    return run.eval.long_context_length or run.training.seq_len


def _length(run: RunConf) -> list[Problem]:
    asked, seq_len = run.eval.long_context_length, run.training.seq_len
    key = "eval.long_context_length"
    if asked < 0:
        return [Problem(key, asked, "is negative", f"{key}=0 (training.seq_len)")]
    n = length(run)
    if -(-(n - 1) // PADDED_TO) * PADDED_TO > seq_len:
        fits = seq_len // PADDED_TO * PADDED_TO
        what = (
            f"its longest forward ({n - 1} tokens, padded to a multiple of {PADDED_TO}) is past training.seq_len"
            f" ({seq_len}), the rotary table torchtitan sizes every layer to"
        )
        fix = f"{key}={fits} or less" if fits else f"training.seq_len={PADDED_TO} or more"
        return [Problem(key, asked, what, fix)]
    return _room(run, n)


def _room(run: RunConf, n: int) -> list[Problem]:
    """The prompt must hold the head, the key, the question and the answer's room."""
    if not os.path.isfile(os.path.join(run.data.hf_assets_path, "tokenizer.json")):
        return []  # check_data names it
    from tokenizers import Tokenizer

    from qwen3_trainium.data.passkey import ANSWER_TOKENS, Builder, keys

    chat = None
    if run.data.format.value != "text":
        from qwen3_trainium.data.chat.template import ChatTokenizer

        try:
            chat = ChatTokenizer.load(run.data.hf_assets_path, run.data.chat_template)
        except (ValueError, OSError):
            return []  # check_chat_static names the template
    tok = Tokenizer.from_file(os.path.join(run.data.hf_assets_path, "tokenizer.json"))
    builder = Builder(tok, chat, dict(run.data.chat_template_kwargs or {}))
    ev = run.eval
    every = keys(seed(run), list(ev.long_context_depths), ev.long_context_trials)
    need = max([builder.overhead()] + [builder.overhead(k) for k in every]) + ANSWER_TOKENS
    if n >= need:
        return []
    what = (
        f"{n} tokens cannot hold the passkey prompt's head, key and question and the answer ({need} at least)"
    )
    return [
        Problem(
            "eval.long_context_length",
            run.eval.long_context_length,
            what,
            f"eval.long_context_length={need} or more (at most training.seq_len)",
        )
    ]
