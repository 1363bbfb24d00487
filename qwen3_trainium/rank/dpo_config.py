"""``objective=dpo`` as the trainer receives it (``Trainer.Config.dpo``), resolved from the run
config without torch, so that pre-flight and the rank read the same resolution."""

from __future__ import annotations

from dataclasses import dataclass, field

from qwen3_trainium.config.choices import DPOReference, Objective
from qwen3_trainium.config.schema import RunConf


@dataclass(kw_only=True, slots=True)
class DPOSettings:
    """Off (``enable`` False) for every objective but dpo."""

    enable: bool = False
    beta: float = 0.1
    loss_types: list[str] = field(default_factory=lambda: ["sigmoid"])
    loss_weights: list[float] = field(default_factory=lambda: [1.0])
    label_smoothing: float = 0.0
    discopop_tau: float = 0.05
    reference: str = "precompute"  # precompute | adapters_off (auto resolved)
    reference_path: str = ""  # an HF checkpoint the reference comes from; "": the initial weights
    config_path: str = ""  # the run's resolved.yaml (the reference pre-pass reads its data from it)


def reference_mode(run: RunConf) -> DPOReference:
    """``objective.dpo.reference`` resolved: auto is adapters_off with LoRA (TRL's PEFT rule: the
    base with the adapters disabled, ``use_adapter(model, None)``), else precompute."""
    chosen = run.objective.dpo.reference
    if chosen is not DPOReference.auto:
        return chosen
    return DPOReference.adapters_off if run.peft.method.value == "lora" else DPOReference.precompute


def settings(run: RunConf, config_path: str = "") -> DPOSettings:
    if run.objective.kind is not Objective.dpo:
        return DPOSettings()
    dpo = run.objective.dpo
    types = [t.value for t in dpo.loss_type]
    return DPOSettings(
        enable=True,
        beta=dpo.beta,
        loss_types=types,
        loss_weights=list(dpo.loss_weights) or [1.0] * len(types),
        label_smoothing=dpo.label_smoothing,
        discopop_tau=dpo.discopop_tau,
        reference=reference_mode(run).value,
        reference_path=dpo.reference_path or "",
        config_path=config_path,
    )
