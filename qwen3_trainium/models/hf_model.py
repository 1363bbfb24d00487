"""The HF models ``model=hf`` trains: torchtitan's ``HFTransformerModel`` plus two fixes.

1. RoPE after meta-device init. torchtitan 0.3.0 rebuilds each rotary module's ``inv_freq``
   after ``to_empty`` by calling ``module.rope_init_fn``; Transformers 5.x rotary modules (Qwen3
   included) keep that function local to ``__init__``, so the buffer stays uninitialised memory
   and every run trains a different, position-blind model. ``init_states`` recomputes it here.
2. Dense masks where FlexAttention cannot train (CPU, Neuron): ``DenseMaskHFTransformerModel``
   builds the same causal, same-document mask as a ``[B, 1, S, S]`` additive tensor (torchtitan's
   own ``_build_dense_attention_mask``) and selects HF's ``sdpa`` attention, which consumes it.
3. The run's RoPE. ``model.rope_scaling`` (``config/rope.py``) becomes the runtime config's
   ``rope_parameters`` after torchtitan's ``update_from_config`` reloads config.json. That method
   also sets ``max_position_embeddings`` to ``training.seq_len`` (torchtitan
   ``transformers_modeling_backend/model.py:458``); Transformers' YaRN reads it only where
   ``factor`` is missing (``_compute_yarn_parameters``), so the YaRN dict here always carries
   ``factor`` and ``original_max_position_embeddings`` and the seq_len there changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchtitan.experiments.transformers_modeling_backend.model import HFTransformerModel


def recompute_rotary_buffers(model: torch.nn.Module) -> int:
    """Refill ``inv_freq`` (and ``original_inv_freq``) of every HF rotary module; returns how many."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    count = 0
    for module in model.modules():
        if not hasattr(module, "inv_freq") or not hasattr(module, "rope_type"):
            continue
        if module.rope_type == "default":
            inv_freq, scaling = module.compute_default_rope_parameters(module.config)
        else:
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[module.rope_type](module.config, module.inv_freq.device)
        with torch.no_grad():
            for name in ("inv_freq", "original_inv_freq"):
                buffer = getattr(module, name, None)
                if buffer is not None:
                    buffer.copy_(inv_freq.to(device=buffer.device, dtype=buffer.dtype))
        module.attention_scaling = scaling
        count += 1
    return count


class Qwen3HFTransformerModel(HFTransformerModel):
    @dataclass(kw_only=True, slots=True, init=False)
    class Config(HFTransformerModel.Config):
        # An explicit __init__ keeps PretrainedConfig.__init_subclass__ from generating one.
        # rope_scaling: the run's YaRN dict (config.rope.Rope.scaling_dict), None: config.json's.
        def __init__(self, model_config, rope_scaling: dict | None = None, **kwargs):
            HFTransformerModel.Config.__init__(self, model_config, **kwargs)
            self._rope_scaling = rope_scaling

        def update_from_config(self, *, config=None, **kwargs):
            result = HFTransformerModel.Config.update_from_config(self, config=config, **kwargs)
            scaling = getattr(self, "_rope_scaling", None)
            if scaling is not None:
                theta = (self.rope_parameters or {}).get("rope_theta")
                self.rope_parameters = {"rope_theta": theta, **scaling}
            return result

    def init_states(self, *, buffer_device: torch.device | None = None) -> None:
        super().init_states(buffer_device=buffer_device)
        recompute_rotary_buffers(self.model)


class DenseMaskHFTransformerModel(Qwen3HFTransformerModel):
    @dataclass(kw_only=True, slots=True, init=False)
    class Config(Qwen3HFTransformerModel.Config):
        def __init__(self, model_config, rope_scaling: dict | None = None, **kwargs):
            Qwen3HFTransformerModel.Config.__init__(self, model_config, rope_scaling, **kwargs)
            self._attn_implementation = "sdpa"

    def get_attention_masks(self, positions):
        return self._build_dense_attention_mask(positions)
