"""Typed schemas of the data, adapter and evaluation sections (``data``, ``peft``, ``eval``): what a
run trains on and how it is judged. Part of ``schema.py``'s ``RunConf``, which re-exports them."""

from dataclasses import dataclass, field

from qwen3_trainium.config.choices import (
    DataFormat,
    DPOLoss,
    DPOReference,
    HistoryThinking,
    LossOn,
    Objective,
    Overflow,
    PeftMethod,
)

MISSING = "???"  # omegaconf.MISSING's value: a required field (ranks import no omegaconf)


@dataclass
class DataConf:
    """torchtitan dataloader fields plus the tokenizer directory (``hf_assets_path``)."""

    dataset: str = "c4_test"
    dataset_path: str | None = MISSING  # required: each data option sets it (null: hub)
    # The tokenizer directory; auto: the checkpoint's own when fine-tuning from an HF directory
    # (checkpoint.initial_load_in_hf), else the shipped one (model=hf: always model.hf_model's).
    hf_assets_path: str = "auto"
    allow_other_tokenizer: bool = False  # train an HF checkpoint on a tokenizer that is not its own
    # The held-out data eval=on scores (heldout.py): a directory or file of its own, else the
    # corpus's own validation split (validation.jsonl, ...), else every record the fraction picks
    # (which the training stream then skips). Unused with eval=off.
    validation_path: str | None = None
    validation_fraction: float = 0.05
    # Chat SFT (data=chat, data/chat/): records in a chat format, the model's own chat template,
    # exact loss masks, samples packed with per-document positions.
    format: DataFormat = DataFormat.text
    chat_template: str | None = None  # a .jinja (or tokenizer_config.json) when the tokenizer has none
    chat_template_kwargs: dict = field(
        default_factory=dict
    )  # e.g. {enable_thinking: false}; a record's own win
    loss_on: LossOn = LossOn.assistant
    history_thinking: HistoryThinking = HistoryThinking.as_rendered
    overflow: Overflow = Overflow.drop
    packing: bool = True  # false: one sample per row, padded
    preview: int = 0  # write N packed rows to data_preview.md / data_preview.jsonl in the run dir


# Hugging Face's names. Also gate_proj, up_proj, down_proj: Linear modules on dense flavors, the
# experts' parameters on MoE (PEFT's target_parameters, models/expert_lora.py; gate and up together)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass
class PeftConf:
    """Parameter-efficient fine-tuning (``peft=lora``): torchtitan's ``LoRAConverter`` on the model
    spec, base weights frozen, adapters exported as a Hugging Face PEFT directory (``models/lora.py``).
    No dropout: torchtitan's ``LoRALinear`` has none to configure."""

    method: PeftMethod = PeftMethod.none
    rank: int = 8
    alpha: float = 16.0  # the adapters' output is scaled by alpha / rank
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))  # HF names
    merge_on_export: bool = False  # also write the merged full model beside the adapter


DEFAULT_SAMPLE_PROMPTS = ("The capital of France is", "Once upon a time")


@dataclass
class EvalConf:
    """Held-out validation (torchtitan's ``Validator``) and greedy samples after training."""

    enable: bool = False
    freq: int = 100  # validate every this many steps, and after the last one
    steps: int = 8  # batches per validation (never -1: ranks that disagree on -1 can hang)
    sample_prompts: list[str] = field(default_factory=lambda: list(DEFAULT_SAMPLE_PROMPTS))
    sample_tokens: int = 24  # greedy tokens per prompt at the end (0: no samples)
    # A synthetic passkey check after training (rank/passkey.py): a random key hidden at each depth
    # of a filler text long_context_length tokens long (0: training.seq_len), the model asked for it.
    long_context: bool = False
    long_context_length: int = 0
    long_context_depths: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    long_context_trials: int = 2  # keys per depth


@dataclass
class DPOConf:
    """``objective=dpo``: TRL 1.16.0's ``DPOConfig`` names and defaults (``trl/trainer/dpo_config.py``)."""

    beta: float = 0.1
    loss_type: list[DPOLoss] = field(default_factory=lambda: [DPOLoss.sigmoid])
    loss_weights: list[float] = field(default_factory=list)  # one per loss_type; empty: all 1.0
    label_smoothing: float = 0.0  # robust (0 <= e < 0.5) and exo_pair (e > 0) only, as TRL 1.16
    discopop_tau: float = 0.05
    reference: DPOReference = DPOReference.auto
    # The checkpoint the reference log-probs come from (an HF directory); null: the run's initial
    # weights (checkpoint.initial_load_path), as TRL's ref_model=None.
    reference_path: str | None = None


@dataclass
class ObjectiveConf:
    kind: Objective = Objective.sft
    dpo: DPOConf = field(default_factory=DPOConf)
