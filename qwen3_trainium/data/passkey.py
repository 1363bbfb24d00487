"""The synthetic passkey prompt (``eval.long_context``): a random key hidden at a depth of a long
filler text, and the question that asks the model to repeat it; and the score of an answer.

The task is Mohtashami & Jaggi's (Landmark Attention, 2023, arXiv:2305.16300, appendix: "There is
an important info hidden inside a lot of irrelevant text ... The grass is green. The sky is blue.
The sun is yellow. Here we go. There and back again."), as LongLoRA's ``passkey_retrivial.py`` and
RULER's ``niah`` use it. Everything is built in token ids, so the length is exact:

- the prompt is ``head + filler[:b] + needle + filler[s:s + F - b] + question`` inside the chat
  template's user turn (``data=chat``; the generation prompt after it) or as plain text;
- ``F`` filler tokens make the prompt ``length - answer_tokens`` ids long, leaving room for the
  answer; ``b`` is the word boundary nearest ``depth x F``, so the key sits at the asked depth to
  within one word (one token for a tokenizer whose words are single tokens);
- every cut is at a word boundary of the tokenizer's pre-tokenizer, where a byte-level BPE never
  merges across, so the ids are exactly what the tokenizer makes of the prompt's text (the tests
  hold them equal to ``tokenizer.encode`` and to Transformers' ``apply_chat_template``).

An answer scores when the first run of digits the model gives (after any ``</think>``) is the key.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

HEAD = (
    "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the pass key."
)
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION_PLAIN = " What is the pass key? The pass key is"
QUESTION_CHAT = " What is the pass key?"
KEY_DIGITS = 5
ANSWER_TOKENS = 16  # room left after the prompt for the answer (``The pass key is 48213.`` and more)
# the template's kwargs for the question: an answer, not a reasoning trace (Qwen3 renders an empty
# <think></think> in the generation prompt, as inference does with enable_thinking=False)
CHAT_KWARGS = {"enable_thinking": False}
SENTINEL = "\ue003"  # a private-use character: where the user's text goes in the template's render


class PasskeyError(ValueError):
    """The asked length cannot hold the head, the key and the question."""


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    text: str
    key: str
    depth: float  # asked
    key_at: int  # index in ids of the needle's first token
    filler: int  # filler tokens in all
    before: int  # filler tokens before the needle (actual depth: before / filler)


def make_key(seed: int, depth: float, trial: int) -> str:
    """A key of ``KEY_DIGITS`` digits, the first not 0: the same for the same seed, depth and trial."""
    rng = random.Random(f"passkey:{seed}:{depth!r}:{trial}")  # str seeds hash deterministically (sha512)
    return str(rng.randint(10 ** (KEY_DIGITS - 1), 10**KEY_DIGITS - 1))


def keys(seed: int, depths: list[float], trials: int) -> list[str]:
    """Every key of a check, depth by depth."""
    return [make_key(seed, d, t) for d in depths for t in range(trials)]


class Builder:
    """Passkey prompts for one tokenizer (``tokenizers.Tokenizer``) and, for chat, one template
    (``data.chat.template.ChatTokenizer``) with its kwargs."""

    def __init__(self, tokenizer, chat=None, chat_kwargs: dict | None = None) -> None:
        self.tok, self.chat = tokenizer, chat
        self.kwargs = {**(chat_kwargs or {}), **CHAT_KWARGS}
        self._stream: list[int] = []
        self._bounds: set[int] = {0}

    def _ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def _wrap(self) -> tuple[list[int], list[int]]:
        """The template's ids before and after the user's text (plain: none)."""
        if self.chat is None:
            return [], []
        render = self.chat.render(
            [{"role": "user", "content": SENTINEL}], add_generation_prompt=True, **self.kwargs
        )
        before, after = render.split(SENTINEL)
        return self._ids(before), self._ids(after)

    def overhead(self, key: str = "9" * KEY_DIGITS) -> int:
        """Prompt tokens other than filler, for ``key`` (how a key tokenizes varies with its digits)."""
        before, after = self._wrap()
        question = QUESTION_CHAT if self.chat is not None else QUESTION_PLAIN
        parts = (HEAD, NEEDLE.format(key=key), question)
        return len(before) + len(after) + sum(len(self._ids(p)) for p in parts)

    def _filler(self, n: int) -> None:
        """At least ``n`` filler tokens (and one repeat more), with their word boundaries."""
        while len(self._stream) < n + 256:
            text = FILLER * 64
            offsets = self.tok.encode(text, add_special_tokens=False).offsets
            starts = {start for _, (start, _) in self.tok.pre_tokenizer.pre_tokenize_str(text)}
            base = len(self._stream)
            self._stream += self._ids(text)
            self._bounds |= {base + i for i, (a, _) in enumerate(offsets) if a in starts}
            self._bounds.add(len(self._stream))

    def _window(self, n: int) -> tuple[int, int]:
        """A stretch of exactly ``n`` filler tokens that starts and ends at word boundaries
        (the first found; else the nearest shorter one)."""
        self._filler(n)
        starts = sorted(b for b in self._bounds if b + n <= len(self._stream))
        for s in starts:
            if s + n in self._bounds:
                return s, s + n
        end = max(b for b in self._bounds if b <= n)
        return 0, end

    def build(self, length: int, depth: float, key: str) -> Prompt:
        """The prompt of ``length - ANSWER_TOKENS`` ids with ``key`` at ``depth`` of the filler."""
        before_t, after_t = self._wrap()
        question = QUESTION_CHAT if self.chat is not None else QUESTION_PLAIN
        head, needle, tail = self._ids(HEAD), self._ids(NEEDLE.format(key=key)), self._ids(question)
        n = length - ANSWER_TOKENS - (len(before_t) + len(head) + len(needle) + len(tail) + len(after_t))
        if n < 0:
            raise PasskeyError(
                f"{length} tokens cannot hold the passkey prompt ({length - n} tokens at least)"
            )
        self._filler(n)
        b = min((x for x in self._bounds if x <= n), key=lambda x: (abs(x - depth * n), x))
        s, e = self._window(n - b)
        ids = before_t + head + self._stream[:b] + needle + self._stream[s:e] + tail + after_t
        key_at = len(before_t) + len(head) + b
        return Prompt(ids, self.tok.decode(ids, skip_special_tokens=False), key, depth, key_at, b + e - s, b)


def answer(text: str) -> str | None:
    """The first run of digits of a generated answer, after any reasoning block."""
    found = re.search(r"\d+", text.split("</think>")[-1])
    return found.group(0) if found else None


def scores(trials: list[dict]) -> dict[float, float]:
    """Exact-match accuracy per asked depth (``trials``: ``depth`` and ``correct`` each)."""
    by_depth: dict[float, list[bool]] = {}
    for t in trials:
        by_depth.setdefault(t["depth"], []).append(bool(t["correct"]))
    return {d: sum(v) / len(v) for d, v in sorted(by_depth.items())}
