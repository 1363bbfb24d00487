"""Pre-flight checks of ``model.moe_balance`` and its coefficients (docs/moe.md "Balance"): what
each combination would do is decided here, before any process starts, and every knob that would
be ignored or that we did not make work is refused with the setting that works."""

from __future__ import annotations

from qwen3_trainium.config import flavors
from qwen3_trainium.config.choices import MoEBalance as Mode
from qwen3_trainium.config.runconfig import hf_checkpoint
from qwen3_trainium.config.schema import ModelPath, RunConf
from qwen3_trainium.parent.preflight.problem import Problem
from qwen3_trainium.rank.moe_balance import balance_config, mode

OFF = "model.moe_balance=none model.moe_z_loss_coef=0"


def check_balance(run: RunConf) -> list[Problem]:
    m = run.model
    problems = [
        Problem(key, value, "a coefficient below 0 would reward imbalance", f"{key}=<a value >= 0>")
        for key, value in (
            ("model.moe_aux_loss_coef", m.moe_aux_loss_coef),
            ("model.moe_z_loss_coef", m.moe_z_loss_coef),
        )
        if value is not None and value < 0
    ]
    if m.path is ModelPath.hf:
        return problems + _hf_path(run)
    moe = m.flavor in flavors.MOE_FLAVORS
    if not moe:
        return problems + _dense(run)
    resolved = mode(run, moe)
    if resolved is Mode.bias and hf_checkpoint(run):
        problems.append(
            Problem(
                "model.moe_balance",
                m.moe_balance.value,
                "torchtitan's expert bias routes by a per-expert bias that Qwen3-MoE in HF format does not"
                " have: the HF weights loaded or exported would route differently in Transformers",
                "model.moe_balance=aux_loss (Transformers' own router loss; the default for HF weights) or none",
            )
        )
    if m.moe_aux_loss_coef is not None and resolved is not Mode.aux_loss:
        problems.append(
            Problem(
                "model.moe_aux_loss_coef",
                m.moe_aux_loss_coef,
                f"the aux loss is off (model.moe_balance resolves to {resolved.value}): the coefficient would be ignored",
                "model.moe_balance=aux_loss, or leave model.moe_aux_loss_coef unset",
            )
        )
    if problems:
        return problems
    balance = balance_config(run, moe)
    return _unsupported(run) if balance.aux_loss_coef or balance.z_loss_coef else []


def _explicit(run: RunConf) -> list[tuple[str, object]]:
    m = run.model
    keys = [("model.moe_balance", m.moe_balance.value)] if m.moe_balance in (Mode.aux_loss, Mode.bias) else []
    keys += [("model.moe_aux_loss_coef", m.moe_aux_loss_coef)] if m.moe_aux_loss_coef is not None else []
    return keys + ([("model.moe_z_loss_coef", m.moe_z_loss_coef)] if m.moe_z_loss_coef else [])


def _dense(run: RunConf) -> list[Problem]:
    return [
        Problem(
            key,
            value,
            f"model.flavor={run.model.flavor} is dense: it has no router to balance",
            f"leave {key} at its default, or a MoE flavor ({', '.join(sorted(flavors.MOE_FLAVORS))})",
        )  # fmt: skip
        for key, value in _explicit(run)
    ]


def _hf_path(run: RunConf) -> list[Problem]:
    fix = (
        "model=native (or nki_moe) model.flavor=<the checkpoint's MoE flavor> checkpoint=hf_finetune"
        " checkpoint.initial_load_path=<the HF directory>, which adds Transformers' router loss itself"
    )
    return [
        Problem(
            key,
            value,
            "model=hf trains Transformers' model as its config.json says; these knobs are ours",
            fix,
        )
        for key, value in _explicit(run)
    ]


def _unsupported(run: RunConf) -> list[Problem]:
    """Combinations the balance losses were not made to work with (``models/moe_balance.py``)."""
    par, problems = run.parallel, []
    for key, value, why in (
        (
            "parallel.pipeline_parallel_degree",
            par.pipeline_parallel_degree,
            "a stage holds only some MoE layers",
        ),
        (
            "parallel.expert_parallel_degree",
            par.expert_parallel_degree,
            "routers would see token shards unpooled",
        ),
    ):
        if value > 1:
            problems.append(Problem(key, value, f"the router balance losses are not pooled across it: {why}",
                                    f"{key}=1, or {OFF}"))  # fmt: skip
    if run.compile.enable:
        problems.append(
            Problem(
                "compile.enable",
                True,
                "the balance losses keep per-forward state in Python that a compiled block would bake in",
                f"compile.enable=false, or {OFF}",
            )
        )
    return problems
