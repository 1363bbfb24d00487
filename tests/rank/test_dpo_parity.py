"""objective=dpo's step against TRL 1.16.0's DPOTrainer (the issue's parity check): on the shipped
tiny Qwen3, policy = tiny + 0.02 N(0, 1) (seed 0), reference = tiny, the 3 pairs of
``support/dpo_trl.py`` in float32, beta 0.1, every loss type: the loss, TRL's six metrics and the
gradient norm of one step of ours (``rank/dpo.forward_backward``: pass 1, the loss, pass 2 through
torchtitan's ChunkedLossWrapper with DPOTokenLoss) on our native model, the 3 pairs packed into
one row from TRL's own tokenization, equal TRL's ``_compute_loss`` and its backward on its padded
batch. Our reference sums come from our forward of the unperturbed model, TRL's from its ref_model.

Tolerance rtol 1e-5, atol 1e-5 (grad norm rtol 1e-4): per-side sums are -140 to -205, where two
float32 computations (a packed row against a padded batch, TRL's fused head against a plain
log_softmax) differ by up to 3e-5 (research §2.3). Also LoRA (TRL's peft_config: its reference is
the base with adapters disabled; ours switches the adapters off, no copy) and a MoE model (TRL with
``router_aux_loss_coef=0``)."""

from __future__ import annotations

import contextlib
import copy
from types import SimpleNamespace

import pytest
import torch
from conftest import resolve
from safetensors.torch import load_file
from support import dpo_trl
from torchtitan.components.loss import ChunkedLossWrapper

from qwen3_trainium.config.choices import DPOLoss
from qwen3_trainium.data import assets
from qwen3_trainium.data.preference import PAIR_KEY, SEGMENT_KEY
from qwen3_trainium.models import lora
from qwen3_trainium.rank import dpo, dpo_logps, dpo_reference
from qwen3_trainium.rank.dpo_config import DPOSettings
from qwen3_trainium.rank.dpo_loss import DPOTokenLoss, metric_means
from qwen3_trainium.rank.titan import to_trainer_config

pytest.importorskip("trl")

LORA = ("peft=lora", "peft.rank=4", "peft.alpha=8", "peft.target_modules=[o_proj,gate_proj,down_proj]")


def _titan(state: dict, seq_len: int, tmp_path, *overrides: str):
    """Our model for ``overrides`` on CPU with the HF ``state`` loaded, in training mode, returning
    hidden states, and its ChunkedLossWrapper around DPOTokenLoss (as rank/titan.py configures it)."""
    from torchtitan.config import apply_overrides

    run = resolve("device=cpu", "model.attn_backend=sdpa", f"training.seq_len={seq_len}", *overrides)
    cfg = copy.deepcopy(to_trainer_config(run, str(tmp_path)))
    cfg.model_spec.model.update_from_config(config=cfg)
    apply_overrides(cfg.override, cfg)
    with torch.device("meta"):
        model = cfg.model_spec.model.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_states(buffer_device=None)
    sd_adapter = cfg.model_spec.state_dict_adapter(cfg.model_spec.model, cfg.hf_assets_path)
    _, unexpected = model.load_state_dict(sd_adapter.from_hf(dict(state)), strict=False)
    assert unexpected == []
    loss_fn = ChunkedLossWrapper.Config(loss_fn=DPOTokenLoss.Config()).build()
    loss_fn.set_lm_head(model.lm_head)
    model._skip_lm_head = True  # what torchtitan's Trainer sets with the chunked loss
    return model.train(), loss_fn, sd_adapter


