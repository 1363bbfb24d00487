"""Typed schemas for every config group (registered in Hydra's ConfigStore by ``parent/compose.py``).

The composed config is checked against these dataclasses when Hydra composes it, so a
misspelt key or a wrong type fails in the parent, with Hydra's own message, before any
process starts. Field names are torchtitan's wherever torchtitan has the field, so that
translating to ``Trainer.Config`` is unpacking, not renaming.
"""

from dataclasses import dataclass, field

from qwen3_trainium.config.choices import (
    ACMode,
    AsyncMode,
    AttnBackend,
    CompileBackend,
    CompileComponent,
    DecayType,
    DeviceType,
    Dtype,
    ExportDtype,
    MemoryMode,
    ModelPath,
    MoEBalance,
    OptimizerImpl,
    OptimizerName,
    ParamDtype,
    PipelineSchedule,
    Progress,
    RdzvBackend,
    ReshardAfterForward,
    RopeType,
    WandbMode,
)
from qwen3_trainium.config.schema_data import (  # noqa: F401  (re-exported: one schema module for callers)
    DEFAULT_SAMPLE_PROMPTS,
    LORA_TARGETS,
    MISSING,
    DataConf,
    EvalConf,
    ObjectiveConf,
    PeftConf,
)


@dataclass
class RopeScalingConf:
    """Hugging Face's ``rope_parameters`` / ``rope_scaling`` (docs/long_context.md). None: the
    checkpoint's value, else Transformers' default (``modeling_rope_utils._compute_yarn_parameters``)."""

    rope_type: RopeType = RopeType.auto
    factor: float | None = None
    original_max_position_embeddings: int | None = None  # required for yarn (Qwen3: 32768)
    attention_factor: float | None = None  # None: 0.1 * ln(factor) + 1, as Transformers
    beta_fast: float | None = None  # None: 32
    beta_slow: float | None = None  # None: 1


@dataclass
class ModelConf:
    path: ModelPath = MISSING
    flavor: str = "auto"  # a torchtitan Qwen3 flavor or one of ours; auto: by device
    attn_backend: AttnBackend = AttnBackend.auto
    hf_model: str = ""  # model=hf: an HF model directory or a hub id in the local HF cache
    load_weights: bool = True  # model=hf: start from hf_model's weights (else random init)
    kernels: list[str] = field(default_factory=list)  # model=nki_moe: rope_hf, moe_experts
    moe_block_size: int = 256  # model=nki_moe: tokens per expert block (256, 512, 1024)
    # The expert matmuls' dtype. auto: bfloat16 on Neuron (the NKI kernels' compute dtype:
    # nkilib core/moe/moe_cte/moe_cte.py defaults compute_dtype to nl.bfloat16, and
    # experimental/moe/bwd/blockwise_mm_backward.py takes bf16/fp16 inputs), else the parameters'
    # dtype (training.mixed_precision_param: float32 on CPU, where a CPU without BF16 instructions
    # emulates bfloat16 matmuls and the HF export must match float32 Transformers).
    moe_compute_dtype: ParamDtype = ParamDtype.auto
    # The longest position the model is trained for (config.json's max_position_embeddings).
    # -1: the HF checkpoint's (model=hf, or fine-tuning from an HF directory), else the flavor's
    # RoPE table (40960 for every Qwen3 flavor, as every published Qwen3 config.json); with YaRN
    # and no checkpoint value of its own: original_max_position_embeddings x factor.
    max_position_embeddings: int = -1
    rope_scaling: RopeScalingConf = field(default_factory=RopeScalingConf)
    # MoE flavors: expert load balance (docs/moe.md). The aux loss coefficient: None: the HF
    # checkpoint's router_aux_loss_coef, else Transformers' default 0.001.
    moe_balance: MoEBalance = MoEBalance.auto
    moe_aux_loss_coef: float | None = None
    moe_z_loss_coef: float = 0.0  # router z-loss (ST-MoE): mean of logsumexp(router logits)^2


