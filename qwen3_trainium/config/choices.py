"""The closed choices of the config schema (``schema.py``): one Enum per choice, the source of
each set of values beside it.
"""

from enum import Enum


class ModelPath(Enum):
    native = "native"
    hf = "hf"
    nki_moe = "nki_moe"


class AttnBackend(Enum):
    auto = "auto"  # sdpa on cpu and neuron, flex on cuda
    sdpa = "sdpa"  # causal SDPA with per-document masking (ours; trains on every device)
    flex = "flex"  # torchtitan FlexAttention (no backward on CPU)
    varlen = "varlen"  # torchtitan VarlenAttention (needs CUDA flash attention)
    causal = "causal"  # causal SDPA over the whole row, no document masks: unpacked data only


class MoEBalance(Enum):
    """``model.moe_balance``: how a Qwen3-MoE run keeps its experts' load even (docs/moe.md)."""

    auto = "auto"  # aux_loss when the weights come from or go to Hugging Face, else bias
    aux_loss = "aux_loss"  # Transformers' load_balancing_loss_func (Qwen3MoeForCausalLM)
    bias = "bias"  # torchtitan's aux-loss-free expert bias (MoE.Config.load_balance_coeff)
    none = "none"


class RopeType(Enum):
    """``model.rope_scaling.rope_type``: Hugging Face's ``rope_parameters["rope_type"]`` values that
    Qwen3 uses (transformers ``modeling_rope_utils.py`` ``ROPE_INIT_FUNCTIONS``)."""

    auto = "auto"  # the HF checkpoint's own (config.json), else default
    default = "default"  # plain RoPE, no scaling
    yarn = "yarn"  # YaRN (Qwen3's documented recipe past 32,768 tokens)


class DataFormat(Enum):
    """What the records are (``data/chat/records.py``): plain text, or chat in one of four formats."""

    text = "text"  # {"text": ...} records, packed by torchtitan's text loader
    auto = "auto"  # chat: each record's format from its keys
    messages = "messages"  # OpenAI {"messages": [{"role", "content", "reasoning_content"?}]}
    sharegpt = "sharegpt"  # {"conversations": [{"from", "value"}]}
    prompt_completion = "prompt_completion"  # {"prompt", "completion"}
    alpaca = "alpaca"  # {"instruction", "input"?, "output"}
    # objective=dpo: TRL's preference records, {prompt?, chosen, rejected} (data/preference/)
    preference = "preference"


class LossOn(Enum):
    assistant = "assistant"  # every assistant turn (less those marked train: false)
    last_assistant = "last_assistant"  # the final assistant turn only
    all = "all"  # every token (less assistant turns marked train: false)


class HistoryThinking(Enum):
    as_rendered = "as_rendered"  # the template's render (Qwen3 drops earlier turns' reasoning)
    keep = "keep"  # one sample per trained turn, each keeping its own reasoning


class Overflow(Enum):
    drop = "drop"  # a sample longer than seq_len is left out (counted)
    truncate = "truncate"  # cut to seq_len (counted); skipped if nothing supervised is left


class DeviceType(Enum):
    auto = "auto"  # neuron, then cuda, then cpu
    cpu = "cpu"
    cuda = "cuda"
    neuron = "neuron"


