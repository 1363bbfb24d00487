"""Pre-flight checks of ``peft=lora`` (``models/lora.py``): the path, the target modules (by
Hugging Face's names, against the model that will be built), and an export's base model."""

from __future__ import annotations

from qwen3_trainium.config.schema import ModelPath, RunConf
from qwen3_trainium.parent.preflight.problem import Problem


def is_lora(run: RunConf) -> bool:
    return run.peft.method.value == "lora"


def check_peft_static(run: RunConf) -> list[Problem]:
    if not is_lora(run):
        return []
    from qwen3_trainium.models.lora import FUSED_QKV, HF_TO_TITAN

    problems = []
    targets = list(run.peft.target_modules)
    if run.model.path is ModelPath.hf:
        problems.append(
            Problem(
                "peft.method",
                "lora",
                "model=hf trains Transformers' own modules, which torchtitan's LoRAConverter does not convert",
                "model=native (dense Qwen3) or model=nki_moe (Qwen3-MoE), from the same weights:"
                " checkpoint=hf_finetune checkpoint.initial_load_path=<the HF directory> model.flavor=<its flavor>",
            )
        )
    unknown = [t for t in targets if t not in HF_TO_TITAN]
    if unknown or not targets:
        what = f"{unknown[0]} is no module LoRA can target" if unknown else "no module to adapt"
        problems.append(
            Problem(
                "peft.target_modules",
                targets,
                what,
                f"peft.target_modules=[<some of {', '.join(HF_TO_TITAN)}>]",
            )
        )
    chosen = [t for t in FUSED_QKV if t in targets]
    if chosen and len(chosen) != len(FUSED_QKV):
        problems.append(
            Problem(
                "peft.target_modules",
                targets,
                "torchtitan's Qwen3 computes q, k and v in one fused Linear (attention.qkv_linear.wqkv),"
                " so one adapter covers all three",
                "list q_proj, k_proj and v_proj together, or none of them",
            )
        )
    ckpt = run.checkpoint
    if ckpt.enable and ckpt.last_save_in_hf and not (ckpt.initial_load_in_hf and ckpt.initial_load_path):
        problems.append(
            Problem(
                "checkpoint.last_save_in_hf",
                True,
                "peft=lora exports adapters for the base model the run started from, and this run starts from none",
                "checkpoint=[hf_finetune,hf_export] checkpoint.initial_load_path=<the base HF directory>",
            )
        )
    return problems


def check_targets(run: RunConf, model_config) -> list[Problem]:
    """Each target exists in the model as built (full tier: imports torchtitan); on MoE, the
    experts' rules (``check_expert_targets``)."""
    if not is_lora(run):
        return []
    from qwen3_trainium.models.expert_lora_io import moe_targets
    from qwen3_trainium.models.lora import valid_targets

    valid = valid_targets(model_config) + moe_targets(model_config)
    missing = [t for t in run.peft.target_modules if t not in valid]
    if missing:
        why = f"{', '.join(missing)}: not a module of {run.model.flavor}"
        targets = list(run.peft.target_modules)
        return [Problem("peft.target_modules", targets, why, f"choose from {', '.join(valid)}")]
    if not moe_targets(model_config):
        return []
    return check_expert_targets(run) + _uneven_expert_shards(run, model_config)


def _uneven_expert_shards(run: RunConf, model_config) -> list[Problem]:
    """torchtitan shards every parameter of the experts module on dim 1 when the FSDP mesh
    (shard x context parallel) is larger than the number of experts (``distributed/fsdp.py``,
    ``apply_fsdp_to_decoder``), and FSDP refuses uneven shards on dim 1 ("FSDP does not support
    uneven sharding on dim 1", seen at 64 ranks on tiny_moe). The A adapters' dim 1 is the rank."""
    from torchtitan.models.common.moe import RoutedExperts

    from qwen3_trainium.config.runconfig import degrees
    from qwen3_trainium.models.lora import EXPERT_TARGETS

    if not any(t in EXPERT_TARGETS for t in run.peft.target_modules):
        return []
    experts = next(cfg for _, cfg, *_ in model_config.traverse(RoutedExperts.Config, recurse=True))
    num_experts = experts.inner_experts.num_experts
    fsdp = degrees(run).shard * run.parallel.context_parallel_degree
    if fsdp <= num_experts or run.peft.rank % fsdp == 0:
        return []
    return [
        Problem(
            "peft.rank",
            run.peft.rank,
            f"FSDP over {fsdp} ranks, more than the {num_experts} experts, shards the expert adapters"
            " on their rank dimension, which must then divide evenly",
            f"parallel.data_parallel_replicate_degree=<{fsdp} / a divisor> so that the shard degree is at"
            f" most {num_experts} (HSDP), or peft.rank=<a multiple of {fsdp}>",
        )
    ]


