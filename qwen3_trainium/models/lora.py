"""LoRA (``peft=lora``): torchtitan's ``LoRAConverter`` on the model spec, and adapters out as a
Hugging Face PEFT directory.

torchtitan 0.3.0's ``LoRAConverter`` (``components/lora.py``) walks the model config tree: each
target ``Linear.Config`` becomes a ``LoRALinear.Config`` (base weight frozen, ``lora_a`` Kaiming,
``lora_b`` zeros, output ``base + alpha/rank * lora_b(lora_a(x))``, as PEFT's ``LoraLayer``), every
other config a frozen subclass. Targets are matched on the last segment of the module name, so
Hugging Face's names map to torchtitan's (``HF_TO_TITAN``). It has no dropout, so neither do we.

When it runs: torchtitan's own path converts in ``model_registry`` before ``update_from_config``
and the overrides; but the overrides match their targets by exact type (``@override(exact=True)``:
our SDPA swap, the NKI kernels), which the frozen subclasses no longer are. So the conversion is
deferred to the model's ``build()`` (``with_lora``): after torchtitan's ``update_from_config`` and
``apply_overrides``, on the tree they produced, once.

Expert weights of Qwen3-MoE are ``GroupedExperts`` parameters, not ``Linear`` modules, which the
converter cannot adapt: on a MoE model ``gate_proj``/``up_proj``/``down_proj`` adapt the experts
as parameters (``expert_lora.py``, PEFT's ``target_parameters``), after the converter has run.
The router stays frozen: its gate is a TP-replicated ``Linear``, for which torchtitan 0.3.0's
``_lora_adapter_sharding`` has no rule (it asserts colwise or rowwise).
"""

from __future__ import annotations

import json
import os
import re

from qwen3_trainium.models.expert_lora_parts import EXPERT_TARGETS

HF_TO_TITAN = {
    "q_proj": "wqkv",  # torchtitan's Qwen3 computes q, k and v in one fused Linear (FusedQKVLinear)
    "k_proj": "wqkv",
    "v_proj": "wqkv",
    "o_proj": "wo",
    "gate_proj": "w1",
    "up_proj": "w3",
    "down_proj": "w2",
}
FUSED_QKV = ("q_proj", "k_proj", "v_proj")  # one adapter on wqkv: targeted together or not at all

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def linear_names(model_config) -> set[str]:
    """Last segments of every ``Linear.Config`` in a model config tree (what LoRA can target)."""
    from torchtitan.models.common.linear import Linear

    return {fqn.rsplit(".", 1)[-1] for fqn, *_ in model_config.traverse(Linear.Config, recurse=True)}


def valid_targets(model_config) -> list[str]:
    """The Hugging Face names LoRA can target in this model, in ``HF_TO_TITAN``'s order."""
    names = linear_names(model_config)
    return [hf for hf, titan in HF_TO_TITAN.items() if titan in names]


def _titan_targets(targets: list[str], moe: bool) -> list[str]:
    """The Linear names torchtitan's converter adapts: on MoE the expert names go to the experts."""
    linear = [t for t in targets if t in HF_TO_TITAN and not (moe and t in EXPERT_TARGETS)]
    return sorted({HF_TO_TITAN[t] for t in linear})


def with_lora(model_config, *, rank: int, alpha: float, targets: list[str]):
    """``model_config`` whose ``build()`` first applies torchtitan's ``LoRAConverter`` to its
    subtree (once), then, on MoE, the expert adapters (``expert_lora.py``), then builds. The root
    itself has no parameters of its own to freeze."""
    from dataclasses import fields

    from torchtitan.components.lora import LoRAConverter

    from qwen3_trainium.models.expert_lora_io import is_moe

    base = type(model_config)
    moe = is_moe(model_config)
    converter = LoRAConverter.Config(rank=rank, alpha=alpha, target_modules=_titan_targets(targets, moe))

    class LoRAModelConfig(base):
        def build(self, **kwargs):
            if not self.__dict__.get("_lora_converted"):
                converter.build().convert(self)  # replaces the children in place
                if moe:
                    from qwen3_trainium.models import expert_lora, expert_lora_io

                    parts = expert_lora_io.expert_parts(targets)
                    if parts:  # after the converter, which freezes direct params of other configs
                        expert_lora.convert_experts(self, rank=rank, alpha=alpha, parts=parts)
                self.__dict__["_lora_converted"] = True
            return base.build(self, **kwargs)

    LoRAModelConfig.__name__ = LoRAModelConfig.__qualname__ = f"LoRA{base.__qualname__}"
    return LoRAModelConfig(**{f.name: getattr(model_config, f.name) for f in fields(model_config) if f.init})


def apply(spec, *, rank: int, alpha: float, targets: list[str]) -> None:
    """LoRA on a torchtitan model spec: the converter at build, the base kept frozen through
    parallelize (``keep_frozen``)."""
    spec.model = with_lora(spec.model, rank=rank, alpha=alpha, targets=targets)
    spec.parallelize_fn = keep_frozen(spec.parallelize_fn)


