"""TRL 1.16.0's ``DPOTrainer`` as the oracle of objective=dpo's tests (tests/rank/test_dpo_*.py),
on the shipped tiny checkpoints, in float32 on CPU.

``step`` is TRL's own step-1 loss: ``DPOTrainer._compute_loss`` (a private method: TRL is pinned,
trl==1.16.0) on TRL's collated batch of TRL's tokenized pairs, then its backward; with
``ref_logps`` it takes TRL's precomputed-reference path (the reference sums ride in the batch).
``packed_row`` lays the same tokenized pairs out as objective=dpo's row contract
(``data/preference``): chosen_0, rejected_0, chosen_1, ...; positions restarting per document;
labels on completion targets only; padding to a length the chunked loss divides.
"""

from __future__ import annotations

import contextlib
import os

import torch

from qwen3_trainium.data.preference import PAIR_KEY, SEGMENT_KEY, max_pairs

BETA = 0.1
# the pairs of the research oracle (issue 41): a system turn, short and long completions
PAIRS = [
    {
        "prompt": [{"role": "user", "content": "What is the capital of Kenya?"}],
        "chosen": [{"role": "assistant", "content": "The capital of Kenya is Nairobi."}],
        "rejected": [{"role": "assistant", "content": "It is Paris."}],
    },
    {
        "prompt": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 18 plus 6?"},
        ],
        "chosen": [{"role": "assistant", "content": "24."}],
        "rejected": [{"role": "assistant", "content": "18 plus 6 is 25, I think."}],
    },
    {
        "prompt": [{"role": "user", "content": "What is 12 minus 3?"}],
        "chosen": [{"role": "assistant", "content": "12 minus 3 is 9."}],
        "rejected": [{"role": "assistant", "content": "12 minus 3 is 8."}],
    },
]
# the label smoothing each loss type is tested with (robust and exo_pair read it; exo_pair needs > 0)
SMOOTHING = {"robust": 0.1, "exo_pair": 1e-3}


@contextlib.contextmanager
def _quiet_env():
    """No Hub, no telemetry ping (TRL skips it when CI is set), no progress bars; restored after."""
    keys = {"HF_HUB_OFFLINE": "1", "CI": "1", "TQDM_DISABLE": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def load(path, *, perturb: bool = False):
    """The HF checkpoint at ``path`` in float32; ``perturb``: + 0.02 N(0, 1) (seed 0) on every
    parameter, so that the policy differs from the reference (else every reward is 0)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if perturb:
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=generator))
    return model


def trainer(policy, ref, tokenizer_path, output_dir, *, peft_config=None, **kwargs):
    """A DPOTrainer over PAIRS in one batch (sigmoid until ``configure``)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    with _quiet_env():
        args = DPOConfig(
            output_dir=str(output_dir),
            beta=BETA,
            loss_type=["sigmoid"],
            per_device_train_batch_size=len(PAIRS),
            max_length=None,
            report_to="none",
            bf16=False,
            fp16=False,
            use_cpu=True,
            logging_steps=1,
            max_steps=1,
            save_strategy="no",
            seed=0,
            disable_tqdm=True,
            **kwargs,
        )
        return DPOTrainer(
            model=policy,
            ref_model=ref,
            args=args,
            train_dataset=Dataset.from_list(PAIRS),
            processing_class=AutoTokenizer.from_pretrained(tokenizer_path),
            peft_config=peft_config,
        )


def configure(tr, loss_type: str) -> None:
    """TRL's attributes that ``_compute_loss`` reads (set in DPOTrainer.__init__ from DPOConfig)."""
    tr.loss_types, tr.loss_weights = [loss_type], [1.0]
    tr.label_smoothing = SMOOTHING.get(loss_type, 0.0)


def step(tr, ref_logps=None) -> tuple[float, dict, float]:
    """TRL's loss, its logged metrics and the gradient norm of its backward, on PAIRS."""
    batch = tr.data_collator([tr.train_dataset[i] for i in range(len(PAIRS))])
    tr.precompute_ref_logps = ref_logps is not None
    if ref_logps is not None:
        batch["ref_chosen_logps"], batch["ref_rejected_logps"] = ref_logps
    tr.model.train()  # metrics go to _metrics["train"] only in train mode
    tr.model.zero_grad()
    loss = tr._compute_loss(tr.model, batch, False)
    loss.backward()
    grads = [p.grad.double().norm() ** 2 for p in tr.model.parameters() if p.grad is not None]
    metrics = {k: v[-1] for k, v in tr._metrics["train"].items()}
    tr._metrics["train"].clear()
    return float(loss.detach()), metrics, float(torch.stack(grads).sum().sqrt())


def packed_row(tr, pad_id: int, pairs=None, length: int | None = None) -> dict[str, torch.Tensor]:
    """``pairs`` (indices into PAIRS, default all) as one objective=dpo row ([1, L] tensors;
    ``dpo_pair`` [1, max_pairs(L)]) from TRL's own tokenization (``prompt_ids``, ``chosen_ids``,
    ``rejected_ids``), padded to ``length`` or to the next multiple of 8 (the chunked loss's)."""
    pairs = list(range(len(PAIRS))) if pairs is None else list(pairs)
    ids, pos, labels, segment = [], [], [], []
    for j, index in enumerate(pairs):
        example = tr.train_dataset[index]
        for side, name in enumerate(("chosen_ids", "rejected_ids")):
            prompt, completion = example["prompt_ids"], example[name]
            doc = prompt + completion
            ids += doc[:-1]
            pos += range(len(doc) - 1)
            for t in range(1, len(doc)):
                completion_target = t >= len(prompt)
                labels.append(doc[t] if completion_target else -100)
                segment.append(2 * j + side if completion_target else -1)
    pad = (length - len(ids)) if length is not None else -len(ids) % 8
    ids, pos, labels, segment = (
        ids + [pad_id] * pad,
        pos + list(range(pad)),
        labels + [-100] * pad,
        segment + [-1] * pad,
    )
    keys = pairs + [-1] * (max_pairs(len(ids)) - len(pairs))
    row = {"input": ids, "positions": pos, "labels": labels, SEGMENT_KEY: segment, PAIR_KEY: keys}
    return {k: torch.tensor([v]) for k, v in row.items()}
