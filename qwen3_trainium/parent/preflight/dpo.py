"""Pre-flight checks of ``objective=dpo`` (docs/dpo.md): the data it reads, the paths and layouts
its step was made and tested on, TRL 1.16.0's rules for each loss type's knobs, and where the
reference log-probs come from. Standard library only (the quick tier); every refusal names the key,
the bad value and the setting that works."""

from __future__ import annotations

from qwen3_trainium.config.choices import DPOLoss, Objective
from qwen3_trainium.config.schema import ModelPath, RunConf
from qwen3_trainium.config.schema_data import DPOConf
from qwen3_trainium.parent.preflight.dpo_reference import check_reference
from qwen3_trainium.parent.preflight.problem import Problem

# TRL 1.16.0 reads label_smoothing in these per-pair losses only (trl/trainer/dpo_trainer.py
# _compute_loss, 1406-1431; aot and aot_unpaired read it too, and are not offered here).
SMOOTHED = (DPOLoss.robust, DPOLoss.exo_pair)
NATIVE = (
    "model=native (dense Qwen3; model=nki_moe for Qwen3-MoE) checkpoint=hf_finetune"
    " checkpoint.initial_load_path=<the HF directory> model.flavor=<its flavor>"
)
# Layouts the DPO step (rank/dpo.py) has not been run and tested under: (key, why).
UNPROVEN = (
    (
        "parallel.pipeline_parallel_degree",
        "a pipeline stage holds only some layers, and the DPO loss needs each side's whole log-prob"
        " sum on one rank before any gradient flows back",
    ),
    (
        "parallel.context_parallel_degree",
        "each rank would hold a shard of every document; the per-side sums are not pooled across"
        " context-parallel ranks",
    ),
    (
        "parallel.tensor_parallel_degree",
        "the DPO step's log-probs over a vocabulary sharded across tensor-parallel ranks are not tested",
    ),
)


def is_dpo(run: RunConf) -> bool:
    return run.objective.kind is Objective.dpo


def check_dpo(run: RunConf) -> list[Problem]:
    """objective=dpo and data.format=preference come together; the rest only with objective=dpo."""
    preference = run.data.format.value == "preference"
    if not is_dpo(run):
        return ([] if not preference else [_needs_dpo()]) + _ignored(run)
    problems = [] if preference else [_needs_pairs(run)]
    problems += _paths(run) + _knobs(run.objective.dpo) + check_reference(run)
    return problems


def _needs_dpo() -> Problem:
    return Problem(
        "objective",
        "sft",
        "data.format=preference holds chosen/rejected pairs, which only objective=dpo trains on",
        "objective=dpo (it brings data=preference), or data=chat for supervised fine-tuning",
    )


def _needs_pairs(run: RunConf) -> Problem:
    return Problem(
        "data.format",
        run.data.format.value,
        "objective=dpo trains on chosen/rejected pairs: {prompt, chosen, rejected} or {chosen, rejected}",
        "data=preference (objective=dpo's default: the shipped pairs), or data.format=preference"
        " data.dataset_path=<your pairs>",
    )


def _ignored(run: RunConf) -> list[Problem]:
    """objective.dpo.* set while objective=sft would be read by nothing."""
    default, ours = DPOConf(), run.objective.dpo
    return [
        Problem(
            f"objective.dpo.{name}",
            _shown(getattr(ours, name)),
            "is read by objective=dpo only, and this run trains objective=sft",
            f"objective=dpo, or leave objective.dpo.{name} unset",
        )
        for name in DPOConf.__dataclass_fields__
        if getattr(ours, name) != getattr(default, name)
    ]


def _shown(value):
    if isinstance(value, list):
        return [getattr(v, "value", v) for v in value]
    return getattr(value, "value", value)


