"""Chat records from files or the Hugging Face cache, in one of four formats, as OpenAI messages.

Sources (``data.dataset_path``): a ``.jsonl``/``.json``/``.parquet`` file, a directory of them
(hidden files skipped, sorted), or a Hub dataset id already in the local cache (its snapshot
directory, read the same way; nothing is downloaded). In a directory the split is read from the
file names as ``datasets`` infers it: ``validation``/``valid``/``val``/``dev`` files are held
out, ``test`` files are ignored, ``train`` files (or every other file) are trained on.

Formats (``data.format``, ``auto`` detects each record's from its keys):
- ``messages``: OpenAI ``{"messages": [{"role", "content", "reasoning_content"?, "tool_calls"?,
  "train"?}], "tools"?}``;
- ``sharegpt``: ``{"conversations": [{"from": "human"|"gpt"|"system"|..., "value"}], "system"?}``;
- ``prompt_completion``: ``{"prompt", "completion"}``, each a string or a message list; only the
  completion is trained on (TRL's ``completion_only_loss``), except with ``data.loss_on=all``;
- ``alpaca``: ``{"instruction", "input"?, "output", "system"?}``.
Any record may carry ``chat_template_kwargs`` (e.g. ``{"enable_thinking": false}``).

How each file is read (JSON Lines or one JSON document, UTF-8, Parquet) is ``record_files``'s.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from qwen3_trainium.data.chat.record_files import RecordError, read_records

FORMATS = ("messages", "sharegpt", "prompt_completion", "alpaca")
SUFFIXES = (".jsonl", ".json", ".parquet")
ROLES = ("system", "user", "assistant", "tool")
SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
    "system": "system", "tool": "tool", "observation": "tool", "function_call": "assistant",
}  # fmt: skip
_VALIDATION = re.compile(r"(^|[-_./])(validation|valid|val|dev)([-_.0-9]|$)")
_TEST = re.compile(r"(^|[-_./])(test|eval)([-_.0-9]|$)")
_TRAIN = re.compile(r"(^|[-_./])(train|training)([-_.0-9]|$)")


@dataclass
class Conversation:
    messages: list[dict]
    where: str  # file:line (or file:row) of the record
    tools: list | None = None
    kwargs: dict = field(default_factory=dict)  # chat_template_kwargs


# -- where records live -------------------------------------------------------------------------


def hub_snapshot(repo_id: str) -> str | None:
    """The cached snapshot directory of a Hub dataset (no network), else None."""
    from qwen3_trainium.config.hub import cached_snapshot

    return cached_snapshot(repo_id, repo_type="dataset")


def resolve(path: str) -> str | None:
    """A file or directory for ``data.dataset_path``: itself, or a cached Hub dataset's snapshot."""
    if os.path.exists(path):
        return path
    return hub_snapshot(path)


def data_files(path: str) -> list[str]:
    """The record files of a file or directory (hidden ones skipped, sorted)."""
    if os.path.isfile(path):
        return [path]
    found = []
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [os.path.join(root, n) for n in sorted(names) if not n.startswith(".")]
    return [f for f in found if f.lower().endswith(SUFFIXES)]


def split_of(relative: str) -> str:
    """ "validation", "test", "train" or "" (unnamed), from a file's path below the dataset root."""
    name = relative.lower()
    for split, pattern in (("validation", _VALIDATION), ("test", _TEST), ("train", _TRAIN)):
        if pattern.search(name):
            return split
    return ""


def split_files(path: str) -> dict[str, list[str]]:
    """{"train": [...], "validation": [...]} of a file or directory."""
    files = data_files(path)
    if os.path.isfile(path):
        return {"train": files, "validation": []}
    splits = {f: split_of(os.path.relpath(f, path)) for f in files}
    named_train = [f for f in files if splits[f] == "train"]
    train = named_train or [f for f in files if splits[f] == ""]
    return {"train": train, "validation": [f for f in files if splits[f] == "validation"]}


# -- formats ------------------------------------------------------------------------------------


def detect(record: object) -> str | None:
    if not isinstance(record, dict):
        return None
    if "messages" in record:
        return "messages"
    if "conversations" in record:
        return "sharegpt"
    if "prompt" in record and "completion" in record:
        return "prompt_completion"
    if "instruction" in record and "output" in record:
        return "alpaca"
    return None