@dataclass
class TrainingConf:
    """torchtitan ``TrainingConfig`` fields."""

    steps: int = 1000
    seq_len: int = 256
    local_batch_size: int = 8
    global_batch_size: int = -1
    max_norm: float = 1.0
    dtype: Dtype = Dtype.float32
    mixed_precision_param: ParamDtype = ParamDtype.auto
    mixed_precision_reduce: Dtype = Dtype.float32
    gc_freq: int = 50


@dataclass
class OptimizerConf:
    """One parameter group for all parameters (torchtitan ``default_adamw`` shape)."""

    name: OptimizerName = OptimizerName["AdamW"]
    lr: float = 8e-4
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    implementation: OptimizerImpl = OptimizerImpl["fused"]


@dataclass
class LRSchedulerConf:
    """torchtitan ``LRSchedulersContainer.Config`` fields."""

    warmup_steps: int = 200
    decay_ratio: float | None = None
    decay_type: DecayType = DecayType["linear"]
    min_lr_factor: float = 0.0


# ParallelConf's own fields (parallel=auto's planner, parent/auto), not torchtitan's
PARALLEL_AUTO_FIELDS = ("auto", "auto_top", "auto_traces", "auto_budget")


@dataclass
class ParallelConf:
    """torchtitan ``ParallelismConfig`` fields (-1 means: all remaining ranks)."""

    data_parallel_replicate_degree: int = 1
    data_parallel_shard_degree: int = -1
    fsdp_reshard_after_forward: ReshardAfterForward = ReshardAfterForward["default"]
    tensor_parallel_degree: int = 1
    enable_sequence_parallel: bool = True
    pipeline_parallel_degree: int = 1
    pipeline_parallel_schedule: PipelineSchedule = PipelineSchedule["1F1B"]
    pipeline_parallel_microbatch_size: int = 1
    context_parallel_degree: int = 1
    expert_parallel_degree: int = 1
    # parallel=auto (parent/auto): the planner chooses the degrees, checkpointing and local batch
    auto: bool = False
    auto_top: int = 5  # rows of the ranked table the dry run prints (auto_plan.json has all)
    auto_traces: int = 3  # layouts the trace confirms, at most (more only while none fits)
    auto_budget: int = 60  # seconds of tracing after which no further layout is traced


@dataclass
class ActivationCheckpointConf:
    mode: ACMode = ACMode.none


@dataclass
class LauncherConf:
    """The torchrun command line."""

    nnodes: int = 1
    nproc_per_node: int = -1  # -1: one process per device (per logical NeuronCore)
    rdzv_backend: RdzvBackend = RdzvBackend["c10d"]
    # auto: localhost:0 on one node; with several, the head node (first of SLURM_JOB_NODELIST):rdzv_port
    rdzv_endpoint: str = "auto"
    rdzv_port: int = 29500  # the head node's rendezvous port when rdzv_endpoint is auto
    rdzv_id: str = "auto"  # auto: SLURM_JOB_ID under Slurm, else torchrun's default
    node_rank: int = -1  # this node's place (-1: SLURM_NODEID, else 0); node 0 records the job
    log_rank: int = 0  # the local rank whose output is streamed to the terminal
    progress: Progress = Progress.auto  # the live progress line (steps, loss, tokens/s, ETA)
    oversubscribe: bool = False  # CPU: allow more processes per node than the host has cores


@dataclass
class DeviceConf:
    type: DeviceType = DeviceType.auto
    lnc: int = 2  # Neuron logical core size (1 or 2); ignored elsewhere
    instance: str = "trn2.48xlarge"  # Neuron instance type; ignored elsewhere
    compile_cache: str = "~/.cache/neuron-neff"  # TORCH_NEURONX_NEFF_CACHE_DIR (persistent)