class Dtype(Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"


class ParamDtype(Enum):
    auto = "auto"  # float32 on cpu (bf16 buys nothing there), bfloat16 elsewhere
    float32 = "float32"
    bfloat16 = "bfloat16"


class Progress(Enum):
    auto = "auto"  # a live progress line when stdout is a terminal, else rank 0's log streams
    on = "on"  # always the progress line (rank logs only in <run_dir>/logs)
    off = "off"  # always stream rank 0's log


class CompileBackend(Enum):
    auto = "auto"  # neuron on Neuron, inductor on CPU and CUDA
    inductor = "inductor"  # CPU (needs a C++ compiler) and CUDA
    neuron = "neuron"  # torch-neuronx's backend (AWS's Trainium throughput setting)
    aot_eager = "aot_eager"  # traced, run eagerly: debugging a compile failure, any device
    eager = "eager"  # Dynamo only: debugging, any device


class CompileComponent(Enum):
    model = "model"  # each TransformerBlock, fullgraph
    loss = "loss"


class MemoryMode(Enum):
    # the estimate where it is calibrated against the trace (within 15% on the docs' trn2 lines it
    # decides: tests/parent/test_readme_trainium.py), else the trace: model=hf on Neuron (Transformers' modules, not modelled tensor by tensor)
    auto = "auto"
    estimate = "estimate"  # by hand from the model's shape: milliseconds (memory/estimate.py)
    trace = "trace"  # the second step traced under FakeTensorMode on a fake world: seconds (memory/trace.py)


class ACMode(Enum):
    none = "none"
    selective = "selective"
    full = "full"


# Closed choices whose spellings are not Python names ("for-loop", "1F1B", "async") use Enum's
# functional form: OmegaConf matches a string against member names, so name == value here.
def _choices(name: str, values: tuple[str, ...]) -> type[Enum]:
    return Enum(name, [(v, v) for v in values], module=__name__, qualname=name)


# torchtitan components/optimizer/optimizer.py: OptimizersContainer._resolve_optimizer_factory
# (DistMuon is left out: it takes other arguments than the AdamW ones this schema passes).
OptimizerName = _choices("OptimizerName", ("AdamW", "Adam"))
# torchtitan components/optimizer/optimizer.py: OptimizersContainer.Config.implementation (Literal)
OptimizerImpl = _choices("OptimizerImpl", ("fused", "foreach", "for-loop", "fused_opt_states_bf16"))
# torchtitan components/optimizer/lr_scheduler.py: LRSchedulersContainer.Config.decay_type (Literal)
DecayType = _choices("DecayType", ("linear", "sqrt", "cosine"))
# torchtitan config/configs.py: ParallelismConfig.fsdp_reshard_after_forward (Literal)
ReshardAfterForward = _choices("ReshardAfterForward", ("default", "always", "never"))
# torch distributed/pipelining/schedules.py: get_schedule_class's schedule_map
PipelineSchedule = _choices(
    "PipelineSchedule",
    ("1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"),
)
# torchtitan components/checkpointer/base.py: export_dtype; dcp.py: async_mode (both Literal)
ExportDtype = _choices("ExportDtype", ("float32", "bfloat16", "float16"))
AsyncMode = _choices("AsyncMode", ("disabled", "async", "async_with_pinned_mem"))
# torchrun --rdzv_backend (torch distributed/elastic/rendezvous/registry.py)
RdzvBackend = _choices("RdzvBackend", ("c10d", "static", "etcd", "etcd-v2"))
# W&B's WANDB_MODE values, plus auto: online when WANDB_API_KEY is set, else offline
WandbMode = _choices("WandbMode", ("auto", "online", "offline", "disabled"))


class PeftMethod(Enum):
    none = "none"  # full fine-tuning
    lora = "lora"  # torchtitan's LoRAConverter: frozen base, rank-r adapters (models/lora.py)


class Objective(Enum):
    """``objective.kind``: what the run trains the model to do (docs/dpo.md)."""

    sft = "sft"  # next-token cross-entropy on the supervised tokens (every data format)
    dpo = "dpo"  # direct preference optimisation on chosen/rejected pairs (data.format=preference)


class DPOLoss(Enum):
    """``objective.dpo.loss_type``: TRL 1.16.0's per-pair losses (``trl/trainer/dpo_trainer.py``
    ``DPOTrainer._compute_loss``). TRL's aot, aot_unpaired and sft depend on the composition of
    the micro-batch, which packing changes: not offered."""

    sigmoid = "sigmoid"  # the DPO paper: -log sigmoid(beta * delta)
    hinge = "hinge"  # SLiC: relu(1 - beta * delta)
    ipo = "ipo"  # IPO: (length-normalised delta - 1 / (2 beta))^2
    robust = "robust"  # rDPO, with label_smoothing the label noise
    exo_pair = "exo_pair"  # EXO, label_smoothing > 0
    bco_pair = "bco_pair"
    sppo_hard = "sppo_hard"
    nca_pair = "nca_pair"
    apo_zero = "apo_zero"
    apo_down = "apo_down"
    discopop = "discopop"
    sigmoid_norm = "sigmoid_norm"


class DPOReference(Enum):
    """``objective.dpo.reference``: where the reference log-probs come from (docs/dpo.md)."""

    auto = "auto"  # adapters_off with peft=lora, else precompute
    precompute = "precompute"  # one no-grad pass over the data before step 1, stored and reused
    adapters_off = "adapters_off"  # peft=lora: the same model with its adapters switched off, per step