def _paths(run: RunConf) -> list[Problem]:
    problems = []
    if run.model.path is ModelPath.hf:
        problems.append(
            Problem(
                "model",
                "hf",
                "objective=dpo computes each side's log-probs from the decoder's hidden states and the"
                " lm_head in chunks (torchtitan's ChunkedLossWrapper), which model=hf does not expose",
                NATIVE,
            )
        )
    par = run.parallel
    degrees = {
        "parallel.pipeline_parallel_degree": par.pipeline_parallel_degree,
        "parallel.context_parallel_degree": par.context_parallel_degree,
        "parallel.tensor_parallel_degree": par.tensor_parallel_degree,
    }
    for key, why in UNPROVEN:
        if degrees[key] > 1:
            problems.append(Problem(key, degrees[key], f"objective=dpo: {why}", f"{key}=1 (parallel=fsdp)"))
    if run.compile.enable:
        problems.append(
            Problem(
                "compile.enable",
                True,
                "objective=dpo's step (two passes over the lm_head, a per-pair loss between them) has"
                " not been compiled and tested",
                "compile.enable=false (compile=off)",
            )
        )
    return problems


def _knobs(dpo: DPOConf) -> list[Problem]:
    """beta, the loss types, their weights and TRL 1.16.0's rules for label_smoothing."""
    problems, types = [], [t.value for t in dpo.loss_type]
    if dpo.beta <= 0:
        problems.append(
            Problem(
                "objective.dpo.beta",
                dpo.beta,
                "must be > 0: every loss scales the log-ratios by beta (ipo divides by it)",
                "objective.dpo.beta=0.1 (TRL's default)",
            )
        )
    if not types:
        problems.append(
            Problem("objective.dpo.loss_type", [], "names no loss", "objective.dpo.loss_type=[sigmoid]")
        )
    repeated = sorted({t for t in types if types.count(t) > 1})
    if repeated:
        problems.append(
            Problem(
                "objective.dpo.loss_type",
                types,
                f"names {', '.join(repeated)} more than once",
                "list each loss type once; objective.dpo.loss_weights=[...] weighs them",
            )
        )
    weights = list(dpo.loss_weights)
    if weights and len(weights) != len(types):
        problems.append(
            Problem(
                "objective.dpo.loss_weights",
                weights,
                f"has {len(weights)} weight(s) for {len(types)} loss type(s) {types}",
                f"one weight per loss type ({len(types)}), or objective.dpo.loss_weights=[] (1.0 each)",
            )
        )
    if any(w < 0 for w in weights):
        problems.append(
            Problem(
                "objective.dpo.loss_weights",
                weights,
                "a negative weight would maximise that loss",
                "objective.dpo.loss_weights=<values >= 0>",
            )
        )
    if dpo.discopop_tau <= 0:
        problems.append(
            Problem(
                "objective.dpo.discopop_tau",
                dpo.discopop_tau,
                "must be > 0: discopop divides the logits by it",
                "objective.dpo.discopop_tau=0.05 (TRL's default)",
            )
        )
    return problems + _smoothing(dpo)


def _smoothing(dpo: DPOConf) -> list[Problem]:
    """TRL 1.16.0 reads label_smoothing in robust and exo_pair only (dpo_trainer.py 1406-1431):
    robust wants 0 <= e < 0.5 (it divides by 1 - 2e; TRL warns at 823-827), exo_pair e > 0 (TRL
    raises at 829-833) and e < 1 (log(1 - e))."""
    e, types = dpo.label_smoothing, list(dpo.loss_type)
    key, readers = "objective.dpo.label_smoothing", [t for t in types if t in SMOOTHED]
    if e != 0 and not readers:
        names = ", ".join(t.value for t in types)
        verb = "ignores" if len(types) == 1 else "ignore"
        return [
            Problem(
                key,
                e,
                f"TRL 1.16.0's {names} {verb} label_smoothing (only robust and exo_pair read it); the"
                " old conservative-DPO smoothing of sigmoid is gone from TRL",
                f"{key}=0, or objective.dpo.loss_type=[robust] (0 <= e < 0.5) or [exo_pair] (e > 0)",
            )
        ]
    low_ok = e > 0 if DPOLoss.exo_pair in readers else e >= 0
    high = 0.5 if DPOLoss.robust in readers else 1.0
    if readers and not (low_ok and e < high):
        low = "0 <" if DPOLoss.exo_pair in readers else "0 <="
        why = f"{', '.join(t.value for t in readers)} need{'s' if len(readers) == 1 else ''} {low} e < {high}"
        return [Problem(key, e, why, f"{key}=0.1 (the EXO paper recommends 1e-3 for exo_pair)")]
    return []
