"""The Transformers v5 path (``model=hf``): ``AutoModelForCausalLM`` inside torchtitan.

torchtitan's transformers modeling backend builds the model class named in ``config.json``
from the config (random init); the weights arrive through torchtitan's checkpointer
(``initial_load_in_hf``), the same machinery every path uses. What this module adds:

- where a model lives: a local directory, or a hub id found in the local Hugging Face cache;
- the model spec, with per-document (``block_causal``) masking so packed samples never attend
  across documents, exactly as the native path does;
- ``hf_model``: RoPE buffers rebuilt after meta init, and on devices where FlexAttention
  cannot train (CPU, Neuron) HF's SDPA attention fed a dense per-document mask.
"""

from __future__ import annotations

import json
import os

from qwen3_trainium.config import hub
from qwen3_trainium.config.schema import AttnBackend

MIN_TRANSFORMERS_MAJOR = 5


def local_model_dir(hf_model: str) -> str | None:
    """The directory holding ``hf_model``: itself if a directory, else its cached snapshot."""
    if os.path.isdir(hf_model):
        return os.path.abspath(hf_model)
    return hub.cached_snapshot(hf_model)


def download_hint(hf_model: str) -> str:
    name = hf_model.rstrip("/").split("/")[-1]
    return (
        f"hf download {hf_model} --local-dir ./assets/hf/{name} "
        f"(where there is network), then model.hf_model=./assets/hf/{name}"
    )


def read_config(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)


def is_moe(model_dir: str) -> bool:
    from qwen3_trainium.models import hf_config

    return hf_config.is_moe(hf_config.load(model_dir))


def transformers_major() -> int:
    """From the installed distribution's metadata: importing transformers takes seconds."""
    import importlib.metadata

    try:
        return int(importlib.metadata.version("transformers").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return 0


def model_spec(model_dir: str, attn_backend: AttnBackend, rope=None):
    """torchtitan ``ModelSpec`` for an HF directory; sdpa (CPU, Neuron) or flex (CUDA); ``rope``:
    the run's ``config.rope.Rope`` (its YaRN replaces config.json's rope_parameters at build)."""
    from torchtitan.experiments.transformers_modeling_backend import (
        TitanModelConfig,
        TitanMoeModelConfig,
        model_registry,
    )

    from qwen3_trainium.models.hf_model import DenseMaskHFTransformerModel, Qwen3HFTransformerModel

    moe = is_moe(model_dir)
    spec = model_registry("full_moe" if moe else "full")
    # HF-mapped fields stay None so config.json wins; only the titan-side knob is set.
    titan_cfg = (TitanMoeModelConfig if moe else TitanModelConfig)(attn_mask_type="block_causal")
    model_cls = DenseMaskHFTransformerModel if attn_backend is AttnBackend.sdpa else Qwen3HFTransformerModel
    scaling = rope.scaling_dict() if rope is not None else None
    cfg = model_cls.Config(model_config=titan_cfg, rope_scaling=scaling)
    spec.model = cfg
    spec.flavor = os.path.basename(model_dir.rstrip("/"))
    return spec