def _text(value, where: str, what: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        return "".join(str(p.get("text", "")) for p in value)  # OpenAI text parts
    raise RecordError(where, f"{what} is {type(value).__name__}, not text (only text content is trained on)")


def _message(raw: object, where: str, index: int) -> dict:
    if not isinstance(raw, dict) or "role" not in raw:
        keys = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise RecordError(where, f"message {index} has no role (found {keys})")
    role = raw["role"]
    if role not in ROLES:
        raise RecordError(where, f"message {index} has role {role!r}; the roles are {', '.join(ROLES)}")
    message = {"role": role, "content": _text(raw.get("content"), where, f"message {index}'s content")}
    reasoning = raw.get("reasoning_content")
    if reasoning is not None:
        message["reasoning_content"] = _text(reasoning, where, f"message {index}'s reasoning_content")
    for key in ("tool_calls", "name", "tool_call_id"):
        if raw.get(key) is not None:
            message[key] = raw[key]
    if "train" in raw and raw["train"] is not None:
        if not isinstance(raw["train"], bool):
            raise RecordError(where, f"message {index} has train={raw['train']!r}; it is true or false")
        message["train"] = raw["train"]
    return message


def _messages(raw: object, where: str, what: str = "messages") -> list[dict]:
    if not isinstance(raw, list):
        raise RecordError(where, f"{what} is {type(raw).__name__}, not a list of messages")
    return [_message(m, where, i) for i, m in enumerate(raw)]


def _sharegpt(record: dict, where: str) -> list[dict]:
    turns = record["conversations"]
    if not isinstance(turns, list):
        raise RecordError(where, f"conversations is {type(turns).__name__}, not a list")
    messages = [{"role": "system", "content": record["system"]}] if record.get("system") else []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
            keys = sorted(turn) if isinstance(turn, dict) else type(turn).__name__
            raise RecordError(where, f"conversations[{i}] needs from and value (found {keys})")
        role = SHAREGPT_ROLES.get(str(turn["from"]).lower())
        if role is None:
            known = ", ".join(sorted(SHAREGPT_ROLES))
            raise RecordError(where, f"conversations[{i}] is from {turn['from']!r}; known: {known}")
        message = {"role": role, "content": _text(turn["value"], where, f"conversations[{i}].value")}
        if isinstance(turn.get("train"), bool):
            message["train"] = turn["train"]
        messages.append(message)
    return messages


def _prompt_completion(record: dict, where: str) -> list[dict]:
    prompt, completion = record["prompt"], record["completion"]
    if isinstance(prompt, str):
        prompt_messages = [{"role": "user", "content": prompt}]
    else:
        prompt_messages = _messages(prompt, where, "prompt")
    if isinstance(completion, str):
        completion_messages = [{"role": "assistant", "content": completion}]
    else:
        completion_messages = _messages(completion, where, "completion")
    for message in prompt_messages:  # the prompt is context, never a target
        if message["role"] == "assistant":
            message["train"] = False
    return prompt_messages + completion_messages


def _alpaca(record: dict, where: str) -> list[dict]:
    instruction = _text(record["instruction"], where, "instruction")
    extra = _text(record.get("input"), where, "input")
    messages = (
        [{"role": "system", "content": _text(record["system"], where, "system")}]
        if record.get("system")
        else []
    )
    user = f"{instruction}\n\n{extra}" if extra else instruction
    return messages + [
        {"role": "user", "content": user},
        {"role": "assistant", "content": _text(record["output"], where, "output")},
    ]


def conversation(record: object, where: str, fmt: str = "auto") -> Conversation:
    """One record as a Conversation; a RecordError names what is missing or wrong."""
    found = detect(record)
    if fmt != "auto" and found != fmt:
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise RecordError(where, f"not a {fmt} record (keys found: {keys})")
    if found is None:
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise RecordError(
            where,
            f"no known chat format (keys found: {keys}); expected messages, conversations,"
            " prompt+completion or instruction+output",
        )
    assert isinstance(record, dict)
    build = {"messages": lambda r, w: _messages(r["messages"], w), "sharegpt": _sharegpt,
             "prompt_completion": _prompt_completion, "alpaca": _alpaca}[found]  # fmt: skip
    messages = build(record, where)
    if not any(m["role"] == "assistant" for m in messages):
        raise RecordError(where, "no assistant message: nothing to learn from")
    kwargs = record.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RecordError(where, f"chat_template_kwargs is {type(kwargs).__name__}, not a mapping")
    tools = record.get("tools")
    if isinstance(tools, str):  # some exports keep tools as a JSON string
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError:
            raise RecordError(where, "tools is a string that is not JSON") from None
    return Conversation(messages=messages, where=where, tools=tools or None, kwargs=dict(kwargs))


def load(files: list[str], fmt: str = "auto") -> list[Conversation]:
    """Every record of ``files`` as a Conversation; the first bad one raises a RecordError."""
    return [conversation(record, where, fmt) for where, record in read_records(files)]
