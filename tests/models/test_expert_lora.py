"""LoRA on the MoE experts (``models/expert_lora.py``): PEFT 0.21.2 loads our adapter on
Transformers' Qwen3-MoE and computes our logits (model=native and model=nki_moe), the merged
weights load in Transformers and do too, the export layout is PEFT's (hand oracle on the
interleaving), the export check folds it, the blockwise route recomputes its merged weights in
backward, and pre-flight's rules for the expert targets."""

from __future__ import annotations

import contextlib
import copy
import shutil
from collections import Counter
from unittest import mock

import pytest
import torch
from conftest import resolve
from safetensors.torch import load_file, save_file

from qwen3_trainium.data import assets
from qwen3_trainium.models import expert_lora_blockwise, lora
from qwen3_trainium.parent import export_check, preflight
from qwen3_trainium.rank.titan import to_trainer_config

ALL = "peft.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"
SEQ = 32
NKI = ("model.kernels=[moe_experts]",)  # the fused experts and the blockwise op; rope_hf wants 256 tokens


def _build(tmp_path, path: str, targets: str = ALL):
    """Our tiny MoE model with LoRA, the tiny HF MoE checkpoint loaded, every adapter random."""
    from torchtitan.config import apply_overrides

    overrides = [f"model={path}", "peft=lora", targets, f"training.seq_len={SEQ}", "model.attn_backend=sdpa"]
    run = resolve("device=cpu", *overrides, *(["model.flavor=tiny_moe"] if path == "native" else NKI))
    cfg = copy.deepcopy(to_trainer_config(run, str(tmp_path)))
    cfg.model_spec.model.update_from_config(config=cfg)
    apply_overrides(cfg.override, cfg)
    with torch.device("meta"):
        model = cfg.model_spec.model.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_states(buffer_device=None)
    sd_adapter = cfg.model_spec.state_dict_adapter(cfg.model_spec.model, cfg.hf_assets_path)
    weights = load_file(f"{assets.ensure_hf_moe_model()}/model.safetensors")
    _, unexpected = model.load_state_dict(sd_adapter.from_hf(weights), strict=False)
    assert unexpected == []
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.requires_grad:  # non-zero A and B, so every adapter changes the function
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    return model.eval(), sd_adapter, run


def _tokens():
    return torch.randint(0, 200, (2, SEQ), generator=torch.Generator().manual_seed(1))


def _logits(model, tokens):
    positions = torch.arange(tokens.shape[1]).repeat(tokens.shape[0], 1)
    with torch.no_grad():
        return model(tokens, positions=positions, attention_masks=model.get_attention_masks(positions))


def _write_adapter(model, sd_adapter, run, directory) -> dict:
    tensors = lora.peft_state_dict(model, sd_adapter)
    config = lora.adapter_config(
        base_model=str(assets.ensure_hf_moe_model()), rank=run.peft.rank, alpha=run.peft.alpha,
        targets=list(run.peft.target_modules), moe=True,
    )  # fmt: skip
    lora.write_adapter(str(directory), tensors, config)
    return config


@pytest.mark.parametrize("path", ["native", "nki_moe"])
def test_peft_and_the_merged_weights_in_transformers_give_our_logits(path, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model, sd_adapter, run = _build(tmp_path, path)
    tokens, source = _tokens(), assets.ensure_hf_moe_model()
    ours = _logits(model, tokens)
    config = _write_adapter(model, sd_adapter, run, tmp_path / "adapter")
    assert config["target_parameters"] == ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    assert config["target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"]
    base = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    with torch.no_grad():
        plain = base(tokens).logits
        theirs = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))(tokens).logits
    assert lora.merge_(model) == 3 * len(model.layers)  # wqkv, wo and the experts of each layer
    merged_dir = tmp_path / "merged"
    merged_dir.mkdir()
    shutil.copy(source / "config.json", merged_dir / "config.json")
    state = {k: v for k, v in model.state_dict().items() if ".lora_" not in k and "expert_bias" not in k}
    save_file(
        {k: v.contiguous() for k, v in sd_adapter.to_hf(state).items()}, str(merged_dir / "model.safetensors")
    )
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)(tokens).logits
    diffs = {
        k: (v - ours).abs().max().item() for k, v in (("peft", theirs), ("merged", merged), ("base", plain))
    }
    print(f"expert lora {path}: max abs logit diff vs ours {diffs}")
    assert diffs["peft"] <= 1e-5 and diffs["merged"] <= 1e-5
    assert diffs["base"] > 1e-2, "the adapters change the model"


