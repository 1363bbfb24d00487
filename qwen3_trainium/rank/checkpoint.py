"""torchtitan's checkpointer plus what it leaves out: RNG state, complete HF exports, a probe.

``Qwen3CheckpointManager`` (a ``CheckpointManager`` subclass with its own ``Config``, torchtitan's
extension point) adds:
- ``rng``: every rank's torch / Python / NumPy RNG state, so a resumed run continues the same
  random streams (torchtitan saves none);
- ``save_at_stop``: a full checkpoint at the step a stop signal ends the run on, off the
  ``interval`` (it widens the private ``_should_save`` for that one call);
- after a ``last_save_in_hf`` export: the files and sharding that make the step directory a
  drop-in HF model directory (``hf_export.py``), and the logits of the trained model on a fixed
  probe batch (``export_probe.pt``): its weights rounded to the export dtype (what the export
  holds), computed in float32 whatever the run trains in (``float32_forward.py``), so that the
  launcher's comparison with ``AutoModelForCausalLM.from_pretrained(dtype=float32)`` of the export
  passes or fails in bfloat16 runs too (``probe.py``, ``parent/export_check.py``).
"""

from __future__ import annotations

import contextlib
import json
import pickle
import random
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.tools.logging import logger

from qwen3_trainium.models.hf_export import complete_hf_export, parse_size, reshard

# the probe lives in probe.py; its names stay importable from here, where they were first
from qwen3_trainium.rank.probe import PROBE_MULTIPLE, PROBE_TEXT, model_logits, probe_tokens, save_probe

__all__ = ["PROBE_MULTIPLE", "PROBE_TEXT", "Qwen3CheckpointManager", "model_logits", "probe_tokens"]


class RngState:
    """Stateful: this rank's RNG streams, keyed by rank so each rank restores its own."""

    def _key(self) -> str:
        return f"rank_{dist.get_rank() if dist.is_initialized() else 0}"

    def state_dict(self) -> dict:
        state = (torch.get_rng_state(), random.getstate(), np.random.get_state())
        return {self._key(): pickle.dumps(state)}

    def load_state_dict(self, state_dict: dict) -> None:
        blob = state_dict.get(self._key())
        if blob is None:
            return  # saved by a different world size: keep this run's streams
        torch_state, py_state, np_state = pickle.loads(blob)
        torch.set_rng_state(torch_state)
        random.setstate(py_state)
        np.random.set_state(np_state)


