"""Exact loss masks: which tokens of a rendered conversation the model is trained to produce.

A trained assistant turn is supervised from the end of its generation prompt (what inference
puts before the model's first token, e.g. ``<|im_start|>assistant\\n``) through its end-of-turn
token (``<|im_end|>``): reasoning the template renders, the content, tool calls and the token
that makes the model stop. Nothing else is, except with ``loss_on=all``.

Each turn's text is found by rendering alone (``turns.py``); a turn no method places exactly is
never guessed: its conversation is skipped and counted.

``history_thinking``: ``as_rendered`` trains on ``F`` as inference would see the conversation
later (earlier turns' reasoning dropped where the template drops it); ``keep`` makes one sample
per trained turn, rendered up to that turn, so every turn's reasoning is trained on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qwen3_trainium.data.chat.records import Conversation
from qwen3_trainium.data.chat.template import ChatTokenizer
from qwen3_trainium.data.chat.turns import MaskError, region

IGNORE_INDEX = -100  # torchtitan.components.loss.IGNORE_INDEX
LOSS_ON = ("assistant", "last_assistant", "all")
HISTORY_THINKING = ("as_rendered", "keep")
OVERFLOW = ("drop", "truncate")


@dataclass
class Doc:
    """One training sample: token ids and, for each, whether the model is trained to produce it."""

    ids: list[int]
    supervised: list[bool]
    truncated: bool = False

    def inputs_labels(self) -> tuple[list[int], list[int]]:
        """Next-token pairs within the document: inputs ``ids[:-1]``, labels ``ids[1:]`` or -100."""
        labels = [t if s else IGNORE_INDEX for t, s in zip(self.ids[1:], self.supervised[1:], strict=False)]
        return self.ids[:-1], labels

    @property
    def n_supervised(self) -> int:
        return sum(self.supervised[1:])


@dataclass
class Counts:
    """What became of the records: the dry run's and the preview's figures."""

    records: int = 0
    samples: int = 0
    tokens: int = 0  # input positions of the samples kept
    supervised: int = 0
    dropped: int = 0  # longer than seq_len, data.overflow=drop
    truncated: int = 0
    skipped: dict = field(default_factory=dict)  # reason -> count
    fallback_turns: int = 0  # turns placed by difference (the template breaks the prefix property)
    tokens_dropped: int = 0  # input positions of the samples dropped
    tokens_cut: int = 0  # input positions truncation removed
    cut_in_reasoning: int = 0  # truncated inside the reasoning, the final answer kept (overflow.py)
    cut_at_end: dict = field(default_factory=dict)  # why not -> truncated at the end instead
    first_skip: dict = field(default_factory=dict)  # reason -> where (file:line)

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.first_skip.setdefault(reason, where)


class Masker:
    def __init__(self, tok: ChatTokenizer, *, loss_on: str = "assistant", history_thinking: str = "as_rendered",
                 kwargs: dict | None = None) -> None:  # fmt: skip
        self.tok, self.loss_on, self.history_thinking = tok, loss_on, history_thinking
        self.kwargs = dict(kwargs or {})
        self.eot = tok.end_of_turn

    def normalise(self, conv: Conversation) -> Conversation:
        """Inline ``<think>…</think>`` in an assistant's content as ``reasoning_content``, split
        exactly as Qwen3's template splits it, for templates that read ``reasoning_content``: the
        render is unchanged, and the reasoning is a field the masks can place."""
        if "reasoning_content" not in self.tok.template:
            return conv
        messages = []
        for m in conv.messages:
            content = m["content"]
            if m["role"] == "assistant" and "reasoning_content" not in m and "</think>" in content:
                m = {**m, "reasoning_content": content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n"),
                     "content": content.split("</think>")[-1].lstrip("\n")}  # fmt: skip
            messages.append(m)
        return Conversation(messages, conv.where, conv.tools, conv.kwargs)

    def _render(self, conv: Conversation, messages: list[dict], gen: bool = False) -> str:
        kwargs = {**self.kwargs, **conv.kwargs}
        clean = [{k: v for k, v in m.items() if k != "train"} for m in messages]
        return self.tok.render(clean, add_generation_prompt=gen, tools=conv.tools, **kwargs)

    def trained_turns(self, conv: Conversation) -> list[int]:
        assistants = [i for i, m in enumerate(conv.messages) if m["role"] == "assistant"]
        if self.loss_on == "last_assistant":
            assistants = assistants[-1:]
        return [i for i in assistants if conv.messages[i].get("train", True)]

    def turn_region(self, conv: Conversation, k: int, full: str) -> tuple[int, int, bool]:
        """(start, end, by_difference) of turn k's supervised text in ``full``."""

        def render(messages: list[dict], gen: bool = False) -> str:
            return self._render(conv, messages, gen)

        return region(render, conv.messages, k, full, self.eot)

    def regions(
        self, conv: Conversation, messages_end: int | None = None
    ) -> tuple[str, list[tuple[int, int]], int]:
        """(render, supervised character regions, turns placed by difference) of the conversation,
        or of its first ``messages_end`` messages (history_thinking=keep)."""
        view = (
            conv
            if messages_end is None
            else Conversation(conv.messages[:messages_end], conv.where, conv.tools, conv.kwargs)
        )
        full = self._render(view, view.messages)
        turns = self.trained_turns(view)
        if messages_end is not None:
            turns = [t for t in turns if t == messages_end - 1]
        placed = [self.turn_region(view, k, full) for k in turns]
        fallback = sum(1 for *_, by_difference in placed if by_difference)
        regions = [(a, b) for a, b, _ in placed]
        if self.loss_on == "all":
            excluded = [self.turn_region(view, k, full)[:2] for k, m in enumerate(view.messages)
                        if m["role"] == "assistant" and m.get("train") is False]  # fmt: skip
            regions, at = [], 0
            for a, b in sorted(excluded):
                regions.append((at, a))
                at = b
            regions.append((at, len(full)))
        return full, regions, fallback

    def docs(self, conv: Conversation, counts: Counts | None = None) -> list[Doc]:
        """The samples of one conversation (history_thinking=keep: one per trained turn)."""
        return [doc for *_, doc in self.samples(conv, counts)]

    def samples(self, conv: Conversation, counts: Counts | None = None) -> list[tuple]:
        """Each sample as (view, end, Doc): the conversation it renders (normalised; with
        history_thinking=keep the messages up to its turn, ``end``), from which ``doc(view, end)``
        makes it again once edited (``overflow.py``)."""
        counts = counts if counts is not None else Counts()
        conv = self.normalise(conv)
        specials = [
            s
            for s in self.tok.special_texts
            if any(s in m["content"] or s in m.get("reasoning_content", "") for m in conv.messages)
        ]
        if specials:
            raise MaskError(f"a message holds the special token text {specials[0]}")
        if self.history_thinking == "keep" and self.loss_on != "all":
            ends = [k + 1 for k in self.trained_turns(conv)]
        else:
            ends = [None]
        out = []
        for end in ends:
            view = (
                conv
                if end is None
                else Conversation(conv.messages[:end], conv.where, conv.tools, conv.kwargs)
            )
            out.append((view, end, self.doc(view, end, counts)))
        return out

    def doc(self, view: Conversation, end: int | None, counts: Counts) -> Doc:
        """The sample of ``view`` (``end``: its last message's turn alone is trained, as ``keep``)."""
        text, regions, fallback = self.regions(view, end)
        counts.fallback_turns += fallback
        ids, offsets = self.tok.encode(text)
        supervised = [any(s < b and e > a for a, b in regions) for s, e in offsets]
        return Doc(ids, supervised)


