"""torchtitan's trainers, stopping at a step boundary when any rank is asked to (SIGTERM), and
writing greedy samples of the trained model after the last step (eval=on, ``samples.py``).

``Trainer.train`` evaluates ``self.should_continue_training()`` before every step, on every
rank, after the previous step's ``checkpointer.save`` (``torchtitan/trainer.py``:
``while self.should_continue_training():``): the step boundary a subclass can hook without
copying the loop. There each rank adds its stop flag (``stop.requested()``, set by the SIGTERM
handler) to an all-reduce MAX, so all ranks agree on the step even when the signal reached them
at different times, and at that step they all save (``Qwen3CheckpointManager.save_at_stop``,
whatever ``checkpoint.interval`` is) and leave the loop. torchtitan's ``main`` then closes the
trainer and the process group as after a last step, and the rank exits 0; rank 0 records the
stop in ``stopped.json`` for the launcher, which reports it (exit 143, job.json ``interrupted``).

Cost: one all-reduce of one int per step, over gloo with a CPU tensor (the default group on
CPU; elsewhere a gloo group of its own, as torchtitan's async checkpointer makes one, so the
accelerator's stream is not synchronised).

Samples: ``SampleAfterTraining.train`` runs torchtitan's ``train`` (which ends after the last
step's save and validation, on every rank) and then the decode, on every rank, since each forward
of an FSDP or TP model is a collective; in float32, on the weights as an HF export holds them when
the run makes one (``samples.py``). A run a signal stopped writes none.

Subclassing ``Trainer`` with a nested ``Config`` is torchtitan's own pattern
(``torchtitan/models/flux/trainer.py``, ``experiments/transformers_modeling_backend/trainer.py``);
``Configurable.__init_subclass__`` makes ``Config.build()`` construct the subclass.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torchtitan.tools.logging import logger

from qwen3_trainium.rank import passkey, samples, stop
from qwen3_trainium.rank.context_parallel import ContextParallelAttention
from qwen3_trainium.rank.dpo import DPOObjective
from qwen3_trainium.rank.dpo_config import DPOSettings
from qwen3_trainium.rank.expert_load import ExpertLoad, ExpertLoadConfig
from qwen3_trainium.rank.moe_balance import BalanceConfig, MoEBalance
from qwen3_trainium.rank.passkey import PasskeyConfig
from qwen3_trainium.rank.samples import SampleConfig
from qwen3_trainium.shared import stopfiles
from qwen3_trainium.shared.contract import RUN_DIR_ENV


def agreement_group():
    """The group the stop flags are reduced over (None without torch.distributed)."""
    if not dist.is_initialized():
        return None
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    # as torchtitan's async checkpointer makes its own (components/checkpointer/dcp.py); a
    # collective: every rank calls it at its first boundary
    return dist.new_group(backend="gloo")


def agreed_signal(group) -> int:
    """The largest stop signal any rank holds (0: none), the same on every rank."""
    local = stop.requested()
    if group is None:
        return local
    flag = torch.tensor([local], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return int(flag.item())


class StopAtSignal:
    """Mixin for a torchtitan ``Trainer``: stop (and save) at the step boundary after a SIGTERM."""

    _stop_group = None
    _first_step: int | None = None  # the step this process started from (a resume's is > 0)
    stopped_at: int | None = None

    def should_continue_training(self) -> bool:
        if not super().should_continue_training():
            return False
        if self._first_step is None:  # the first boundary: after the checkpoint load, before step 1
            self._first_step = self.step
            self._stop_group = agreement_group()
        signum = agreed_signal(self._stop_group)
        if not signum:
            return True
        self._stop(signum)
        return False

    def _stop(self, signum: int) -> None:
        self.stopped_at = self.step
        saved = None
        save_at_stop = getattr(self.checkpointer, "save_at_stop", None)
        if self.step > self._first_step and save_at_stop is not None and save_at_stop(self.step):
            saved = self.step  # nothing to save when no step ran in this process
        name = stopfiles.signal_name(signum)
        where = f"checkpoint at step {saved}" if saved is not None else "no checkpoint"
        logger.info(f"{name}: every rank stops after step {self.step} ({where})")
        if not dist.is_initialized() or dist.get_rank() == 0:
            stopfiles.write_json(
                stopfiles.marker_path(os.environ.get(RUN_DIR_ENV) or self.config.dump_folder),
                {"signal": signum, "signal_name": name, "step": self.step, "checkpoint_step": saved},
            )


class SampleAfterTraining:
    """Mixin for a torchtitan ``Trainer`` (after ``StopAtSignal``): greedy samples after the last
    step, when ``config.samples`` has prompts.

    The samples' forwards and the export probe's (``Qwen3CheckpointManager``) run inside the
    trainer's ``train_context``, as every training and validation forward does
    (``torchtitan/trainer.py``: ``self.train_context = get_spmd_context(...)``, handed to the
    Validator as its ``validation_context``). With the default ``spmd_backend=spmd_types`` it sets
    the current SPMD mesh, without which a tensor-parallel model's redistributions do not run: the
    vocab-parallel embedding's partial sums are never reduced (``models/common/embedding.py``), and
    its logits were 3.9 off an export holding exactly its weights (tensor parallel 2, seen)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        checkpointer = getattr(self, "checkpointer", None)
        if hasattr(checkpointer, "forward_context"):
            checkpointer.forward_context = self.train_context

    def train(self):
        super().train()
        config, check = self.config.samples, self.config.passkey
        sampling = bool(config.prompts) and config.tokens > 0
        if not (sampling or check.length > 0) or self.stopped_at is not None:
            return
        if len(self.model_parts) != 1:  # pre-flight refuses this; a stage has no whole model
            logger.warning("samples and passkey: skipped, the model is split into pipeline stages")
            return
        # the gloo group the stop flags use (made now when no step boundary made it)
        group = self._stop_group if self._first_step is not None else agreement_group()
        if sampling:
            self._sample(config, group)
        if check.length > 0:
            with self.train_context():
                record = passkey.passkey_on_ranks(self.model_parts[0], check, group, step=self.step)
            self.metrics_processor.log_passkey(record["metrics"], self.step)
            logger.info(f"passkey: {len(record['trials'])} keys at {check.length} tokens: {check.path}")

    def _sample(self, config: SampleConfig, group) -> None:
        checkpoint = self.config.checkpoint
        exported = checkpoint.enable and checkpoint.last_save_in_hf
        with self.train_context():
            record = samples.sample_on_ranks(
                self.model_parts[0],
                config,
                group,
                max_len=self.config.training.seq_len,
                round_to=checkpoint.export_dtype if exported else "",  # as the HF export holds them
                step=self.step,
                mixed_precision_param=self.config.training.mixed_precision_param,
            )
        for sample in samples.cut_short(record):
            logger.warning(
                f"samples: {sample['prompt']!r} cut at {sample['max_new_tokens']} tokens: prompt and tokens,"
                f" padded to a multiple of 256, must fit training.seq_len={self.config.training.seq_len}"
            )
        logger.info(f"samples: {len(record['samples'])} prompts, up to {config.tokens} tokens: {config.path}")


