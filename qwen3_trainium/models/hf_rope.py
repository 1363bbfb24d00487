"""The RoPE keys of an exported ``config.json``, in both of Hugging Face's forms.

- Transformers 5: ``rope_parameters`` = {rope_type, rope_theta, and YaRN's keys}
  (``models/qwen3/configuration_qwen3.py:74``);
- Transformers 4.x (and vLLM on it): top-level ``rope_theta`` and ``rope_scaling`` (null, or the
  YaRN dict), as every published Qwen3 config.json has them. A 4.x reader of a 5-only file would
  use its default theta, 10000.

Both are written, with the same content: Transformers 5 lets a non-null ``rope_scaling`` replace
``rope_parameters`` wholesale and then fills in the top-level ``rope_theta``
(``modeling_rope_utils.py:775-804``); vLLM on Transformers 4 copies the top-level ``rope_theta``
into the dict (``vllm/transformers_utils/config.py`` ``patch_rope_parameters``).
``max_position_embeddings`` is the model's (``config/rope.py``), never ``training.seq_len``.
"""

from __future__ import annotations

import json
import math

from qwen3_trainium.config.rope import YARN_KEYS, Rope, checkpoint_rope

COMPARED = ("rope_type",) + YARN_KEYS + ("mscale", "mscale_all_dim", "truncate")


def rope_fields(rope: Rope, theta: float) -> dict:
    """``max_position_embeddings``, ``rope_theta``, ``rope_scaling`` and ``rope_parameters``."""
    scaling = rope.scaling_dict()
    return {
        "max_position_embeddings": rope.max_position_embeddings,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "rope_parameters": {"rope_theta": theta, **(scaling or {"rope_type": "default"})},
    }


def _equal(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b))
    return a == b


def same_rope(config: dict, rope: Rope) -> bool:
    """Whether Transformers reads ``rope`` (and its max_position_embeddings) from ``config``."""
    own = checkpoint_rope(config)
    if config.get("max_position_embeddings") != rope.max_position_embeddings:
        return False
    if own["rope_type"] != rope.rope_type:
        return False
    return not rope.yarn or all(_equal(own.get(k), getattr(rope, k)) for k in COMPARED if k != "rope_type")


def with_rope(config: dict, rope: Rope) -> dict:
    """``config`` (a source's config.json) carrying ``rope``: unchanged keys where it already says
    it, the other form added where it has one only; every RoPE key rewritten where it does not.
    ``rope_theta`` stays the source's (the flavor check holds the flavor's to it)."""
    own = checkpoint_rope(config)
    theta = own["rope_theta"]
    if not same_rope(config, rope):
        return config | rope_fields(rope, theta)
    added = dict(config)
    added.setdefault("rope_theta", theta)
    if "rope_scaling" not in added:
        scaling = {k: v for k, v in own.items() if k != "rope_theta"}
        added["rope_scaling"] = scaling if rope.yarn else None
    added.setdefault("rope_parameters", {"rope_theta": theta, **own})
    return added


def config_json(source_text: str, rope: Rope) -> str:
    """A source config.json's text with ``rope`` written in: verbatim if it holds both forms already."""
    config = json.loads(source_text)
    updated = with_rope(config, rope)
    if updated == config:
        return source_text
    return json.dumps(updated, indent=2) + "\n"