def test_the_export_layout_is_peft_interleaving_by_hand(tmp_path):
    """PEFT's ParamWrapper: A rows expert-major (e*r + j), B columns rank-major (j*E + e). The
    delta our model applies to expert e (merged weights minus base) equals, by explicit loops over
    the exported tensors, s * sum_j outer(B[:, j*E + e], A[e*r + j])."""
    model, sd_adapter, run = _build(tmp_path, "native")
    experts = model.layers["1"].moe.routed_experts.inner_experts
    before = {n: getattr(experts, n).detach().clone() for n in ("w1_EFD", "w3_EFD", "w2_EDF")}
    tensors = lora.peft_state_dict(model, sd_adapter)
    stem = "base_model.model.model.layers.1.mlp.experts"
    a, b = tensors[f"{stem}.base_layer.lora_A.weight"], tensors[f"{stem}.base_layer.lora_B.weight"]
    lora.merge_(model)
    num_experts, rank, width = experts.num_experts, run.peft.rank, experts.w1_EFD.shape[1]
    s = run.peft.alpha / run.peft.rank
    for e in range(num_experts):
        delta = sum(s * torch.outer(b[:, j * num_experts + e], a[e * rank + j]) for j in range(rank))
        torch.testing.assert_close(experts.w1_EFD[e] - before["w1_EFD"][e], delta[:width], atol=1e-6, rtol=0)
        torch.testing.assert_close(experts.w3_EFD[e] - before["w3_EFD"][e], delta[width:], atol=1e-6, rtol=0)
    a, b = tensors[f"{stem}.lora_A.weight"], tensors[f"{stem}.lora_B.weight"]
    e = num_experts - 1
    delta = sum(s * torch.outer(b[:, j * num_experts + e], a[e * rank + j]) for j in range(rank))
    torch.testing.assert_close(experts.w2_EDF[e] - before["w2_EDF"][e], delta, atol=1e-6, rtol=0)
    expert_major = b.reshape(b.shape[0], num_experts, rank)[:, e] @ a[e * rank : (e + 1) * rank]
    assert (s * expert_major - delta).abs().max() > 1e-3, "the wrong reading of B must differ"


@pytest.mark.parametrize("targets", [ALL, "peft.target_modules=[gate_proj,up_proj]"])
def test_the_export_check_folds_expert_adapters(targets, tmp_path):
    """``max_adapter_logit_diff`` (the run's own export check) picks the parameter each stem
    adapts: gate_up under ``base_layer`` with down, alone under ``mlp.experts``; down on top."""
    model, sd_adapter, run = _build(tmp_path, "nki_moe", targets)
    tokens = _tokens()
    torch.save({"tokens": tokens, "logits": _logits(model, tokens)}, tmp_path / "probe.pt")
    _write_adapter(model, sd_adapter, run, tmp_path / "adapter")
    diff = export_check.max_adapter_logit_diff(str(tmp_path / "adapter"), str(tmp_path / "probe.pt"))
    print(f"export check, {targets}: {diff:.2e}")
    assert diff <= 1e-5


def test_the_blockwise_route_recomputes_its_merged_weights_in_backward(tmp_path, monkeypatch):
    """model=nki_moe: the kernel op would save its merged weight inputs (a full copy of the
    layer's experts) for backward; they are merged again when backward reads them instead, and
    the adapters' gradients equal those of plain autograd on the merged weights."""
    model, _, _ = _build(tmp_path, "nki_moe", "peft.target_modules=[gate_proj,up_proj,down_proj]")
    tokens = _tokens()

    def grads():
        model.zero_grad()
        positions = torch.arange(SEQ).repeat(2, 1)
        model(
            tokens, positions=positions, attention_masks=model.get_attention_masks(positions)
        ).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    calls = {"forward": 0, "backward": 0}
    real = expert_lora_blockwise.fused_deltas

    def counted(*args):
        calls["backward" if torch._C._current_graph_task_id() != -1 else "forward"] += 1
        return real(*args)

    monkeypatch.setattr(expert_lora_blockwise, "fused_deltas", counted)
    recomputed = grads()
    assert calls == {"forward": 4, "backward": 8}, calls  # 4 layers; gate_up and down each re-merged
    monkeypatch.setattr(
        expert_lora_blockwise,
        "_RecomputeMerged",
        lambda *a: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t),
    )
    saved = grads()
    assert recomputed.keys() == saved.keys() and len(saved) == 16
    for name in saved:
        torch.testing.assert_close(recomputed[name], saved[name], atol=0, rtol=0)


def _keys(*overrides):
    return [
        (p.key, p.message)
        for p in preflight.check(resolve("device=cpu", "peft=lora", *overrides), "/tmp", launching=False)
    ]


