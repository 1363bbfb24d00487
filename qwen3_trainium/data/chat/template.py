"""The model's own chat template, rendered as Transformers renders it, and its tokenizer.

Where the template comes from, first found wins: ``data.chat_template`` (a ``.jinja`` file, or a
``tokenizer_config.json``-style JSON holding ``chat_template``), the tokenizer directory's
``chat_template.jinja``, then its ``tokenizer_config.json``'s ``chat_template`` (a string, or a
list of named templates: ``default``). This is the order Transformers loads them in
(``PreTrainedTokenizerBase.from_pretrained``: ``chat_template.jinja`` wins over the JSON field).

Rendering mirrors ``transformers.utils.chat_template_utils._compile_jinja_template``: a sandboxed
Jinja environment with ``trim_blocks`` and ``lstrip_blocks``, ``loopcontrols``, a ``tojson`` filter
that keeps non-ASCII, ``raise_exception`` and ``strftime_now``, the special tokens as variables,
and ``{% generation %}`` blocks rendered as plain text. The tests hold our renders equal to
``apply_chat_template``'s on the same template.

The tokenizer is ``tokenizers``' own (what torchtitan's ``HuggingFaceTokenizer`` wraps); the text
a template renders already holds every special token, so it is encoded with no additions.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
# Private-use characters: no template or tokenizer gives them a meaning.
PROBE_USER, PROBE_ASSISTANT = "\ue000", "\ue001"


class TemplateError(ValueError):
    pass


def _special(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def find_template(tokenizer_dir: str, override: str | None = None) -> tuple[str, str] | None:
    """(template text, where it came from), or None when neither place has one."""
    if override:
        with open(override, encoding="utf-8") as f:
            text = f.read()
        if override.lower().endswith(".json"):
            found = _from_config(json.loads(text))
            if found is None:
                raise TemplateError(f"{override} has no chat_template field")
            return found, override
        return text, override
    jinja = os.path.join(tokenizer_dir, TEMPLATE_FILE)
    if os.path.isfile(jinja):
        with open(jinja, encoding="utf-8") as f:
            return f.read(), jinja
    config = os.path.join(tokenizer_dir, CONFIG_FILE)
    if os.path.isfile(config):
        with open(config, encoding="utf-8") as f:
            found = _from_config(json.load(f))
        if found is not None:
            return found, config
    return None


def _from_config(config: dict) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates (Transformers: "default" is the chat one)
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) and template.strip() else None


@functools.lru_cache(maxsize=8)
def _compile(text: str):
    from datetime import datetime

    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` (Transformers' assistant-mask tags): the body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(text)


@dataclass
class ChatTokenizer:
    """A tokenizer directory plus the chat template the run uses."""

    tokenizer_dir: str
    template: str
    template_source: str

    @classmethod
    def load(cls, tokenizer_dir: str, override: str | None = None) -> ChatTokenizer:
        found = find_template(tokenizer_dir, override)
        if found is None:
            raise TemplateError(f"no chat template in {tokenizer_dir}")
        return cls(tokenizer_dir, *found)

    @functools.cached_property
    def _config(self) -> dict:
        path = os.path.join(self.tokenizer_dir, CONFIG_FILE)
        if not os.path.isfile(path):
            return {}
        with open(path, encoding="utf-8") as f:
            return json.load(f)

    @functools.cached_property
    def tokenizer(self):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(os.path.join(self.tokenizer_dir, "tokenizer.json"))
        tok.post_processor = None  # ids unchanged; offsets stay untrimmed (ByteLevel trims spaces)
        return tok

    @functools.cached_property
    def special_tokens(self) -> dict[str, str]:
        names = ("bos_token", "eos_token", "pad_token", "unk_token")
        values = {n: _special(self._config.get(n)) for n in names}
        return {n: v for n, v in values.items() if v}

    def render(
        self, messages: list[dict], *, add_generation_prompt: bool = False, tools=None, **kwargs
    ) -> str:
        return _compile(self.template).render(
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            **self.special_tokens,
            **kwargs,
        )

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        enc = self.tokenizer.encode(text, add_special_tokens=False)
        return enc.ids, enc.offsets

    @functools.cached_property
    def end_of_turn(self) -> str:
        """The special token a template closes an assistant turn with (Qwen3: ``<|im_end|>``):
        the first special token rendered after an assistant message's content."""
        probe = [{"role": "user", "content": PROBE_USER}, {"role": "assistant", "content": PROBE_ASSISTANT}]
        text = self.render(probe)
        at = text.find(PROBE_ASSISTANT)
        if at < 0:
            raise TemplateError(
                f"the chat template ({self.template_source}) does not render an assistant message's content"
            )
        specials = {t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special}
        ids, offsets = self.encode(text[at + 1 :])
        for token_id, _ in zip(ids, offsets, strict=False):
            token = self.tokenizer.id_to_token(token_id)
            if token in specials:
                return token
        raise TemplateError(
            f"the chat template ({self.template_source}) ends an assistant turn with no special token:"
            " the model could not learn to stop"
        )

    @functools.cached_property
    def end_of_turn_id(self) -> int:
        return self.tokenizer.token_to_id(self.end_of_turn)

    @functools.cached_property
    def pad_id(self) -> int:
        for name in ("pad_token", "eos_token"):
            token = self.special_tokens.get(name)
            if token and self.tokenizer.token_to_id(token) is not None:
                return self.tokenizer.token_to_id(token)
        return self.end_of_turn_id

    @functools.cached_property
    def special_texts(self) -> tuple[str, ...]:
        return tuple(t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special)

    def prompt_ids(self, prompt: str, **kwargs) -> list[int]:
        """A user prompt as inference sees it: the template with a generation prompt."""
        text = self.render([{"role": "user", "content": prompt}], add_generation_prompt=True, **kwargs)
        return self.encode(text)[0]