@dataclass
class CheckpointConf:
    """torchtitan ``CheckpointManager.Config`` fields."""

    enable: bool = False
    folder: str = "checkpoint"
    interval: int = 500
    initial_load_path: str | None = None
    initial_load_model_only: bool = True
    initial_load_in_hf: bool = False
    last_save_model_only: bool = True
    last_save_in_hf: bool = False
    export_dtype: ExportDtype = ExportDtype["float32"]
    keep_latest_k: int = 10
    load_step: int = -1
    load_only: bool = False
    # ours, not torchtitan's:
    save_rng: bool = True  # save every rank's RNG streams with each checkpoint (resume is exact)
    allow_partial_load: bool = False  # HF initial load with missing/unexpected keys: warn, not fail
    export_check: bool = True  # after last_save_in_hf: reload with transformers, compare logits
    hf_max_shard_size: str = "5GB"  # HF export: shards of at most this (as save_pretrained: 5GB, 500MB)
    async_mode: AsyncMode = AsyncMode["disabled"]


@dataclass
class TrackingConf:
    """Each tracker is switched on by its own option, so ``tracking=[wandb,tensorboard]`` composes."""

    wandb: bool = False
    wandb_mode: WandbMode = WandbMode["auto"]  # auto: online when WANDB_API_KEY is set, else offline
    project: str = "qwen3-trainium"
    tensorboard: bool = False  # torchtitan's TensorBoard logger, under <run_dir>/tb
    log_freq: int = 1
    run_id: str = ""  # W&B run id; empty: made once and kept in <run_dir>/wandb_run_id (resume reuses it)
    group: str = ""  # W&B group; empty: the multirun's sweep id (none for a single run)
    tags: list[str] = field(default_factory=list)  # added to the model:, device:, parallel: tags
    # MoE: warn when an expert of a layer receives no token for this many steps in a row (0: off)
    expert_idle_warn_steps: int = 100


@dataclass
class CompileConf:
    """torchtitan ``CompileConfig``: ``torch.compile`` per TransformerBlock and of the loss."""

    enable: bool = False
    components: list[CompileComponent] = field(
        default_factory=lambda: [CompileComponent.model, CompileComponent.loss]
    )
    backend: CompileBackend = CompileBackend.auto
    # null: on where it can help (CUDA, tensor parallel > 1, the model compiled), else off
    enable_async_tensor_parallel: bool | None = None


@dataclass
class MemoryConf:
    """How pre-flight sizes a rank's device memory before launch (and the step time, with trace)."""

    mode: MemoryMode = MemoryMode.auto
    timeout: int = 600  # seconds the trace may take before pre-flight gives up on it


@dataclass
class OverrideConf:
    """torchtitan ``OverrideConfig``: extra ``@override`` factories (``module.function``)."""

    imports: list[str] = field(default_factory=list)


@dataclass
class DebugConf:
    """torchtitan ``DebugConfig`` fields."""

    seed: int | None = 42
    deterministic: bool = False


@dataclass
class RunConf:
    model: ModelConf = field(default_factory=ModelConf)
    training: TrainingConf = field(default_factory=TrainingConf)
    optimizer: OptimizerConf = field(default_factory=OptimizerConf)
    lr_scheduler: LRSchedulerConf = field(default_factory=LRSchedulerConf)
    parallel: ParallelConf = field(default_factory=ParallelConf)
    activation_checkpoint: ActivationCheckpointConf = field(default_factory=ActivationCheckpointConf)
    launcher: LauncherConf = field(default_factory=LauncherConf)
    device: DeviceConf = field(default_factory=DeviceConf)
    data: DataConf = field(default_factory=DataConf)
    checkpoint: CheckpointConf = field(default_factory=CheckpointConf)
    tracking: TrackingConf = field(default_factory=TrackingConf)
    debug: DebugConf = field(default_factory=DebugConf)
    compile: CompileConf = field(default_factory=CompileConf)
    eval: EvalConf = field(default_factory=EvalConf)
    peft: PeftConf = field(default_factory=PeftConf)
    objective: ObjectiveConf = field(default_factory=ObjectiveConf)
    memory: MemoryConf = field(default_factory=MemoryConf)
    override: OverrideConf = field(default_factory=OverrideConf)
    dry_run: bool = False
    doctor: bool = False  # report this machine's readiness (devices, tools, versions) and exit
    run_name: str = ""  # W&B run name; empty: made from the command-line overrides
    preflight_cache: bool = True  # reuse a pre-flight pass of the same config, code, versions, inputs
