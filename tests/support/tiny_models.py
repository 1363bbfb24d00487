"""The tiny model a rank would train, built in this test process from the same translation
(``rank/titan.py``) with the shipped tiny HF checkpoint's weights, and Qwen's YaRN recipe as
overrides and as the ``config.json`` dict (Qwen's "Enabling Long Context": factor 4 over 32,768)."""

from __future__ import annotations

import copy

import torch
from conftest import resolve
from safetensors.torch import load_file

from qwen3_trainium.data import assets
from qwen3_trainium.rank.titan import to_trainer_config

YARN4 = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
QWEN_YARN = (
    "model.rope_scaling.rope_type=yarn",
    "model.rope_scaling.factor=4",
    "model.rope_scaling.original_max_position_embeddings=32768",
)


def build_tiny(tmp_path, *overrides):
    """The model (eval mode) for ``overrides`` on CPU, every tensor of the tiny checkpoint loaded."""
    from torchtitan.config import apply_overrides

    cfg = copy.deepcopy(to_trainer_config(resolve("device=cpu", *overrides), str(tmp_path)))
    cfg.model_spec.model.update_from_config(config=cfg)
    apply_overrides(cfg.override, cfg)
    with torch.device("meta"):
        model = cfg.model_spec.model.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_states(buffer_device=None) if hasattr(model, "init_states") else model.init_weights()
    adapter = cfg.model_spec.state_dict_adapter(cfg.model_spec.model, cfg.hf_assets_path)
    weights = load_file(f"{assets.ensure_hf_model()}/model.safetensors")
    missing, unexpected = model.load_state_dict(adapter.from_hf(weights), strict=False)
    assert (missing, unexpected) == ([], [])
    return model.eval()