@functools.cache
def trainer_class(hf: bool) -> type:
    """torchtitan's trainer with ``SampleAfterTraining`` and ``StopAtSignal``: ``Trainer``, or for
    model=hf the transformers backend's ``HFTransformerTrainer`` (with its
    ``TransformersBackendConfig``). Built on first use, so that importing this module costs
    neither torchtitan's trainer nor Transformers."""
    if hf:
        from torchtitan.experiments.transformers_modeling_backend.configs import TransformersBackendConfig
        from torchtitan.experiments.transformers_modeling_backend.trainer import HFTransformerTrainer

        base, base_config = HFTransformerTrainer, TransformersBackendConfig
    else:
        from torchtitan.trainer import Trainer

        base, base_config = Trainer, Trainer.Config

    class StopAtSignalTrainer(
        SampleAfterTraining,
        StopAtSignal,
        DPOObjective,
        ExpertLoad,
        MoEBalance,
        ContextParallelAttention,
        base,
    ):
        @dataclass(kw_only=True, slots=True)
        class Config(base_config):
            samples: SampleConfig = field(default_factory=SampleConfig)
            """Greedy samples after the last step (``samples.py``); no prompts: none."""
            passkey: PasskeyConfig = field(default_factory=PasskeyConfig)
            """The passkey check after the last step (``passkey.py``); length 0: none."""
            moe_balance: BalanceConfig = field(default_factory=BalanceConfig)
            """The router's auxiliary losses (``moe_balance.py``); coefficients 0: none."""
            expert_load: ExpertLoadConfig = field(default_factory=ExpertLoadConfig)
            """Per-expert load figures and idle-expert warnings (``expert_load.py``)."""
            dpo: DPOSettings = field(default_factory=DPOSettings)
            """objective=dpo (``dpo.py``); enable False: the trainer's own loss."""

    return StopAtSignalTrainer
