"""Preference records in TRL's formats, as a prompt and two responses of chat messages.

Formats (TRL 1.16.0, ``DPOTrainer._prepare_dataset`` and ``data_utils.extract_prompt``):
- explicit: ``{"prompt", "chosen", "rejected"}``;
- implicit prompt: ``{"chosen", "rejected"}``, the prompt being their longest common prefix (a
  message-list prefix, or a character prefix for strings, which gives up a space just before
  the point where they differ: TRL's ``extract_prompt``).
Each value is a message list (conversational) or a string; one record is one or the other. A
record may carry ``tools`` (a list, or a JSON string) and ``chat_template_kwargs``, which go to
every render of it, as in TRL.

Deviation from TRL, on purpose: a string record is not tokenized as plain text with the EOS text
appended (TRL's "standard" format) but as chat, the prompt a user message and each response an
assistant message (as ``data/chat/records.py`` reads ``{prompt, completion}``), so that every
side goes through the model's chat template. TRL gives the same ids for the conversational form
of the record (the tests hold that).

Refused, naming the file and line (``RecordError``): a record without ``chosen`` and
``rejected``; one mixing strings and message lists; equal responses; an implicit prompt where one
response is a prefix of the other, or either is empty, or nothing is common (TRL's
``extract_prompt`` then cuts at its loop's last index or fails); a response that holds a user or
system message or does not end with an assistant message; a prompt that ends with one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from qwen3_trainium.data.chat.record_files import RecordError, read_records
from qwen3_trainium.data.chat.records import Conversation
from qwen3_trainium.data.chat.records import _messages as chat_messages  # the chat reader's checks

SIDES = ("chosen", "rejected")
SIDE_ROLES = ("assistant", "tool")  # a response may call tools and read their results


@dataclass
class Pair:
    """One preference record: a prompt and two responses, each a list of messages."""

    prompt: list[dict]
    chosen: list[dict]
    rejected: list[dict]
    where: str  # file:line (or file:row) of the record
    tools: list | None = None
    kwargs: dict = field(default_factory=dict)  # the record's chat_template_kwargs

    def side(self, name: str) -> list[dict]:
        return self.chosen if name == "chosen" else self.rejected

    def conversation(self, name: str | None = None) -> Conversation:
        """The prompt, then the ``name`` response (none: the prompt alone)."""
        return Conversation(
            self.prompt + (self.side(name) if name else []), self.where, self.tools, self.kwargs
        )


def is_preference(record: object) -> bool:
    return isinstance(record, dict) and "chosen" in record and "rejected" in record


def extract_prompt(chosen, rejected, where: str) -> tuple:
    """(prompt, chosen, rejected) of an implicit-prompt record: TRL 1.16.0's ``extract_prompt``
    (data_utils.py), its quirk cases refused."""
    n = min(len(chosen), len(rejected))
    if not n:
        raise RecordError(where, "a response is empty: there is nothing to compare")
    idx = next((i for i in range(n) if chosen[i] != rejected[i]), None)
    if idx is None:  # TRL's loop never breaks: it would cut at n - 1, inside the common part
        what = (
            "chosen equals rejected"
            if len(chosen) == len(rejected)
            else "one response is a prefix of the other"
        )
        raise RecordError(where, f"{what}: the implicit prompt (their common prefix) leaves no difference")
    if idx and chosen[idx - 1] == " ":  # TRL: the prompt gives up the space before the difference
        idx -= 1
    if idx == 0:
        raise RecordError(
            where, "chosen and rejected have no common prefix: the implicit prompt would be empty"
        )
    return chosen[:idx], chosen[idx:], rejected[idx:]


def _kind(record: dict, keys: tuple[str, ...], where: str) -> str:
    """ "string" or "messages": what every value of the record is."""
    for k in keys:
        if not isinstance(record[k], (str, list)):
            raise RecordError(where, f"{k} is {type(record[k]).__name__}, not a string or a list of messages")
    kinds = {k: "string" if isinstance(record[k], str) else "messages" for k in keys}
    if len(set(kinds.values())) > 1:
        found = ", ".join(
            f"{k} is {'a string' if v == 'string' else 'a message list'}" for k, v in kinds.items()
        )
        raise RecordError(where, f"mixes strings and message lists ({found}); give all of them in one form")
    return next(iter(kinds.values()))


def _as_messages(value, role: str, where: str, what: str) -> list[dict]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    messages = chat_messages(value, where, what)
    return [{k: v for k, v in m.items() if k != "train"} for m in messages]  # "train" is chat SFT's


def _check_roles(pair: Pair) -> None:
    if not pair.prompt:
        raise RecordError(pair.where, "the prompt has no message")
    if pair.prompt[-1]["role"] == "assistant":
        raise RecordError(
            pair.where, "the prompt ends with an assistant message: the responses would continue it"
        )
    for name in SIDES:
        side = pair.side(name)
        if not side:
            raise RecordError(pair.where, f"{name} is empty")
        other = [m["role"] for m in side if m["role"] not in SIDE_ROLES]
        if other:
            raise RecordError(
                pair.where, f"{name} holds a {other[0]} message; a response is assistant (and tool) messages"
            )
        if side[-1]["role"] != "assistant":
            raise RecordError(
                pair.where, f"{name} ends with a {side[-1]['role']} message, not the assistant's"
            )
    if pair.chosen == pair.rejected:
        raise RecordError(pair.where, "chosen equals rejected: there is nothing to prefer")


def _extras(record: dict, where: str) -> tuple[list | None, dict]:
    """(tools, chat_template_kwargs) of a record, read as TRL reads them."""
    kwargs = record.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RecordError(where, f"chat_template_kwargs is {type(kwargs).__name__}, not a mapping")
    tools = record.get("tools")
    if isinstance(tools, str):  # TRL: json.loads of a string
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
            raise RecordError(where, "tools is a string that is not JSON") from None
    if tools is not None and not isinstance(tools, list):
        raise RecordError(where, f"tools is {type(tools).__name__}, not a list")
    return tools or None, dict(kwargs)


def pair(record: object, where: str) -> Pair:
    """One record as a Pair; a RecordError names what is missing or wrong."""
    if not is_preference(record):
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise RecordError(
            where,
            f"not a preference record (keys found: {keys}); expected chosen and rejected (and a prompt)",
        )
    assert isinstance(record, dict)
    explicit = "prompt" in record
    keys = ("prompt", *SIDES) if explicit else SIDES
    kind = _kind(record, keys, where)
    prompt, chosen, rejected = (
        (record["prompt"], record["chosen"], record["rejected"])
        if explicit
        else extract_prompt(record["chosen"], record["rejected"], where)
    )
    if kind == "string" and not (chosen and rejected):
        raise RecordError(where, "a response is empty")
    tools, kwargs = _extras(record, where)
    out = Pair(
        prompt=_as_messages(prompt, "user", where, "prompt"),
        chosen=_as_messages(chosen, "assistant", where, "chosen"),
        rejected=_as_messages(rejected, "assistant", where, "rejected"),
        where=where,
        tools=tools,
        kwargs=kwargs,
    )
    _check_roles(out)
    return out


def load(files: list[str]) -> list[Pair]:
    """Every record of ``files`` as a Pair; the first bad one raises a RecordError."""
    return [pair(record, where) for where, record in read_records(files)]
