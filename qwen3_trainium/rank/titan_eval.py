"""The evaluation sections of the torchtitan ``Trainer.Config`` (``titan.py`` builds the rest):
the training and held-out dataloaders, the validator, the greedy samples and the passkey check."""

from __future__ import annotations

import os

from qwen3_trainium.config.schema import RunConf


def evaluation(run: RunConf, run_dir: str) -> tuple[object, dict]:
    """(the training dataloader, the eval fields: validator and samples). eval=on reads held-out
    records (``heldout.py``, ``data/chat/source.py``) the training stream then never sees; every
    rank reads its share of them once, then padding (``data/loaders.py``)."""
    from qwen3_trainium.data.loaders import dataloaders
    from qwen3_trainium.rank import samples
    from qwen3_trainium.rank.validator import HeldOutValidator

    train, val = dataloaders(run, run_dir)
    chat = run.data.format.value != "text"
    passkey = {"passkey": _passkey(run, run_dir, chat)} if run.eval.long_context else {}
    if not run.eval.enable:  # the passkey check runs without held-out loss too
        return train, passkey
    validator_class = HeldOutValidator
    if run.objective.kind.value == "dpo":  # held-out DPO loss and TRL's eval metrics (rank/dpo_validator.py)
        from qwen3_trainium.rank.dpo_validator import PreferenceValidator as validator_class
    validator = validator_class.Config(
        enable=True, freq=run.eval.freq, steps=run.eval.steps, last_step=run.training.steps, dataloader=val
    )
    sample_config = samples.SampleConfig(
        prompts=list(run.eval.sample_prompts) if run.eval.sample_tokens > 0 else [],
        tokens=run.eval.sample_tokens,
        path=os.path.join(run_dir, samples.SAMPLES_JSON),
        tokenizer_dir=run.data.hf_assets_path,
        chat_template=chat_template(run) if chat else "",
        chat_template_kwargs=dict(run.data.chat_template_kwargs or {}),
    )
    return train, {"validator": validator, "samples": sample_config, **passkey}


def _passkey(run: RunConf, run_dir: str, chat: bool):
    """eval.long_context: the passkey check's config (length 0: none)."""
    from qwen3_trainium.rank import passkey

    ev = run.eval
    return passkey.PasskeyConfig(
        length=(ev.long_context_length or run.training.seq_len) if ev.long_context else 0,
        depths=list(ev.long_context_depths),
        trials=ev.long_context_trials,
        seed=run.debug.seed if run.debug.seed is not None else 0,  # preflight/passkey.seed's rule
        path=os.path.join(run_dir, passkey.PASSKEY_JSON),
        tokenizer_dir=run.data.hf_assets_path,
        chat_template=chat_template(run) if chat else "",
        chat_template_kwargs=dict(run.data.chat_template_kwargs or {}),
    )


def chat_template(run: RunConf, text: bool = False) -> str:
    """Where the run's chat template comes from (``text``: its text); empty when there is none."""
    from qwen3_trainium.data.chat.template import find_template

    found = find_template(run.data.hf_assets_path, run.data.chat_template)
    return "" if found is None else found[0] if text else found[1]
