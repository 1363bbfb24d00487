"""Every torchtitan seam this project relies on, probed by name before anything starts (and the
private torch FSDP2 state one module reaches into, listed the same way).

Two torchtitans are in use: upstream 0.3.0 (PyPI) and AWS's TorchTitan Neuron
(``aws-neuron/torchtitan-neuron``, version ``0.2.2+neuron.*``, a fork of upstream main after the
TOML-to-Python-config refactor). Their APIs are close but not identical, so this project checks
what it uses, not a version string: a fork that lacks a seam fails in pre-flight naming it,
rather than in rank 37 after compiling.

A seam is ``module:qualname`` plus, optionally, dataclass fields the object must declare and a
name its source must mention (an attribute set in ``__init__``, invisible on the class).
Private ones (a ``_name``, the device globals, ``torchtitan.experiments``) are nobody's promise;
they are marked so. ``needed_by`` says which runs need a seam: ``all``, a model path
(``native``, ``hf``, ``nki_moe``), a device (``cpu``), ``trace`` (``memory=trace``),
``grouped_mm`` (``native`` with a MoE flavor), or ``context_parallel`` (CP on the native paths).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from dataclasses import dataclass

from qwen3_trainium.config.schema import (
    PARALLEL_AUTO_FIELDS,
    CheckpointConf,
    CompileConf,
    DebugConf,
    LRSchedulerConf,
    ParallelConf,
    TrainingConf,
)

OUR_CHECKPOINT_FIELDS = (
    "save_rng",
    "allow_partial_load",
    "export_check",
    "hf_max_shard_size",
)  # not torchtitan's
NATIVE = ("native", "nki_moe")


# torch's FSDP2 internals that the float32 forward of the export probe and the samples sets aside and
# restores (rank/float32_forward.py): FSDP2 has no public switch for its all-gather dtype.
FSDP2 = "torch.distributed.fsdp._fully_shard"
FLOAT32_PROBE = (
    "the export check's and the samples' float32 forward in bfloat16 runs (rank/float32_forward.py)"
)
FSDP2_STATE = (
    ("_fsdp_param:FSDPParam", "param_dtype"),
    ("_fsdp_param:FSDPParam", "all_gather_outputs"),
    ("_fsdp_param:FSDPParam", "_unsharded_param"),
    ("_fsdp_param:FSDPParam.init_all_gather_outputs", "all_gather_outputs"),  # allocated once
    ("_fsdp_param:FSDPParam.init_unsharded_param", "_unsharded_param"),  # made once
    ("_fsdp_param_group:FSDPParamGroup", "fsdp_params"),
    ("_fsdp_param_group:FSDPParamGroup", "mp_policy"),
    ("_fsdp_state:FSDPState", "_mp_policy"),
    ("_fsdp_state:FSDPState", "_fsdp_param_groups"),
    ("_fsdp_state:FSDPState._lazy_init", ""),
    ("_fully_shard:FSDPModule._get_fsdp_state", ""),
    ("_fully_shard:FSDPModule.reshard", ""),
)


def _names(schema, drop=()) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(schema) if f.name not in drop)


@dataclass(frozen=True)
class Seam:
    target: str  # "module:Qual.name"
    uses: str  # what of ours relies on it
    needed_by: tuple[str, ...] = ("all",)
    fields: tuple[str, ...] = ()  # dataclass fields it must declare
    mentions: str = ""  # a name its source must contain (set in __init__, not on the class)
    private: bool = False  # explicitly private even without a leading underscore

    @property
    def name(self) -> str:
        module, _, qualname = self.target.partition(":")
        return f"{module}.{qualname}" + (f".{self.mentions}" if self.mentions else "")

    @property
    def is_private(self) -> bool:
        module, _, qualname = self.target.partition(":")
        parts = qualname.split(".") + ([self.mentions] if self.mentions else [])
        return self.private or ".experiments" in module or any(p.startswith("_") for p in parts)


FSDP2_SEAMS = tuple(
    Seam(f"{FSDP2}.{where}", FLOAT32_PROBE, private=True, mentions=name) for where, name in FSDP2_STATE
)

SEAMS: tuple[Seam, ...] = (
    # Entry and config tree: --module/--config, Trainer.Config and the sections we fill.
    Seam("torchtitan.train:main", "each rank hands over to torchtitan's entry point (qwen3_trainium.rank.train)"),
    Seam("torchtitan.config.manager:ConfigManager", "--module qwen3_trainium.rank.titan --config trainer_config", mentions="--module"),
    Seam("torchtitan.trainer:Trainer.Config", "titan.to_trainer_config", fields=(
        "model_spec", "hf_assets_path", "dump_folder", "dataloader", "optimizer", "lr_scheduler", "training",
        "parallelism", "activation_checkpoint", "checkpoint", "metrics", "debug", "compile", "override", "loss")),
    Seam("torchtitan.config:TrainingConfig", "training.*", fields=(*_names(TrainingConf), "disable_cuda_graphs")),
    Seam("torchtitan.config:ParallelismConfig", "parallel.*", fields=_names(ParallelConf, PARALLEL_AUTO_FIELDS)),
    Seam("torchtitan.config:DebugConfig", "debug.*", fields=_names(DebugConf)),
    Seam("torchtitan.config:CompileConfig", "compile.*", fields=_names(CompileConf)),
    Seam("torchtitan.config:OverrideConfig", "override.imports, model.kernels, attention", fields=("imports",)),
    Seam("torchtitan.config:override", "the @override factories (overrides/)"),
    Seam("torchtitan.config:derive", "the @override factories (overrides/)"),
    Seam("torchtitan.config:apply_overrides", "pre-flight applies override.imports on a copy (conflicts)"),
    Seam("torchtitan.components.optimizer:OptimizersContainer.Config", "optimizer.*", fields=("param_groups", "implementation")),
    Seam("torchtitan.components.optimizer:ParamGroupConfig", "optimizer.*", fields=("pattern", "optimizer_name", "optimizer_kwargs")),
    Seam("torchtitan.components.optimizer:LRSchedulersContainer.Config", "lr_scheduler.*", fields=_names(LRSchedulerConf)),
    Seam("torchtitan.distributed.activation_checkpoint:SelectiveAC.Config", "activation_checkpoint.mode=selective"),
    Seam("torchtitan.distributed.activation_checkpoint:FullAC.Config", "activation_checkpoint.mode=full"),
    Seam("torchtitan.components.loss:CrossEntropyLoss.Config", "the loss", fields=("global_vocab_size",)),
    Seam("torchtitan.components.loss:ChunkedLossWrapper.Config", "the loss (native Qwen3)", NATIVE, fields=("loss_fn",)),
    # Data.
    Seam("torchtitan.hf_datasets.text_datasets:HuggingFaceTextDataLoader.Config", "data.*", fields=("dataset", "dataset_path")),
    Seam("torchtitan.hf_datasets.text_datasets:DATASETS", "pre-flight checks data.dataset against the registry"),
    Seam("torchtitan.hf_datasets:DatasetConfig", "eval=on's held-out loaders (heldout.py)", fields=("path", "loader", "sample_processor")),
    # Data at any world size (data/text.py, data/shares.py): each rank's share read once, counted before launch.
    Seam("torchtitan.hf_datasets.text_datasets:HuggingFaceTextDataset", "TextRows reads its own share (data/text.py)", mentions="_original_data"),
    Seam("torchtitan.hf_datasets.text_datasets:HuggingFaceTextDataset", "TextRows' no-progress guard (data/text.py)", mentions="_inputs_buffer"),
    Seam("torchtitan.hf_datasets.text_datasets:HuggingFaceTextDataset.reloop", "TextRows stops a share that makes no token (data/text.py)"),
    Seam("torchtitan.hf_datasets.text_datasets:split_dataset_by_node", "pre-flight splits text as the ranks do (data/shares.py)"),
    Seam("torchtitan.components.validate:Validator", "held-out loaders pad when asked to be infinite (data/loaders.py)", mentions="infinite"),
    Seam("torchtitan.components.dataloader:ParallelAwareDataloader.state_dict", "pre-flight reads a step's data state (preflight/resume_data.py)", mentions="world_size"),
    # eval=on: torchtitan's Validator, when it runs, and how it logs.
    Seam("torchtitan.trainer:Trainer.Config", "eval=on (titan_eval.evaluation)", fields=("validator",)),
    Seam("torchtitan.components.validate:Validator.Config", "eval.*", fields=("enable", "freq", "steps", "dataloader")),
    Seam("torchtitan.components.validate:BaseValidator.should_validate", "eval.freq and the last step (validator.py)"),
    Seam("torchtitan.components.metrics:MetricsProcessor.log_validation", "val_loss, val_perplexity (metrics.py)"),
    Seam("torchtitan.trainer:Trainer.train", "samples after the last step (trainer.py)"),
    # Checkpoints: HF load and save fields, and the two hooks of the complete HF export.
    Seam("torchtitan.components.checkpoint:CheckpointManager.Config", "checkpoint.*",
         fields=_names(CheckpointConf, drop=OUR_CHECKPOINT_FIELDS)),
    Seam("torchtitan.components.checkpoint:CheckpointManager._save_last_step", "HF export completion (checkpoint.py)"),
    # Stop signals: the step boundary every rank reaches, and the save at the agreed step.
    Seam("torchtitan.trainer:Trainer.should_continue_training", "SIGTERM stops after an agreed step (trainer.py)"),
    Seam("torchtitan.components.checkpoint:CheckpointManager._should_save", "SIGTERM saves whatever the interval (checkpoint.py)"),
    Seam("torchtitan.components.checkpoint:CheckpointManager._save", "SIGTERM saves whatever the interval (checkpoint.py)"),
    Seam("torchtitan.components.checkpoint:CheckpointManager._create_checkpoint_id", "HF export completion (checkpoint.py)"),
    Seam("torchtitan.models.common.decoder:Decoder._skip_lm_head", "the export check's probe logits (checkpoint.py)", NATIVE),
    # Metrics: our processor subclass, its logger hook, the metrics rank, MFU's peak.
    Seam("torchtitan.components.metrics:MetricsProcessor.Config", "tracking.*", fields=(
        "log_freq", "enable_wandb", "enable_tensorboard", "disable_color_printing")),
    Seam("torchtitan.components.metrics:MetricsProcessor._build_metric_logger", "metrics.jsonl and W&B loggers (metrics.py)"),
    Seam("torchtitan.components.metrics:MetricsProcessor", "MFU from this project's device table (metrics.py)", mentions="gpu_peak_flops"),
    Seam("torchtitan.components.metrics:MetricsProcessor", "MFU n/a on CPU (metrics.py)", mentions="has_quantization"),
    Seam("torchtitan.components.metrics:_get_metrics_rank", "which rank writes metrics.jsonl (metrics.py)"),
    Seam("torchtitan.components.metrics:BaseLogger", "metrics.jsonl and W&B loggers (metrics.py)"),
    Seam("torchtitan.components.metrics:LoggerContainer.add_logger", "metrics.jsonl and W&B loggers (metrics.py)"),
    Seam("torchtitan.tools.logging:logger", "warnings from the ranks"),
    # Device globals, bound at import: the CPU device module replaces them; metrics read them.
    Seam("torchtitan.tools.utils:device_type", "the CPU device module (devices.py), metrics.py", private=True),
    Seam("torchtitan.tools.utils:device_module", "the CPU device module (devices.py)", ("cpu",), private=True),
    # The native Qwen3 model, its flavors, and the layers our tiny flavors are built from.
    Seam("torchtitan.models.qwen3:qwen3_configs", "model.flavor", NATIVE),
    Seam("torchtitan.models.qwen3:model_registry", "model.flavor", NATIVE),
    Seam("torchtitan.models.qwen3:Qwen3Model.Config", "the tiny flavors (flavors.py)", NATIVE),
    Seam("torchtitan.models.qwen3.model:Qwen3TransformerBlock.Config", "the tiny flavors (flavors.py)", NATIVE),
    Seam("torchtitan.models.common:Embedding", "the tiny flavors (flavors.py)", NATIVE),
    Seam("torchtitan.models.common:Linear", "the tiny flavors (flavors.py)", NATIVE),
    Seam("torchtitan.models.common.nn_modules:RMSNorm", "the tiny flavors (flavors.py)", NATIVE),
    Seam("torchtitan.models.common.param_init:skip_param_init", "the tiny flavors (flavors.py)", NATIVE),
    *(Seam(f"torchtitan.models.common.config_utils:{fn}", "the tiny flavors (flavors.py)", NATIVE) for fn in (
        "get_attention_config", "make_gqa_config", "make_ffn_config", "make_moe_config",
        "make_router_config", "make_routed_experts_config")),
    Seam("torchtitan.models.common.config_utils:decoder_vocab_size", "the loss's vocab size", NATIVE),
    Seam("torchtitan.models.common.attention:VarlenAttention.Config", "model.attn_backend=sdpa (overrides/attention.py)", NATIVE),
    Seam("torchtitan.models.common.attention:VarlenMetadata", "model.attn_backend=sdpa (overrides/attention.py)", NATIVE),
    Seam("torchtitan.protocols.module:Module", "model.attn_backend=sdpa (overrides/attention.py)", NATIVE),
    # nki_moe: the nodes the kernels replace.
    Seam("torchtitan.models.common.rope:CosSinRoPE.Config", "rope_hf (overrides/nki.py)", ("nki_moe",)),
    Seam("torchtitan.models.common.rope:CosSinRoPE", "rope_hf reads the cos/sin cache buffer", ("nki_moe",), mentions="self.cache"),
    Seam("torchtitan.models.common.moe:RoutedExperts.Config", "moe_experts (overrides/nki.py)", ("nki_moe",)),
    Seam("torchtitan.models.common.moe:RoutedExperts", "moe_experts reads the expert weights", ("nki_moe",), mentions="inner_experts"),
    # nki_moe's fused experts (overrides/blockwise_experts.py): initialised, sharded and converted as torchtitan's
    Seam("torchtitan.models.common.moe:GroupedExperts.Config", "moe_experts: the fused experts' dims",
         ("nki_moe",), fields=("dim", "hidden_dim", "num_experts")),
    Seam("torchtitan.protocols.module:Module._init_self_parameters", "moe_experts: initialised as GroupedExperts",
         ("nki_moe",)),
    Seam("torchtitan.models.qwen3.state_dict_adapter:Qwen3StateDictAdapter", "moe_experts: HF keys in and out",
         ("nki_moe",), mentions="inner_experts.w1_EFD"),
    # model=native with a MoE flavor, AWS's SDK 2.34 route: torchtitan's experts on torch._grouped_mm, as they
    # are (nothing of ours between them on Neuron); the export probe's float32 experts (overrides/experts.py)
    # and the HF adapter read their three weights by name.
    Seam("torchtitan.models.common.moe:GroupedExperts._grouped_mm", "the grouped_mm route's GEMMs", ("grouped_mm",)),
    Seam("torchtitan.models.common.moe:GroupedExperts", "the grouped_mm route: the float32 probe's experts",
         ("grouped_mm",), mentions="w2_EDF"),
    Seam("torch:_grouped_mm", "the grouped_mm route's GEMMs (torchtitan's experts call it)", ("grouped_mm",)),
    Seam("torchtitan.models.qwen3.state_dict_adapter:Qwen3StateDictAdapter", "the grouped_mm route: HF keys in and out",
         ("grouped_mm",), mentions="inner_experts.w1_EFD"),
    # model=hf: torchtitan's transformers modeling backend (an experiment upstream).
    Seam("torchtitan.experiments.transformers_modeling_backend:model_registry", "model=hf", ("hf",)),
    Seam("torchtitan.experiments.transformers_modeling_backend:TitanModelConfig", "model=hf", ("hf",)),
    Seam("torchtitan.experiments.transformers_modeling_backend:TitanMoeModelConfig", "model=hf (MoE)", ("hf",)),
    Seam("torchtitan.experiments.transformers_modeling_backend.configs:TransformersBackendConfig", "model=hf", ("hf",)),
    Seam("torchtitan.experiments.transformers_modeling_backend.trainer:HFTransformerTrainer", "model=hf stops on SIGTERM (trainer.py)", ("hf",)),
    Seam("torchtitan.experiments.transformers_modeling_backend.model:HFTransformerModel.Config", "model=hf (hf_model.py)", ("hf",)),
    Seam("torchtitan.experiments.transformers_modeling_backend.model:HFTransformerModel._build_dense_attention_mask",
         "model=hf on CPU and Neuron: dense document masks (hf_model.py)", ("hf",)),
    Seam("torchtitan.experiments.transformers_modeling_backend.state_dict_adapter:HFTransformerStateDictAdapter",
         "model=hf export keeps an un-tied lm_head (checkpoint.py)", ("hf",), mentions="_tie_word_embeddings"),
    # Context parallel with our SDPA (models/context_parallel.py, rank/context_parallel.py): torchtitan
    # shards the row and all-gathers K/V for the attention; our mask follows its sharding.
    Seam("torchtitan.models.common.decoder_sharding:set_gqa_inner_attention_local_map",
         "context parallel: K/V all-gathered over the CP group before our attention", ("context_parallel",),
         mentions="cp=spmd.R"),
    Seam("torchtitan.distributed.context_parallel:cp_shard", "context parallel: our mask sharded as the inputs",
         ("context_parallel",)),
    Seam("torchtitan.trainer:Trainer.post_dataloading_process", "context parallel: the row sharded before our mask",
         ("context_parallel",), mentions="prepare_context_parallel_input"),
    Seam("torchtitan.config:ParallelismConfig", "context parallel: the load balancer our mask follows",
         ("context_parallel",), fields=("context_parallel_load_balancer",)),
    # memory=trace (memory/trace.py): rank 0 of a fake world, the step through the trainer's own code
    Seam("torchtitan.config.configs:CommConfig", "memory=trace: torchtitan's fake process group (comm.mode=fake_backend)",
         ("trace",), fields=("mode",)),
    Seam("torchtitan.distributed.utils:init_fake_mode", "memory=trace: a world of any size on one CPU", ("trace",)),
    Seam("torchtitan.trainer:Trainer._forward_backward_body", "memory=trace: the traced step is the trainer's", ("trace",)),
    Seam("torchtitan.trainer:Trainer.post_dataloading_process", "memory=trace: the traced batch's masks", ("trace",)),
    Seam("torchtitan.models.common.token_dispatcher:AllToAllTokenDispatcher._sync_token_count_exchange",
         "memory=trace with expert parallel: balanced routing in place of token counts", ("trace",)),
    *FSDP2_SEAMS,
)  # fmt: skip


def probe(seam: Seam) -> str | None:
    """None when the seam is there, else what is missing."""
    module_name, _, qualname = seam.target.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except Exception as err:  # ImportError, or whatever a broken fork raises on import
        return f"cannot import {module_name} ({type(err).__name__}: {err})"
    for part in qualname.split("."):
        if not hasattr(obj, part):
            return f"{module_name} has no {qualname}"
        obj = getattr(obj, part)
    if seam.fields:
        declared = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
        missing = [f for f in seam.fields if f not in declared]
        if missing:
            return f"{qualname} lacks field(s) {', '.join(missing)}"
    if seam.mentions:
        try:
            source = inspect.getsource(obj)
        except (OSError, TypeError):
            source = ""
        if seam.mentions not in source:
            return f"{qualname} no longer uses {seam.mentions}"
    return None


def needed(
    path: str, device: str, memory: str = "estimate", moe: bool = False, cp: bool = False
) -> list[Seam]:
    """The seams a run needs: ``moe`` is a MoE flavor, whose ``native`` path is the grouped_mm route;
    ``cp``: context parallel (its seams are those of our SDPA's CP, on the native paths)."""
    scope = {"all", path, device} | ({"trace"} if memory == "trace" else set())
    scope |= {"grouped_mm"} if moe and path == "native" else set()
    scope |= {"context_parallel"} if cp and path in NATIVE else set()
    return [seam for seam in SEAMS if scope & set(seam.needed_by)]


def missing(seams: list[Seam] | tuple[Seam, ...] = SEAMS) -> list[tuple[Seam, str]]:
    return [(seam, error) for seam in seams if (error := probe(seam)) is not None]


def torchtitan_kind(version: str | None) -> str:
    """``upstream`` (0.3.0), ``neuron`` (TorchTitan Neuron 0.2.2+neuron.*), ``other`` or ``missing``."""
    if version is None:
        return "missing"
    if version.split("+")[0] == "0.3.0" and "+" not in version:
        return "upstream"
    if version.startswith("0.2.2+neuron"):
        return "neuron"
    return "other"