# 16 bytes / 2 (bfloat16, the grouped experts' compute dtype off CPU float32)
GROUPED_RANK_MULTIPLE = 8


def check_expert_targets(run: RunConf) -> list[Problem]:
    """LoRA on the experts (``models/expert_lora.py``): gate and up together, and no tensor or
    expert parallelism (its adapters are sharded like the experts by FSDP only)."""
    from qwen3_trainium.models.lora import EXPERT_TARGETS

    targets = list(run.peft.target_modules)
    experts = [t for t in EXPERT_TARGETS if t in targets]
    if not experts:
        return []
    problems = []
    if ("gate_proj" in experts) != ("up_proj" in experts):
        problems.append(
            Problem(
                "peft.target_modules",
                targets,
                "Qwen3-MoE stores each expert's gate and up projections as one parameter (gate_up_proj),"
                " which PEFT adapts with one A per expert shared by both",
                "list gate_proj and up_proj together, or neither",
            )
        )
    if run.compile.enable and "moe_experts" in run.model.kernels:
        problems.append(
            Problem(
                "compile.enable",
                True,
                "LoRA on the blockwise experts recomputes their merged weights in backward through"
                " saved-tensor hooks, which torch.compile (dynamo) cannot trace",
                "compile.enable=false, or model.kernels without moe_experts (torchtitan's grouped experts)",
            )
        )
    if "moe_experts" in run.model.kernels and run.activation_checkpoint.mode.value == "selective":
        problems.append(
            Problem(
                "activation_checkpoint.mode",
                "selective",
                "LoRA on the blockwise experts merges each layer's experts in forward, and selective"
                " checkpointing keeps what the merge makes in every layer (traced on 30B-A3B, FSDP 64,"
                " 4096 tokens: 65.66 GiB a rank, against 8.62 GiB with full checkpointing)",
                "activation_checkpoint.mode=full",
            )
        )
    if "moe_experts" not in run.model.kernels and run.peft.rank % GROUPED_RANK_MULTIPLE:
        problems.append(
            Problem(
                "peft.rank",
                run.peft.rank,
                "on torchtitan's grouped experts the adapters' low-rank path is two torch._grouped_mm"
                " calls, and torch._grouped_mm wants 16-byte strides (RuntimeError 'strides should be"
                " multiple of 16 bytes' otherwise, seen on CPU): rank x 2 bytes in bfloat16",
                f"peft.rank={max(GROUPED_RANK_MULTIPLE, run.peft.rank // GROUPED_RANK_MULTIPLE * GROUPED_RANK_MULTIPLE)}"
                f" (a multiple of {GROUPED_RANK_MULTIPLE})",
            )
        )
    parallel = run.parallel
    for key, degree in (
        ("parallel.tensor_parallel_degree", parallel.tensor_parallel_degree),
        ("parallel.expert_parallel_degree", parallel.expert_parallel_degree),
    ):
        if degree != 1:
            problems.append(
                Problem(
                    key,
                    degree,
                    f"LoRA on the experts ({', '.join(experts)}) is sharded by FSDP only; its adapters"
                    " have no tensor or expert parallel layout",
                    f"{key}=1 (e.g. parallel=fsdp: FSDP over every rank), or drop"
                    f" {', '.join(experts)} from peft.target_modules",
                )
            )
    return problems


def trainable_note(model) -> str:
    from qwen3_trainium.models.lora import trainable

    n, total = trainable(model)
    return f"peft=lora: {n:,} trainable parameters of {total:,} ({100 * n / total:.3f}%); the base is frozen"