class Qwen3CheckpointManager(CheckpointManager):
    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        save_rng: bool = True
        hf_config_json: str = ""
        """config.json text written into an HF export (empty: no export completion)."""

        tokenizer_dir: str = ""
        """Where the tokenizer files copied into an HF export come from."""

        probe_path: str = ""
        """Where to save the trained model's logits on the probe batch (empty: no probe)."""

        source_dir: str = ""
        """The HF directory the run started from: its generation_config.json goes into the export."""

        hf_max_shard_size: str = "5GB"
        """The export's safetensors files are at most this large (more: shards plus the index)."""

        chat_template: str = ""
        """The text of data.chat_template: written into an HF export as chat_template.jinja."""

        lora: dict = field(default_factory=dict)
        """peft=lora: the ``peft`` section's fields plus ``base`` (the source model's path or id). The HF export becomes a PEFT adapter
        directory (``step-N-adapter``), plus the merged full model (``step-N``) when ``merge``."""

    def __init__(self, config: Config, **kwargs) -> None:
        super().__init__(config, **kwargs)
        if not self.enable:
            return
        if config.save_rng:
            self.states["rng"] = RngState()
        self._export = config
        self._saved_step: int | None = None
        self._save_now = False

    def save_at_stop(self, curr_step: int) -> bool:
        """Save a resumable checkpoint of ``curr_step`` now, whatever ``interval`` is (a stop
        signal, ``trainer.py``), and wait until it is on disk. False when nothing is saved."""
        if not self.enable or self.load_only:
            return False
        if self._saved_step != curr_step:  # else the interval or last-step save of this step ran
            self._save_now = True
            try:
                self.save(curr_step)
            finally:
                self._save_now = False
        self.maybe_wait_for_saving()  # an async save must be written before the rank exits
        return self._saved_step == curr_step

    def _should_save(self, curr_step: int, last_step: bool = False) -> bool:
        # torchtitan/components/checkpointer/dcp.py: ``_save`` returns at once unless this says
        # yes (interval, last step, first step); a stop's save is none of those
        return self._save_now or super()._should_save(curr_step, last_step)

    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        saved = super()._save(curr_step, last_step)
        if saved:
            self._saved_step = curr_step
        return saved

    def _save_last_step(self, curr_step: int) -> None:
        config_json = self._export.hf_config_json if self.last_save_in_hf else ""
        if self.last_save_in_hf and self._untied_but_declared_tied():
            # torchtitan's HF backend un-ties embedding and lm_head for FSDP, so both train; the
            # adapter would still drop lm_head as "tied" and the export would lose it.
            self.sd_adapter._tie_word_embeddings = False
            config_json = (
                json.dumps({**json.loads(config_json), "tie_word_embeddings": False}, indent=2) + "\n"
            )
        if self.last_save_in_hf and self._export.lora:
            self._save_adapter(curr_step)
            if not self._export.lora["merge_on_export"]:
                self._save_probe()
                return
            from qwen3_trainium.models import lora

            lora.merge_(self.states["model"].model[0])  # the same function, adapters folded in
        super()._save_last_step(curr_step)
        if not self.last_save_in_hf:
            return
        export_dir = self._create_checkpoint_id(curr_step)
        if not dist.is_initialized() or dist.get_rank() == 0:
            complete_hf_export(
                export_dir,
                config_json,
                self._export.tokenizer_dir,
                self._export.source_dir,
                self._export.chat_template,
            )
            reshard(export_dir, parse_size(self._export.hf_max_shard_size))
        self._save_probe()

    forward_context = contextlib.nullcontext
    """The trainer's ``train_context`` (``trainer.SampleAfterTraining`` sets it): the probe's forward
    runs where the training forward does, as torchtitan's Validator's does (``validation_context``)."""

    def _save_probe(self) -> None:
        if self._export.probe_path:
            model = self.states["model"].model[0]
            with self.forward_context():
                save_probe(
                    model, self._export.tokenizer_dir, self._export.probe_path, self._export.export_dtype
                )

    def _save_adapter(self, curr_step: int) -> None:
        """The adapters as a Hugging Face PEFT directory beside the export (``models/lora.py``)."""
        from qwen3_trainium.models import expert_lora_io, lora

        spec, model = self._export.lora, self.states["model"].model[0]
        tensors = lora.peft_state_dict(model, self.sd_adapter)  # every rank: FSDP gathers
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        directory = lora.adapter_dir(self._create_checkpoint_id(curr_step))
        config = lora.adapter_config(
            base_model=spec["base"],
            rank=spec["rank"],
            alpha=spec["alpha"],
            targets=spec["target_modules"],
            moe=bool(expert_lora_io.expert_lora_modules(model)),  # experts as PEFT target_parameters
        )
        lora.write_adapter(directory, tensors, config)
        complete_hf_export(directory, "", self._export.tokenizer_dir, "", self._export.chat_template)
        logger.info(f"LoRA: {len(tensors) // 2} adapters written as a PEFT directory: {directory}")

    def _untied_but_declared_tied(self) -> bool:
        model = self.states["model"].model[0]
        head, embed = getattr(model, "lm_head", None), getattr(model, "tok_embeddings", None)
        if not getattr(self.sd_adapter, "_tie_word_embeddings", False) or head is None or embed is None:
            return False
        return head.weight is not embed.weight


def hf_config_dict(model_config, rope) -> dict:
    """An HF ``config.json`` for a torchtitan Qwen3 model config (dense or MoE); ``rope``: the
    run's ``config.rope.Rope`` (its RoPE keys in both of HF's forms, ``models/hf_rope.py``)."""
    from qwen3_trainium.models.hf_rope import rope_fields

    first = model_config.layers[0]
    attn = first.attention
    head_dim = attn.head_dim or model_config.dim // attn.n_heads
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": model_config.vocab_size,
        "hidden_size": model_config.dim,
        "num_hidden_layers": len(model_config.layers),
        "num_attention_heads": attn.n_heads,
        "num_key_value_heads": attn.n_kv_heads or attn.n_heads,
        "head_dim": head_dim,
        **rope_fields(rope, attn.rope.theta),
        "rms_norm_eps": attn.qk_norm.eps if attn.qk_norm is not None else 1e-6,
        "tie_word_embeddings": model_config.enable_weight_tying,
        "hidden_act": "silu",
        "attention_bias": False,
        "torch_dtype": "float32",
    }
    moe = getattr(first, "moe", None)
    if moe is not None:
        router, experts = moe.router, moe.routed_experts.inner_experts
        cfg.update(
            architectures=["Qwen3MoeForCausalLM"],
            model_type="qwen3_moe",
            num_experts=moe.num_experts,
            num_experts_per_tok=router.top_k,
            moe_intermediate_size=experts.hidden_dim,
            norm_topk_prob=router.route_norm,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            intermediate_size=experts.hidden_dim,
        )
    else:
        cfg["intermediate_size"] = first.feed_forward.w1.out_features
    return cfg


def hf_config_json(model_config, rope) -> str:
    return json.dumps(hf_config_dict(model_config, rope), indent=2) + "\n"