@pytest.mark.parametrize(
    "overrides, refused",
    [
        (("model=nki_moe", "peft.target_modules=[q_proj,k_proj,v_proj,gate_proj]"), "peft.target_modules"),
        (("model=nki_moe", "peft.target_modules=[up_proj,down_proj]"), "peft.target_modules"),
        (
            ("model=nki_moe", ALL, "parallel.tensor_parallel_degree=2", "launcher.nproc_per_node=2"),
            "parallel.tensor_parallel_degree",
        ),
        (("model=nki_moe", ALL, "compile.enable=true"), "compile.enable"),
        (("model=nki_moe", ALL), None),
        (
            ("model=native", "model.flavor=tiny_moe", "peft.target_modules=[gate_proj,up_proj,down_proj]"),
            None,
        ),
        (("model=native", "model.flavor=tiny", "peft.target_modules=[gate_proj]"), None),  # dense: a Linear
        # torch._grouped_mm's 16-byte strides: the grouped route's low-rank path at rank 4 in bfloat16
        (("model=native", "model.flavor=tiny_moe", ALL, "peft.rank=4"), "peft.rank"),
        (("model=nki_moe", ALL, "peft.rank=4"), None),  # merged weights: any rank
        (("model=nki_moe", ALL, "activation_checkpoint.mode=selective"), "activation_checkpoint.mode"),
        (("model=nki_moe", ALL, "activation_checkpoint.mode=full"), None),
        # FSDP over 16 ranks, tiny_moe's 8 experts: torchtitan shards the adapters on dim 1 (the rank)
        (("model=nki_moe", ALL, "launcher.nproc_per_node=16"), "peft.rank"),
        (("model=nki_moe", ALL, "launcher.nproc_per_node=16", "peft.rank=16"), None),
    ],
)
def test_preflight_rules_for_the_expert_targets(overrides, refused):
    keys = _keys(*overrides)
    peft_keys = [k for k, _ in keys if k.startswith(("peft.", "parallel.tensor", "compile.", "activation_"))]
    assert peft_keys == ([refused] if refused else []), keys


def test_float32_experts_runs_torchtitans_lora_experts_in_float32():
    """The export probe's ``float32_experts`` reaches expert LoRA built on torchtitan's own
    ``GroupedExperts`` (bfloat16 otherwise): the forward within equals a float32 oracle."""
    from torchtitan.models.common.moe import GroupedExperts

    from qwen3_trainium.models.expert_lora import lora_experts_cls
    from qwen3_trainium.models.overrides.experts import float32_experts

    cls = lora_experts_cls(GroupedExperts)
    experts = cls(cls.Config(dim=16, hidden_dim=8, num_experts=2, rank=8, alpha=16.0))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
    x, counts = torch.randn(6, 16, generator=generator), torch.tensor([4, 2])
    expected = []
    for e, rows in enumerate(x.split(counts.tolist())):  # per expert, float32, by hand
        s = 16.0 / 8
        gate = rows @ (experts.w1_EFD[e] + s * experts.lora_b_gate_up[e, :8] @ experts.lora_a_gate_up[e]).T
        up = rows @ (experts.w3_EFD[e] + s * experts.lora_b_gate_up[e, 8:] @ experts.lora_a_gate_up[e]).T
        down = experts.w2_EDF[e] + s * experts.lora_b_down[e] @ experts.lora_a_down[e]
        expected.append((torch.nn.functional.silu(gate) * up) @ down.T)
    expected = torch.cat(expected)
    with torch.no_grad(), float32_experts(experts):
        within = experts(x, counts)
    outside = experts(x, counts).detach()
    assert (within - expected).abs().max() < 1e-4 * expected.abs().max()
    assert (outside - expected).abs().max() > 1e-3 * expected.abs().max()  # bfloat16 outside
    assert "in_param_dtype" not in experts.__dict__


def test_the_blockwise_recompute_leaves_activation_checkpointing_in_charge(tmp_path):
    """Under activation checkpointing (hooks outside the layer), every tensor the layer saves
    but the merged weights goes to the checkpoint's hooks, not kept by ours; and gradients with
    the layer checkpointed equal those without (full AC on every block)."""
    from torch.utils.checkpoint import checkpoint

    model, _, _ = _build(tmp_path, "nki_moe", "peft.target_modules=[gate_proj,up_proj,down_proj]")
    tokens, positions = _tokens(), torch.arange(SEQ).repeat(2, 1)

    def saved_outside() -> list[tuple]:
        shapes = []
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t: (shapes.append(tuple(t.shape)), t)[1], lambda t: t
        ):
            model(tokens, positions=positions, attention_masks=model.get_attention_masks(positions))
        return shapes

    ours = saved_outside()
    with mock.patch.object(expert_lora_blockwise, "_RecomputeMerged", lambda *a: contextlib.nullcontext()):
        every = saved_outside()  # no hooks of ours: the outer hooks see all, merged weights too
    experts = model.layers["0"].moe.routed_experts.inner_experts
    merged = {tuple(experts.gate_up_ED2F.shape), tuple(experts.down_EFD.shape)}
    missing, extra = Counter(every) - Counter(ours), Counter(ours) - Counter(every)
    # all but the merged weights the op saves (4 layers x 2) reach the checkpoint's hooks
    assert set(missing) <= merged and sum(missing.values()) == 8 and not extra, (missing, extra)

    def grads(checkpointed: bool):
        model.zero_grad()
        blocks = list(model.layers.values())
        saved = [b.forward for b in blocks]
        if checkpointed:
            for b, fwd in zip(blocks, saved, strict=True):
                b.forward = lambda *a, _f=fwd, **k: checkpoint(_f, *a, use_reentrant=False, **k)
        try:
            model(
                tokens, positions=positions, attention_masks=model.get_attention_masks(positions)
            ).sum().backward()
        finally:
            for b in blocks:
                b.__dict__.pop("forward", None)
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    plain, checkpointed = grads(False), grads(True)
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], atol=1e-6, rtol=1e-5)
