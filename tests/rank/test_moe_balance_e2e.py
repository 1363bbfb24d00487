"""model.moe_balance end to end: the router gradient one optimizer step applies is the same for
1 rank x 2 micro-batches and 2 ranks x 1 on the same rows (make test), for context parallel 2 and
tensor parallel 2 (heavy), and its aux-loss part is Transformers' ``load_balancing_loss_func``
gradient, times the coefficient, averaged over the micro-batches (heavy: an absolute oracle, since
the equality alone cannot see a scale error common to both layouts)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import read_metrics, resolve, run_launch
from safetensors.torch import load_file

from qwen3_trainium.data import assets

COEF = 0.5
LR, EPS = 10.0, 1000.0  # Adam's first step moves w by lr * g / (|g| + eps): g is read back exactly
BASE = (
    "model=native", "model.flavor=tiny_moe", "device=cpu", "data=chat", "data.packing=false", "smoke=on",
    "tracking=off", "checkpoint=[hf_finetune,hf_export]", "checkpoint.export_check=false", "training.steps=1",
    "training.local_batch_size=1", "training.global_batch_size=2", "training.max_norm=1e9",
    "lr_scheduler.warmup_steps=1", f"optimizer.lr={LR}", f"optimizer.eps={EPS}", "optimizer.weight_decay=0",
    f"model.moe_aux_loss_coef={COEF}", "eval=off",
)  # fmt: skip
GATES = [f"model.layers.{i}.mlp.gate.weight" for i in range(4)]


def _router_grads(tmp_path, name, *overrides) -> list[torch.Tensor]:
    """The router gradient of the one step: from the exported weights and Adam's first update."""
    source = assets.ensure_hf_moe_model()
    run_dir = tmp_path / name
    proc = run_launch(*BASE, f"checkpoint.initial_load_path={source}", *overrides, f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    before = load_file(str(source / "model.safetensors"))
    after = {}
    for shard in (run_dir / "checkpoint" / "step-1").glob("*.safetensors"):
        after.update(load_file(str(shard)))
    grads = []
    for key in GATES:
        u = (before[key] - after[key]).double()
        grads.append(u * EPS / (LR - u.abs()))
    return grads, read_metrics(run_dir)


def _oracle(tmp_path) -> list[torch.Tensor]:
    """COEF x the mean over the two rows of Transformers' aux-loss gradient, through our model."""
    from torchtitan.config import apply_overrides
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    from qwen3_trainium.data.chat.loader import MASK_KEY, ChatRows
    from qwen3_trainium.rank.titan import to_trainer_config

    source = assets.ensure_hf_moe_model()
    run = resolve(*BASE, f"checkpoint.initial_load_path={source}", "model.moe_balance=none")
    cfg = copy.deepcopy(to_trainer_config(run, str(tmp_path)))
    cfg.model_spec.model.update_from_config(config=cfg)
    apply_overrides(cfg.override, cfg)
    model = cfg.model_spec.model.build()
    model.init_weights(buffer_device=None)
    adapter = cfg.model_spec.state_dict_adapter(cfg.model_spec.model, cfg.hf_assets_path)
    model.load_state_dict(adapter.from_hf(load_file(str(source / "model.safetensors"))), strict=False)
    model.train()
    gates = [layer.moe.router.gate for layer in model.layers.values()]
    rows = iter(ChatRows(run, "train", dp_rank=0, dp_world_size=1, infinite=True))
    total = [torch.zeros_like(g.weight, dtype=torch.float64) for g in gates]
    for _ in range(2):
        batch, _labels = next(rows)
        tokens, positions = batch["input"][None], batch["positions"][None]
        mask = batch[MASK_KEY][None]
        assert 0 < mask.sum() < mask.numel()  # the rows are padded: the mask matters
        logits = []
        hooks = [g.register_forward_hook(_keeper(logits)) for g in gates]
        model(tokens, positions=positions, attention_masks=model.get_attention_masks(positions))
        for hook in hooks:
            hook.remove()
        aux = load_balancing_loss_func(tuple(logits), 8, 2, mask)
        for t, g in zip(total, torch.autograd.grad(aux, [g.weight for g in gates]), strict=True):
            t += COEF * g.double() / 2
    return total


def _keeper(logits: list):
    def keep(module, args, out) -> None:
        logits.append(out.reshape(-1, 8))

    return keep


@pytest.mark.slow
def test_router_gradient_is_the_same_for_1x2_and_2x1(tmp_path):
    """One optimizer step over the same two rows: 1 rank x 2 micro-batches and 2 ranks x 1 (with
    activation checkpointing: the router runs again in backward) apply the same router gradient,
    the aux loss on at coefficient 0.5. In make test (about 30 s); the absolute oracle below
    (heavy) is what catches a scale error common to both layouts."""
    one, metrics = _router_grads(tmp_path, "1x2")
    two, _ = _router_grads(
        tmp_path, "2x1", "launcher.nproc_per_node=2", "activation_checkpoint.mode=selective"
    )
    diff = max((a - b).abs().max().item() for a, b in zip(one, two, strict=True))
    total = max(g.abs().max().item() for g in one)  # float32 sums in another order: relative to this
    print(f"router grad 1x2 vs 2x1: {diff:.1e} (largest {total:.1e})")
    assert total > 1e-3 and diff <= 1e-5 * total
    assert "moe_aux_loss" in metrics[0] and metrics[0]["moe_aux_loss"] >= 2.0  # top_k: its minimum


@pytest.mark.slow
@pytest.mark.heavy
def test_the_aux_part_is_transformers_and_context_parallel_agrees(tmp_path):
    """The aux part of the router gradient (aux on minus aux off) is Transformers'
    ``load_balancing_loss_func`` gradient times the coefficient, averaged over the two
    micro-batches; context parallel 2 (one micro-batch's tokens split over two ranks: their counts
    pooled before the product; full AC) applies the same gradient as 1 rank x 2."""
    one, _ = _router_grads(tmp_path, "1x2")
    cp2, _ = _router_grads(tmp_path, "cp2", "parallel=cpu2_cp2", "activation_checkpoint.mode=full")
    plain, _ = _router_grads(tmp_path, "off", "model.moe_balance=none", "model.moe_aux_loss_coef=null")
    expected = _oracle(tmp_path)
    layouts = max((a - b).abs().max().item() for a, b in zip(one, cp2, strict=True))
    aux = [a - p for a, p in zip(one, plain, strict=True)]
    oracle = max((a - e).abs().max().item() for a, e in zip(aux, expected, strict=True))
    scale = max(e.abs().max().item() for e in expected)
    total = max(g.abs().max().item() for g in one)
    print(
        f"router grad 1x2 vs cp2: {layouts:.1e}; aux part vs Transformers x coef/2: {oracle:.1e} (largest {scale:.1e})"
    )
    assert scale > 1e-4 and layouts <= 1e-5 * total and oracle <= 1e-4 * scale


@pytest.mark.slow
@pytest.mark.heavy
def test_router_gradient_is_the_same_under_tensor_parallel(tmp_path):
    """Tensor parallel 2 (sequence parallel on) with 2 micro-batches of the same rows applies the
    router gradient of 1 rank x 2: torchtitan gathers the sequence before the MoE layer, so each
    TP rank's router sees its batch's every token and the pooled sums need no TP reduction."""
    one, _ = _router_grads(tmp_path, "1x2")
    tp2, metrics = _router_grads(
        tmp_path, "tp2", "launcher.nproc_per_node=2", "parallel.tensor_parallel_degree=2",
        "parallel.data_parallel_shard_degree=1",
    )  # fmt: skip
    plain, _ = _router_grads(tmp_path, "off", "model.moe_balance=none", "model.moe_aux_loss_coef=null")
    diff = max((a - b).abs().max().item() for a, b in zip(one, tp2, strict=True))
    aux = max((a - p).abs().max().item() for a, p in zip(one, plain, strict=True))
    total = max(g.abs().max().item() for g in one)
    print(f"router grad 1x2 vs tp2: {diff:.1e} (largest {total:.1e}; aux part {aux:.1e})")
    assert aux > 1e-3 * total and diff <= 1e-5 * total
    assert metrics[0]["moe_aux_loss"] >= 2.0
