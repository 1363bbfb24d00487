"""objective=dpo reaches the trainer (``rank/titan.py``): the chunked loss wraps DPOTokenLoss (the
DPO step's per-token weights) instead of cross-entropy, and ``Trainer.Config.dpo`` carries the
run's settings, hand-written here from the overrides."""

from __future__ import annotations

from conftest import resolve
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss

from qwen3_trainium.rank.dpo_config import DPOSettings
from qwen3_trainium.rank.dpo_loss import DPOTokenLoss
from qwen3_trainium.rank.titan import to_trainer_config


def test_objective_dpo_configures_the_dpo_token_loss_and_settings(tmp_path, monkeypatch):
    monkeypatch.delenv("QWEN3_TRAINIUM_RESOLVED", raising=False)
    run = resolve(
        "objective=dpo",
        "device=cpu",
        "objective.dpo.beta=0.25",
        "objective.dpo.loss_type=[robust,ipo]",
        "objective.dpo.loss_weights=[0.5,2.0]",
        "objective.dpo.label_smoothing=0.1",
    )
    cfg = to_trainer_config(run, str(tmp_path))
    assert isinstance(cfg.loss, ChunkedLossWrapper.Config)
    assert type(cfg.loss.loss_fn) is DPOTokenLoss.Config
    assert cfg.dpo == DPOSettings(
        enable=True,
        beta=0.25,
        loss_types=["robust", "ipo"],
        loss_weights=[0.5, 2.0],
        label_smoothing=0.1,
        discopop_tau=0.05,
        reference="precompute",
        reference_path="",
        config_path=str(tmp_path / "resolved.yaml"),  # the run directory's, as the launcher writes it
    )


def test_lora_dpo_takes_the_reference_with_adapters_off(tmp_path):
    cfg = to_trainer_config(resolve("objective=dpo", "device=cpu", "peft=lora"), str(tmp_path))
    assert (cfg.dpo.enable, cfg.dpo.reference, cfg.dpo.loss_weights) == (True, "adapters_off", [1.0])


def test_objective_sft_keeps_cross_entropy_and_dpo_off(tmp_path):
    cfg = to_trainer_config(resolve("device=cpu"), str(tmp_path))
    assert type(cfg.loss.loss_fn) is CrossEntropyLoss.Config
    assert cfg.dpo == DPOSettings()


def test_eval_on_with_dpo_validates_held_out_preferences(tmp_path):
    from qwen3_trainium.rank.dpo_validator import PreferenceValidator
    from qwen3_trainium.rank.validator import HeldOutValidator

    dpo = to_trainer_config(resolve("objective=dpo", "device=cpu", "eval=on"), str(tmp_path))
    assert type(dpo.validator) is PreferenceValidator.Config
    sft = to_trainer_config(resolve("device=cpu", "eval=on"), str(tmp_path))
    assert type(sft.validator) is HeldOutValidator.Config
