"""Where a trained turn's text lies in a rendered conversation, found by rendering alone.

A turn is supervised from the end of its generation prompt through its end-of-turn token. With
``P(k)`` the render of the first ``k`` messages and ``G(k)`` the same with a generation prompt,
turn ``k`` is ``F[len(G(k)):len(P(k+1))]`` of the whole render ``F`` when the prefix property
holds at its boundaries (``P(k) ⊑ G(k) ⊑ P(k+1) ⊑ F``). Qwen3's template breaks it: an assistant
turn before the last user message loses its ``<think>`` block in ``F``, but keeps it in
``P(k+1)``, where it is the last turn. There the turn is found by difference instead, and is
just as exact:
- the turn starts where ``P(k)`` ends (``P(k) ⊑ F`` is checked: it holds whenever the turn
  follows a user or tool message);
- its generation prompt is the longest common prefix of ``G(k)``'s tail and the turn, measured
  on a render with a private-use character in front of the content (no prompt holds one, so the
  match stops before the content), which must open the turn exactly as ``F`` does;
- it ends with the first end-of-turn token after that.

A first message has no messages before it, and a template may refuse to render none (Qwen3's
reads ``messages[0]``). Then its generation prompt is what a probe user message's render gains by
one, and ``P(0)`` (the template's preamble: a tools block, a default system message) ends where
the longest part of that prompt rendered before the turn's text last starts. The header of a
conversation the assistant opens is thus never supervised, nor the preamble before it.

A turn no method places is never guessed: ``MaskError``, and its conversation is skipped.
"""

from __future__ import annotations

from collections.abc import Callable

from qwen3_trainium.data.chat.template import PROBE_USER

SENTINEL = "\ue002"  # a private-use character: no template or tokenizer gives it a meaning
Render = Callable[..., str]  # (messages, gen=False) -> the template's text


class MaskError(ValueError):
    """A conversation whose mask cannot be made exactly: skipped and counted, never guessed."""


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _marked(message: dict) -> dict:
    """The message with a private-use character in front of its text (content and reasoning)."""
    out = {**message, "content": SENTINEL + message["content"]}
    if "reasoning_content" in message:
        out["reasoning_content"] = SENTINEL + message["reasoning_content"]
    return out


def region(render: Render, messages: list[dict], k: int, full: str, eot: str) -> tuple[int, int, bool]:
    """(start, end, by_difference) of turn k's supervised text in ``full``."""
    before, prompt = _before(render, messages, k, full)
    if not (prompt.startswith(before) and full.startswith(before)):
        raise MaskError(f"message {k}: the render of the messages before it is not a prefix of the whole")
    through = render(messages[: k + 1])
    if full.startswith(through) and through.startswith(prompt):
        end = through.rfind(eot, len(prompt))
        if end < 0:
            raise MaskError(f"message {k}: no {eot} closes the turn")
        return len(prompt), end + len(eot), False
    start = len(before) + _opening(render, messages, k, full, prompt[len(before) :], len(before))
    end = full.find(eot, start)
    if end < 0:
        raise MaskError(f"message {k}: no {eot} closes the turn")
    return start, end + len(eot), True


def _before(render: Render, messages: list[dict], k: int, full: str) -> tuple[str, str]:
    """(P(k), G(k)): the render of the messages before turn k, without and with the generation
    prompt."""
    if k:
        return render(messages[:k]), render(messages[:k], gen=True)
    try:
        return render([]), render([], gen=True)
    except Exception:  # jinja2's UndefinedError, or the template's own raise_exception
        pass
    return _preamble(render, messages, full)


def _preamble(render: Render, messages: list[dict], full: str) -> tuple[str, str]:
    """(P(0), G(0)) of a template that renders no conversation without messages."""
    probe = [{"role": "user", "content": PROBE_USER}]
    plain, generation = render(probe), render(probe, gen=True)
    if not generation.startswith(plain) or generation == plain:
        raise MaskError("message 0: the template adds no generation prompt after a user message")
    generation_prompt = generation[len(plain) :]
    marked = render([_marked(messages[0]), *messages[1:]])
    text_at = marked.find(SENTINEL)
    if text_at < 0:
        raise MaskError("message 0: the template does not render its text verbatim")
    at = -1
    for length in range(len(generation_prompt), 0, -1):
        at = marked.rfind(generation_prompt[:length], 0, text_at)
        if at >= 0:
            break
    if at < 0 or not full.startswith(marked[:at]):
        raise MaskError("message 0: the template does not open it with its generation prompt")
    return marked[:at], marked[:at] + generation_prompt


def _opening(render: Render, messages: list[dict], k: int, full: str, generation_prompt: str, at: int) -> int:
    """How much of the generation prompt opens turn k in ``full`` (from ``at``, where the turn
    starts). Measured on a render whose content starts with a private-use character, which no
    prompt holds, so the match cannot run into the content; that render must open the turn as
    ``full`` does."""
    msgs = [dict(m) for m in messages]
    msgs[k]["content"] = SENTINEL + msgs[k]["content"]
    marked = render(msgs)
    if SENTINEL not in marked[at:]:
        raise MaskError(f"message {k}: the template does not render its content verbatim")
    length = _common_prefix(generation_prompt, marked[at:])
    if not marked.startswith(full[: at + length]):
        raise MaskError(f"message {k}: the template opens the turn differently with other content")
    return length
