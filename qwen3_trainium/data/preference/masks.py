"""Completion masks of a preference pair, by TRL 1.16.0's token rule, and the pair's overflow.

TRL (``DPOTrainer._prepare_dataset``, dpo_trainer.py:1081-1125) renders the prompt with a
generation prompt (``P``) and the prompt followed by each response (``F_chosen``, ``F_rejected``),
tokenizes the three, and starts both completions at ``k``, the shorter of the common token
prefixes of ``P``'s ids with each full render's. A side's completion is its render's ids from
``k`` to the END of the render: with Qwen3's template that includes the ``\\n`` after
``<|im_end|>``, which chat SFT's masks (``data/chat/masks.py``) do not train on. The document of a
side is the whole render (``prompt_ids + chosen_ids`` in TRL's terms); its inputs are ``ids[:-1]``
and its labels ``ids[1:]`` where the target is a completion token.

Where TRL warns and carries on we skip and count instead: a full render that does not start with
the prompt's render, character for character (the template renders the prompt differently once a
response follows), and a message holding a special token's text (as chat SFT does).

A pair is trained in one row, its two sides side by side, so it must fit ``seq_len`` input
positions: ``(len(chosen) - 1) + (len(rejected) - 1) <= seq_len``. ``data.overflow=drop`` drops a
longer pair; ``truncate`` does TRL's ``truncation_mode="keep_start"`` with the largest
``max_length`` that fits the pair (each side cut to at most that many tokens, its end lost), and
drops the pair when its prompt alone is that long (TRL drops ``len(prompt_ids) >= max_length``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qwen3_trainium.data.chat.masks import Doc
from qwen3_trainium.data.chat.template import ChatTokenizer
from qwen3_trainium.data.chat.turns import MaskError
from qwen3_trainium.data.preference.records import SIDES, Pair

# The rule the masks follow, saved in the data identity: a resume under another rule is refused.
MASK_RULE = "dpo: TRL 1.16.0 DPOTrainer completions, from the common token prefix to the render's end"


@dataclass
class PairDocs:
    """A pair's two documents (whole renders, completion tokens marked) and TRL's prompt length."""

    chosen: Doc
    rejected: Doc
    prompt_len: int  # k: TRL's len(prompt_ids)
    truncated: bool = False

    def side(self, name: str) -> Doc:
        return self.chosen if name == "chosen" else self.rejected

    @property
    def length(self) -> int:
        """Input positions the pair takes in a row."""
        return len(self.chosen.ids) - 1 + len(self.rejected.ids) - 1

    @property
    def completion(self) -> int:
        """Completion tokens trained on (labels that are not -100), both sides."""
        return self.chosen.n_supervised + self.rejected.n_supervised

    def trl_ids(self) -> tuple[list[int], list[int], list[int]]:
        """TRL's ``prompt_ids``, ``chosen_ids`` and ``rejected_ids`` of the pair."""
        k = self.prompt_len
        return self.chosen.ids[:k], self.chosen.ids[k:], self.rejected.ids[k:]


@dataclass
class PairCounts:
    """What became of the records: the dry run's and the preview's figures."""

    records: int = 0
    pairs: int = 0
    tokens: int = 0  # input positions of the pairs kept, both sides
    completion: int = 0  # completion tokens trained on, both sides
    dropped: int = 0  # longer than seq_len (data.overflow=drop, or the prompt alone too long)
    truncated: int = 0
    tokens_dropped: int = 0
    tokens_cut: int = 0
    skipped: dict = field(default_factory=dict)  # reason -> count
    first_skip: dict = field(default_factory=dict)  # reason -> where (file:line)
    first_dropped: str = ""

    @property
    def samples(self) -> int:  # chat's name (``chat.masks.Counts``), for pre-flight's checks
        return self.pairs

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.first_skip.setdefault(reason, where)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PairMasker:
    def __init__(self, tok: ChatTokenizer, kwargs: dict | None = None) -> None:
        self.tok, self.kwargs = tok, dict(kwargs or {})

    def render(self, pair: Pair, side: str | None) -> str:
        """The prompt with a generation prompt (``side`` None), or the prompt and that response."""
        conv = pair.conversation(side)
        kwargs = {**self.kwargs, **conv.kwargs}  # the record's own chat_template_kwargs win
        return self.tok.render(conv.messages, add_generation_prompt=side is None, tools=conv.tools, **kwargs)

    def _check_specials(self, pair: Pair) -> None:
        messages = pair.prompt + pair.chosen + pair.rejected
        for s in self.tok.special_texts:
            if any(
                s in str(m.get("content", "")) or s in str(m.get("reasoning_content", "")) for m in messages
            ):
                raise MaskError(f"a message holds the special token text {s}")

    def docs(self, pair: Pair) -> PairDocs:
        """The pair's documents by TRL's rule; MaskError where the prompt's render is not a prefix."""
        self._check_specials(pair)
        prompt = self.render(pair, None)
        prompt_ids, _ = self.tok.encode(prompt)
        ids = {}
        for side in SIDES:
            full = self.render(pair, side)
            if not full.startswith(prompt):
                raise MaskError(
                    f"the prompt's render is not a prefix of the prompt and {side} rendered together"
                )
            ids[side] = self.tok.encode(full)[0]
        k = min(common_prefix(prompt_ids, ids[side]) for side in SIDES)
        chosen, rejected = (Doc(ids[s], [i >= k for i in range(len(ids[s]))]) for s in SIDES)
        return PairDocs(chosen, rejected, k)


def max_length(chosen: int, rejected: int, seq_len: int) -> int:
    """The largest per-side token cap ``m`` (TRL's ``max_length``) with which the pair fits:
    ``min(chosen, m) - 1 + min(rejected, m) - 1 <= seq_len``."""
    shorter = min(chosen, rejected)
    if 2 * shorter - 2 <= seq_len:  # the shorter side whole, the longer one gets the rest
        return seq_len + 2 - shorter
    return (seq_len + 2) // 2  # both sides cut to the same length


def fit(docs: PairDocs, seq_len: int, overflow: str) -> PairDocs | None:
    """The pair within ``seq_len`` input positions: as is, cut (``truncate``), or None (dropped)."""
    if docs.length <= seq_len:
        return docs
    if overflow == "drop":
        return None
    m = max_length(len(docs.chosen.ids), len(docs.rejected.ids), seq_len)
    if docs.prompt_len >= m:
        return None
    chosen, rejected = (
        Doc(d.ids[:m], d.supervised[:m], truncated=True) for d in (docs.chosen, docs.rejected)
    )
    return PairDocs(chosen, rejected, docs.prompt_len, truncated=True)


def encode(
    masker: PairMasker, pair: Pair, seq_len: int, overflow: str, counts: PairCounts
) -> PairDocs | None:
    """The pair's documents within seq_len, or None; every outcome counted in ``counts``."""
    import jinja2

    counts.records += 1
    try:
        docs = masker.docs(pair)
    except MaskError as e:
        counts.skip(f"mask not exact ({e})", pair.where)
        return None
    except jinja2.exceptions.TemplateError as e:
        counts.skip(f"the chat template refused it ({e})", pair.where)
        return None
    fitted = fit(docs, seq_len, overflow)
    if fitted is None:
        counts.dropped += 1
        counts.tokens_dropped += docs.length
        counts.first_dropped = counts.first_dropped or pair.where
        return None
    counts.truncated += fitted.truncated
    counts.tokens_cut += docs.length - fitted.length
    counts.pairs += 1
    counts.tokens += fitted.length
    counts.completion += fitted.completion
    return fitted