def _state(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _batch(row, model):
    extra = {"positions": row["positions"], "attention_masks": model.get_attention_masks(row["positions"])}
    return (row["input"], row["labels"], extra), (row[SEGMENT_KEY], row[PAIR_KEY])


def _ours(model, loss_fn, row, reference, kind: str) -> tuple[float, dict, float]:
    """One step of ours: (loss, metrics, gradient norm)."""
    settings = DPOSettings(enable=True, loss_types=[kind], label_smoothing=dpo_trl.SMOOTHING.get(kind, 0.0))
    model.zero_grad()
    batch, rows = _batch(row, model)
    loss, totals = dpo.forward_backward(model, loss_fn, batch, rows, reference, settings, torch.tensor(3.0))
    grads = [p.grad.double().norm() ** 2 for p in model.parameters() if p.grad is not None]
    return loss.item(), metric_means(totals), torch.stack(grads).sum().sqrt().item()


def _reference(model, loss_fn, row) -> torch.Tensor:
    """Side sums of ``model`` in eval mode, no grad (a precomputed table's numbers)."""
    (inputs, labels, extra), (segment, pairs) = _batch(row, model)
    with torch.no_grad(), dpo_logps.eval_mode(model):
        return dpo_logps.side_sums(loss_fn, model(inputs, **extra), labels, segment, 2 * pairs.shape[1])


def _assert_same(ours, theirs, kind: str) -> None:
    (loss, metrics, gnorm), (trl_loss, trl_metrics, trl_gnorm) = ours, theirs
    diffs = {"loss": abs(loss - trl_loss)} | {k: abs(v - trl_metrics[k]) for k, v in metrics.items()}
    print(
        f"{kind}: loss {loss:.7f} (TRL {trl_loss:.7f}), grad norm {gnorm:.6g} (TRL {trl_gnorm:.6g}), max diffs",
        diffs,
    )
    torch.testing.assert_close(torch.tensor(loss), torch.tensor(trl_loss), rtol=1e-5, atol=1e-5)
    for name, value in metrics.items():
        torch.testing.assert_close(torch.tensor(value), torch.tensor(trl_metrics[name]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.tensor(gnorm), torch.tensor(trl_gnorm), rtol=1e-4, atol=0)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dense")
    tiny = assets.ensure_hf_model()
    policy, ref = dpo_trl.load(tiny, perturb=True), dpo_trl.load(tiny)
    tr = dpo_trl.trainer(policy, ref, tiny, tmp / "trl")
    row = dpo_trl.packed_row(tr, pad_id=0)
    seq_len = row["input"].shape[1]
    model, loss_fn, sd_adapter = _titan(_state(policy), seq_len, tmp)
    ref_model, ref_loss_fn, _ = _titan(_state(ref), seq_len, tmp)
    return tr, model, loss_fn, row, _reference(ref_model, ref_loss_fn, row), sd_adapter


def _hf_grads(model, sd_adapter) -> dict[str, torch.Tensor]:
    """Our gradients under Transformers' parameter names (the state dict adapter's mapping, with
    the fused wqkv split as a checkpoint is)."""
    weights = {name: p.data for name, p in model.named_parameters()}
    try:
        for p in model.parameters():
            p.data = p.grad
        grads = {k: v.clone() for k, v in model.state_dict().items()}
    finally:
        for name, p in model.named_parameters():
            p.data = weights[name]
    return sd_adapter.to_hf(grads)


@pytest.mark.parametrize("kind", [kind.value for kind in DPOLoss])
def test_step_one_equals_trl_for_every_loss_type(dense, kind):
    """... and every parameter's gradient, element by element, within 1e-4 of its largest
    (4e-6 measured: the sign and the direction, which the norm alone would not check)."""
    tr, model, loss_fn, row, reference, sd_adapter = dense
    dpo_trl.configure(tr, kind)
    _assert_same(_ours(model, loss_fn, row, reference, kind), dpo_trl.step(tr), kind)
    ours = _hf_grads(model, sd_adapter)
    for name, p in tr.model.named_parameters():
        assert (ours[name] - p.grad).abs().max() <= 1e-4 * p.grad.abs().max(), name


@pytest.fixture(scope="module")
def lora_pair(tmp_path_factory):
    """TRL with a PEFT LoRA on the tiny model (no ref model: the reference is the base with the
    adapters disabled) and ours with the same adapters, non-zero (A and B 0.05 N(0, 1))."""
    from peft import LoraConfig, set_peft_model_state_dict

    tmp = tmp_path_factory.mktemp("lora")
    tiny = assets.ensure_hf_model()
    base = dpo_trl.load(tiny)
    state = _state(base)
    targets = ["o_proj", "gate_proj", "down_proj"]
    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0)
    tr = dpo_trl.trainer(base, None, tiny, tmp / "trl", peft_config=config)
    row = dpo_trl.packed_row(tr, pad_id=0)
    model, loss_fn, sd_adapter = _titan(state, row["input"].shape[1], tmp, *LORA)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(0.05 * torch.randn(p.shape, generator=generator))
    adapters = lora.peft_state_dict(model, sd_adapter)
    assert len(adapters) == 2 * len(targets) * len(model.layers)
    assert set_peft_model_state_dict(tr.model, adapters).unexpected_keys == []
    return tr, model, loss_fn, row, state


def test_lora_step_one_equals_trl_with_the_adapters_disabled_reference(lora_pair):
    tr, model, loss_fn, row, _ = lora_pair
    assert tr.ref_model is None
    dpo_trl.configure(tr, "sigmoid")
    (inputs, labels, extra), (segment, pairs) = _batch(row, model)
    reference = dpo_logps.reference_sums(model, loss_fn, inputs, labels, extra, segment, pairs)
    _assert_same(_ours(model, loss_fn, row, reference, "sigmoid"), dpo_trl.step(tr), "lora sigmoid")


def _logits(model, row) -> torch.Tensor:
    model._skip_lm_head = False
    try:
        with torch.no_grad(), dpo_logps.eval_mode(model):
            (inputs, _, extra), _ = _batch(row, model)
            return model(inputs, **extra)
    finally:
        model._skip_lm_head = True


def test_adapters_off_is_the_base_model_bitwise_and_lora_dpo_adds_no_parameters(lora_pair, tmp_path):
    _, model, loss_fn, row, state = lora_pair
    base, _, _ = _titan(state, row["input"].shape[1], tmp_path)
    scales = [m._lora_scaling for m in dpo_logps.lora_modules(model)]
    with dpo_logps.adapters_off(model):
        off = _logits(model, row)
    assert torch.equal(off, _logits(base, row))
    assert not torch.allclose(_logits(model, row), off, atol=1e-3), "the adapters change the logits"
    assert [m._lora_scaling for m in dpo_logps.lora_modules(model)] == scales == [2.0] * len(scales)

    before = [id(p) for p in model.parameters()]
    (inputs, labels, extra), (segment, pairs) = _batch(row, model)
    reference = dpo_logps.reference_sums(model, loss_fn, inputs, labels, extra, segment, pairs)
    _ours(model, loss_fn, row, reference, "sigmoid")
    assert [id(p) for p in model.parameters()] == before, "no reference copy, no new parameter"
    trainable, total = lora.trainable(model)
    assert total == sum(p.numel() for p in base.parameters()) + trainable
    assert model.training, "the reference forward restores training mode"


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe")
    source = assets.ensure_hf_moe_model()
    policy, ref = dpo_trl.load(source, perturb=True), dpo_trl.load(source)
    tr = dpo_trl.trainer(policy, ref, source, tmp / "trl", router_aux_loss_coef=0.0)
    row = dpo_trl.packed_row(tr, pad_id=0)
    seq_len, flavor = row["input"].shape[1], "model.flavor=tiny_moe"
    # the Hub's per-expert layout, which the adapter reads (Transformers fuses the experts in memory)
    policy.save_pretrained(tmp / "policy")
    state, ref_state = (load_file(f"{d}/model.safetensors") for d in (tmp / "policy", source))
    model, loss_fn, _ = _titan(state, seq_len, tmp, flavor)
    ref_model, ref_loss_fn, _ = _titan(ref_state, seq_len, tmp, flavor)
    return tr, model, loss_fn, row, _reference(ref_model, ref_loss_fn, row)


@pytest.mark.heavy  # ~20 s: the MoE model's build and float32 experts on CPU
def test_moe_step_one_equals_trl_without_its_router_loss(moe):
    tr, model, loss_fn, row, reference = moe
    dpo_trl.configure(tr, "sigmoid")
    _assert_same(_ours(model, loss_fn, row, reference, "sigmoid"), dpo_trl.step(tr), "moe sigmoid")


class _Table:
    """A precomputed reference (rank/dpo_reference.py's ReferenceTable.lookup contract), filled
    from one row's reference side sums: pair k's at 2k, 2k + 1."""

    def __init__(self, sums: torch.Tensor):
        self.sums = sums[0].reshape(-1, 2)

    def lookup(self, pairs: torch.Tensor) -> torch.Tensor:
        found = self.sums[pairs.clamp(min=0)]  # [B, P, 2]
        return torch.where((pairs >= 0)[..., None], found, torch.zeros_like(found)).flatten(1)


class _Loop:
    """torchtitan's Trainer as the mixin sees it (``torchtitan/trainer.py``): ``train_step`` reads
    the step's micro-batches, and runs ``post_dataloading_process`` (the model's keyword inputs)
    and ``_forward_backward_body`` for each; its loss is the sum of what the body returns."""

    gradient_accumulation_steps, num_pipeline_parallel_microbatches, ntokens_seen = 2, 1, 0
    device = torch.device("cpu")
    parallel_dims = SimpleNamespace(cp_enabled=False, tp_enabled=False, pp_enabled=False, dp_enabled=False)

    def __init__(self, config, model, loss_fn):
        self.config, self.model_parts, self.loss_fn = config, [model], loss_fn
        self.metrics_processor = SimpleNamespace(extra_sources=[])
        self.train_context = contextlib.nullcontext

    def should_continue_training(self) -> bool:
        return True

    def train_step(self, data_iterator):
        total = 0.0
        for _ in range(self.gradient_accumulation_steps):
            input_dict, labels = next(data_iterator)
            inputs, labels, extra = self.post_dataloading_process(input_dict, labels)
            total += self._forward_backward_body(inputs, labels, None, extra).item()
        return total

    def post_dataloading_process(self, input_dict, labels):
        extra = {k: v for k, v in input_dict.items() if k != "input"}  # all of them go to the model
        extra["attention_masks"] = self.model_parts[0].get_attention_masks(extra["positions"])
        return input_dict["input"], labels, extra

    def _forward_backward_body(self, inputs, labels, global_valid_tokens, extra_kwargs):
        raise AssertionError("objective=dpo runs its own body")


class _Trainer(dpo.DPOObjective, _Loop):
    pass


def test_the_trainer_step_over_two_micro_batches_is_the_one_row_step(dense, monkeypatch):
    """The mixin's step with a precomputed reference: the pairs split over two micro-batches
    (2 + 1) give the loss (the mean over the step's pairs), metrics and gradient of one row with
    all three, which equal TRL's (above); the table is prepared once, at the first boundary."""
    tr, model, loss_fn, row, reference, _ = dense
    loss, metrics, _ = _ours(model, loss_fn, row, reference, "sigmoid")
    expected = [p.grad.clone() for p in model.parameters()]
    length = row["input"].shape[1]
    batches = []
    for pairs in ([0, 2], [1]):
        split = dpo_trl.packed_row(tr, 0, pairs=pairs, length=length)
        batches.append(({k: v for k, v in split.items() if k != "labels"}, split["labels"]))
    prepared = []
    monkeypatch.setattr(
        dpo_reference, "prepare", lambda trainer, split: prepared.append(split) or _Table(reference)
    )
    trainer = _Trainer(SimpleNamespace(dpo=DPOSettings(enable=True)), model, loss_fn)
    assert trainer.should_continue_training() and trainer.should_continue_training()
    assert prepared == ["train"]
    model.zero_grad()
    assert trainer.train_step(iter(batches)) == pytest.approx(loss, rel=1e-6)
    # float32 sums over other groupings: 1.0e-06 apart on an AVX2-only CPU (2026-12-07), within 1e-5
    assert trainer.metrics_processor.extra_sources[0](1) == pytest.approx(metrics, rel=1e-5, abs=1e-5)
    for got, want in zip((p.grad for p in model.parameters()), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)  # float32: rows of other composition