def keep_frozen(parallelize_fn):
    """Wrap a model spec's ``parallelize_fn`` so the frozen base stays frozen. torchtitan 0.3.0's
    spmd_types sharding re-registers every parameter as ``nn.Parameter(tensor)``
    (``protocols/module.py``: ``Module._spmd_distribute_state``), which sets ``requires_grad``
    back to True, and the optimizer (built next) would train the whole base."""
    import functools

    @functools.wraps(parallelize_fn)
    def parallelize(model, **kwargs):
        # Held by module and local name, not by dotted path: activation checkpointing wraps each
        # layer (``_checkpoint_wrapped_module`` joins the path) while the modules stay the same.
        frozen = {
            (id(module), name)
            for module in model.modules()
            for name, p in module.named_parameters(recurse=False)
            if not p.requires_grad
        }
        model = parallelize_fn(model, **kwargs)
        seen = set()
        for module in model.modules():  # tied weights: registered in both modules, frozen in both
            for name, p in module.named_parameters(recurse=False):
                if (id(module), name) in frozen:
                    p.requires_grad_(False)
                    seen.add((id(module), name))
        if seen != frozen:  # a parallelize that replaced modules: better no run than a full fine-tune
            raise RuntimeError(f"peft=lora: {len(frozen - seen)} frozen parameters lost in parallelize")
        return model

    return parallelize


def trainable(model) -> tuple[int, int]:
    """(trainable parameters, all parameters)."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def _local(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def lora_modules(model):
    """(name, module) of every LoRA-adapted linear."""
    return [(n, m) for n, m in model.named_modules() if hasattr(m, "lora_a") and hasattr(m, "_lora_scaling")]


def _hf_stem(sd_adapter, titan_weight_key: str) -> str:
    hf = sd_adapter.to_hf({titan_weight_key: None})
    if len(hf) != 1:
        raise ValueError(f"{titan_weight_key} has no single Hugging Face name")
    return next(iter(hf)).removesuffix(".weight")


def peft_state_dict(model, sd_adapter) -> dict:
    """The adapters under PEFT's names, ``base_model.model.<HF module>.lora_A.weight`` / ``lora_B``
    (``peft.utils.get_peft_model_state_dict`` drops the adapter name), in float32.

    The fused ``wqkv`` adapter (A: rank x dim, B: rows of wqkv x rank) is written as PEFT's three
    adapters on q_proj, k_proj and v_proj, each with the same A and its rows of B: wqkv's rows are
    grouped per KV head as [q heads of the group, k, v] (``FusedQKVLinear._split_qkv_on_save``),
    so the three together compute exactly what the fused one does."""
    out = {}
    for name, module in lora_modules(model):
        a = _local(module.lora_a.weight).detach().float().cpu()
        b = _local(module.lora_b.weight).detach().float().cpu()
        if name.endswith(".wqkv"):
            parent = model.get_submodule(name.rsplit(".", 1)[0])
            hpk, hd = parent.heads_per_kv, parent.head_dim
            grouped = b.reshape(-1, hpk + 2, hd, b.shape[1])
            parts = {
                "wq": grouped[:, :hpk].reshape(-1, b.shape[1]),
                "wk": grouped[:, hpk].reshape(-1, b.shape[1]),
                "wv": grouped[:, hpk + 1].reshape(-1, b.shape[1]),
            }
            base = name.rsplit(".", 1)[0]
            for short, rows in parts.items():
                stem = _hf_stem(sd_adapter, f"{base}.{short}.weight")
                out[f"base_model.model.{stem}.lora_A.weight"] = a.clone().contiguous()
                out[f"base_model.model.{stem}.lora_B.weight"] = rows.contiguous()
        else:
            stem = _hf_stem(sd_adapter, f"{name}.weight")
            out[f"base_model.model.{stem}.lora_A.weight"] = a.contiguous()
            out[f"base_model.model.{stem}.lora_B.weight"] = b.contiguous()
    from qwen3_trainium.models import expert_lora_io

    return out | expert_lora_io.peft_expert_tensors(model)  # experts: PEFT's ParamWrapper layout


def adapter_config(
    *, base_model: str, rank: int, alpha: float, targets: list[str], moe: bool = False
) -> dict:
    """PEFT's ``LoraConfig`` as ``save_pretrained`` writes it (the fields it reads back). On a MoE
    model the experts are parameters, listed in ``target_parameters``."""
    config = _lora_config(base_model=base_model, rank=rank, alpha=alpha, targets=targets)
    if moe:
        from qwen3_trainium.models import expert_lora_io

        params = expert_lora_io.target_parameters(targets)
        if params:
            config["target_modules"] = sorted(t for t in targets if t in ATTENTION)
            config["target_parameters"] = params
    return config


def _lora_config(*, base_model: str, rank: int, alpha: float, targets: list[str]) -> dict:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }


def write_adapter(directory: str, tensors: dict, config: dict) -> None:
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    with open(os.path.join(directory, ADAPTER_CONFIG), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def merge_(model) -> int:
    """Fold every adapter into its base weight (``W += alpha/rank * B @ A``, in float32) and zero
    ``lora_b``, so the model computes the same function with the adapters switched off."""
    import torch

    count = 0
    with torch.no_grad():
        for _, module in lora_modules(model):
            delta = module._lora_scaling * (module.lora_b.weight.float() @ module.lora_a.weight.float())
            module.weight.add_(delta.to(module.weight.dtype))
            module.lora_b.weight.zero_()
            count += 1
    from qwen3_trainium.models import expert_lora_io

    return count + expert_lora_io.merge_experts_(model)


def adapter_dir(export_dir: str) -> str:
    """``checkpoint/step-N`` -> ``checkpoint/step-N-adapter``."""
    return re.sub(r"/*$", "", export_dir) + "-adapter"
