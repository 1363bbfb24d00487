"""The model's RoPE, resolved once for pre-flight, the ranks and the HF export: ``model.rope_scaling``
and ``model.max_position_embeddings`` against the HF checkpoint's ``config.json`` and the flavor's
table. Standard library only (pre-flight's quick tier reads it).

``config.json`` is read as Transformers 5.24 reads it (``modeling_rope_utils.py``,
``convert_rope_params_to_dict`` :775-804 and ``standardize_rope_params`` :806-866): a non-null
legacy ``rope_scaling`` (4.x form) replaces ``rope_parameters`` (5.x form); a top-level
``rope_theta`` fills a dict without one; legacy ``type`` is ``rope_type``; for yarn a missing
``original_max_position_embeddings`` is the config's ``max_position_embeddings`` (Qwen3's config
class keeps no top-level one to prefer). ``tests/models/test_rope_config.py`` holds this against ``AutoConfig``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

YARN = "yarn"
DEFAULT = "default"
DEFAULT_THETA = 10000.0  # Transformers' PreTrainedConfig.default_theta: a config.json with no theta
QWEN3_ORIGINAL = 32768  # Qwen3's pretraining context (Qwen3 docs, "Enabling Long Context")
# The keys of a yarn rope_scaling this project computes (Transformers' _compute_yarn_parameters).
YARN_KEYS = ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow")


@dataclass(frozen=True)
class Rope:
    """What the model trains with and what the export writes (``rope_theta`` is the flavor's)."""

    rope_type: str  # "default" or "yarn"
    max_position_embeddings: int
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    attention_factor: float | None = None  # explicit only; see scale()
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None  # a checkpoint's own (DeepSeek-style); never written for Qwen3
    mscale_all_dim: float | None = None
    truncate: bool | None = None

    @property
    def yarn(self) -> bool:
        return self.rope_type == YARN

    def scale(self) -> float:
        """The factor HF multiplies cos and sin by (``_compute_yarn_parameters`` :430-440)."""
        if not self.yarn:
            return 1.0
        if self.attention_factor is not None:
            return float(self.attention_factor)
        factor = float(self.factor)
        if self.mscale and self.mscale_all_dim:
            return _mscale(factor, self.mscale) / _mscale(factor, self.mscale_all_dim)
        return _mscale(factor)

    def scaling_dict(self) -> dict | None:
        """The ``rope_scaling`` dict of config.json (without rope_theta): None for default RoPE."""
        if not self.yarn:
            return None
        keys = ("rope_type",) + YARN_KEYS + ("mscale", "mscale_all_dim", "truncate")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


def _mscale(scale: float, m: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def checkpoint_rope(config: dict) -> dict:
    """``rope_parameters`` as Transformers 5 makes it from a config.json dict (either form)."""
    legacy = config.get("rope_scaling")
    params = dict(legacy or config.get("rope_parameters") or {})
    params.setdefault("rope_theta", config.get("rope_theta", DEFAULT_THETA))
    params["rope_type"] = params.get("rope_type", params.get("type")) or DEFAULT  # "type" stays, as there
    if params["rope_type"] == YARN:  # a top-level original_max_position_embeddings is not read for Qwen3
        params.setdefault("original_max_position_embeddings", config.get("max_position_embeddings"))
    return params


def read_config(model_dir: str | None) -> dict | None:
    """A model directory's config.json as a dict; None where there is none (or it is unreadable:
    the model and checkpoint checks report that)."""
    if not model_dir:
        return None
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            found = json.load(f)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def source_dir(run) -> str | None:
    """The HF directory whose config.json defines the model: model=hf's hf_model, or the
    directory an HF fine-tune starts from."""
    from qwen3_trainium.config import hub

    if run.model.path.value == "hf":
        name = run.model.hf_model
        return os.path.abspath(name) if os.path.isdir(name) else hub.cached_snapshot(name)
    ckpt = run.checkpoint
    if ckpt.enable and ckpt.initial_load_in_hf and ckpt.initial_load_path:
        return ckpt.initial_load_path
    return None


def explicit(conf) -> dict:
    """The yarn fields ``model.rope_scaling`` sets (None left out)."""
    return {k: getattr(conf, k) for k in YARN_KEYS if getattr(conf, k) is not None}


def conflicts(conf, source: dict | None) -> list[tuple[str, object, object]]:
    """(key, configured, checkpoint's) where model.rope_scaling contradicts a checkpoint's own
    non-default RoPE scaling."""
    own = checkpoint_rope(source) if source else {"rope_type": DEFAULT}
    if own["rope_type"] == DEFAULT:
        return []
    found = []
    if conf.rope_type.value not in ("auto", own["rope_type"]):
        found.append(("rope_type", conf.rope_type.value, own["rope_type"]))
    for key, value in explicit(conf).items():
        theirs = own.get(key)
        if theirs is not None and not math.isclose(float(value), float(theirs)):
            found.append((key, value, theirs))
    return found


def resolve(model_conf, source: dict | None, table: int) -> Rope:
    """The RoPE to train: explicit settings, else the checkpoint's, else the flavor's ``table``."""
    own = checkpoint_rope(source) if source else {"rope_type": DEFAULT}
    wanted = model_conf.rope_scaling.rope_type.value
    rope_type = own["rope_type"] if wanted == "auto" else wanted
    fields: dict = {}
    if rope_type == YARN:
        fields = {k: own.get(k) for k in YARN_KEYS + ("mscale", "mscale_all_dim", "truncate")}
        if own["rope_type"] != YARN:
            fields = {}
        fields.update(explicit(model_conf.rope_scaling))
        if fields.get("factor") is None and source and fields.get("original_max_position_embeddings"):
            # Transformers: factor = max_position_embeddings / original (_compute_yarn_parameters :419-428)
            fields["factor"] = source["max_position_embeddings"] / fields["original_max_position_embeddings"]
    max_pos = _max_positions(model_conf.max_position_embeddings, source, own, rope_type, fields, table)
    return Rope(rope_type=rope_type, max_position_embeddings=max_pos, **fields)


def _max_positions(configured: int, source, own: dict, rope_type: str, fields: dict, table: int) -> int:
    if configured > 0:
        return configured
    base = (
        int(source["max_position_embeddings"]) if source and source.get("max_position_embeddings") else table
    )
    if rope_type != YARN or own["rope_type"] == YARN:
        return base
    # yarn configured on a checkpoint without it: Qwen's recipe sets original x factor (131072)
    factor, original = fields.get("factor"), fields.get("original_max_position_embeddings")
    if factor is None or original is None:
        return base
    return max(base, int(original * factor))


def of_run(run, table: int) -> Rope:
    """The run's RoPE (``table``: the flavor's RoPE table, ``flavors.rope_table``)."""
    return resolve(run.model, read_config(source_dir(run)), table)