def fit(doc: Doc, seq_len: int, overflow: str) -> Doc | None:
    """The document within seq_len input positions: as is, its end cut, or None (dropped)."""
    if len(doc.ids) - 1 <= seq_len:
        return doc
    if overflow == "drop":
        return None
    return Doc(doc.ids[: seq_len + 1], doc.supervised[: seq_len + 1], truncated=True)


def _fitted(masker: Masker, sample: tuple, seq_len: int, overflow: str, counts: Counts) -> Doc | None:
    """The sample within seq_len (``overflow.py``: truncation cuts reasoning first), counted."""
    from qwen3_trainium.data.chat.overflow import cut_reasoning

    view, end, doc = sample
    length = len(doc.ids) - 1
    if length <= seq_len:
        return doc
    if overflow == "drop":
        counts.dropped += 1
        counts.tokens_dropped += length
        return None
    cut, why = cut_reasoning(lambda v: masker.doc(v, end, Counts()), masker.tok, view, length, seq_len)
    if cut is not None:
        counts.cut_in_reasoning += 1
        fitted = Doc(cut.ids, cut.supervised, truncated=True)
    else:
        counts.cut_at_end[why] = counts.cut_at_end.get(why, 0) + 1
        fitted = fit(doc, seq_len, overflow)
    counts.tokens_cut += length - (len(fitted.ids) - 1)
    return fitted


def encode(masker: Masker, conv: Conversation, seq_len: int, overflow: str, counts: Counts) -> list[Doc]:
    """The trainable samples of one conversation, every outcome counted in ``counts``."""
    import jinja2

    counts.records += 1
    try:
        samples = masker.samples(conv, counts)
    except MaskError as e:
        counts.skip(f"mask not exact ({e})", conv.where)
        return []
    except jinja2.exceptions.TemplateError as e:
        counts.skip(f"the chat template refused it ({e})", conv.where)
        return []
    kept = []
    for sample in samples:
        fitted = _fitted(masker, sample, seq_len, overflow, counts)
        if fitted is None:
            continue
        if fitted.n_supervised == 0:
            counts.skip("no supervised token" + (" after truncation" if fitted.truncated else ""), conv.where)
            continue
        counts.truncated += fitted.truncated
        counts.samples += 1
        counts.tokens += len(fitted.ids) - 1
        counts.supervised += fitted.n_supervised
        kept.append(fitted)
    return kept
