"""``data.overflow=truncate``: a sample longer than ``training.seq_len`` loses reasoning, not its
answer.

A long thinking trace is mostly reasoning; cutting the sample's end (what a plain truncation does)
would drop the final answer and the end-of-turn token, so the model would be trained on reasoning
that never concludes and never stops. Instead the reasoning is cut in its middle (its opening and
its conclusion, which leads into the answer, are kept) by as many tokens as the sample is over,
the conversation is rendered again and its masks are made again by the usual exact method
(``masks.py``): the sample is exactly what the template renders for the shortened reasoning, and
the whole final answer and its ``<|im_end|>`` stay supervised. Assistant turns are tried from the
last to the first (Qwen3 renders only the reasoning after the last user message; a turn whose
reasoning the template drops changes nothing and is passed over); token counts are not quite
additive at the cut's seam, so the render is measured again and cut further until it fits.

It cannot when the sample is still too long with every rendered reasoning removed (or has none):
then the end is cut as before, and the reason is counted (the dry run prints it).
"""

from __future__ import annotations

from collections.abc import Callable

NO_REASONING = "no reasoning to cut (the answer and the rest are past seq_len)"


def _middle_cut(tok, text: str, tokens: int) -> str:
    """``text`` less ``tokens`` of its tokens from the middle (all of it when it has no more)."""
    _, offsets = tok.encode(text)
    n = len(offsets)
    if tokens >= n:
        return ""
    start = (n - tokens) // 2
    end = start + tokens
    return text[: offsets[start][0]] + (text[offsets[end][0] :] if end < n else "")


def cut_reasoning(remask: Callable, tok, conv, length: int, seq_len: int) -> tuple[object | None, str]:
    """(the sample within ``seq_len`` with its reasoning cut, "") or (None, why it cannot).
    ``remask(conversation) -> Doc`` masks a conversation as the run does; ``length``: the
    sample's input positions now."""
    from qwen3_trainium.data.chat.records import Conversation

    messages = [dict(m) for m in conv.messages]
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("reasoning_content")]
    for i in reversed(turns):
        extra = 0  # tokens cut beyond the overshoot, grown when a cut gains nothing
        while messages[i]["reasoning_content"]:
            cut = length - seq_len + extra
            messages[i]["reasoning_content"] = _middle_cut(tok, messages[i]["reasoning_content"], cut)
            doc = remask(Conversation(messages, conv.where, conv.tools, conv.kwargs))
            now = len(doc.ids) - 1
            if now <= seq_len:
                return doc, ""
            # no gain: a seam merged tokens, or the template does not render this reasoning (then
            # it is cut away in a few doubling steps, and the turn before is tried)
            extra = 0 if now < length else max(1, 2 * extra)
            length = min(length, now)
    if not turns:
        return None, NO_REASONING
    return None, "still past seq_len with the reasoning cut out (the answer and the rest are too long)"
