"""peft=lora: torchtitan's LoRAConverter on our model specs, the frozen base, the names PEFT uses,
and what pre-flight refuses."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import ROOT, resolve

from qwen3_trainium.config import flavors
from qwen3_trainium.memory import estimate
from qwen3_trainium.models import lora

QKVO = ["q_proj", "k_proj", "v_proj", "o_proj"]


def _model(flavor: str, targets=QKVO):
    config = lora.with_lora(flavors.model_spec(flavor, "varlen").model, rank=4, alpha=8, targets=targets)
    with torch.device("meta"):
        return config, config.build()


def test_valid_targets_by_hugging_face_name():
    assert lora.valid_targets(flavors.model_spec("tiny", "varlen").model) == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    ]  # fmt: skip
    assert lora.valid_targets(flavors.model_spec("tiny_moe", "varlen").model) == QKVO  # experts: no Linear


@pytest.mark.parametrize("flavor", ["tiny", "tiny_moe"])
def test_only_the_adapters_train(flavor):
    _, model = _model(flavor)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all(".lora_a." in n or ".lora_b." in n for n in names)
    assert {n.split(".")[-3] for n in names} == {"wqkv", "wo"}
    n, total = lora.trainable(model)
    assert n == sum(p.numel() for p in model.parameters() if p.requires_grad) and n < total / 20


def test_keep_frozen_undoes_a_parallelize_that_reregisters_parameters():
    """torchtitan's spmd sharding re-registers each parameter as nn.Parameter(tensor), which
    requires grad: the wrapper freezes the base again (tied weights under both names), also where
    activation checkpointing has wrapped the layers and so changed every parameter's path."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    _, model = _model("tiny")

    def reregister(m, **kwargs):
        for key, layer in list(m.layers.named_children()):  # as torchtitan's apply_ac
            m.layers.register_module(key, checkpoint_wrapper(layer))
        for module in m.modules():
            for name, p in list(module.named_parameters(recurse=False)):
                module.register_parameter(name, torch.nn.Parameter(p.detach()))
        return m

    leaked = reregister(_model("tiny")[1])
    assert sum(p.requires_grad for p in leaked.parameters()) > 16, "the trap this guards against"
    kept = lora.keep_frozen(reregister)(model)
    names = [n for n, _ in kept.named_parameters(remove_duplicate=False)]
    assert any("_checkpoint_wrapped_module" in n for n in names)
    assert all(p.requires_grad == (".lora_" in n) for n, p in kept.named_parameters(remove_duplicate=False))


ALL = QKVO + ["gate_proj", "up_proj", "down_proj"]


def _ours_and_peft(targets):
    """Our tiny model with adapters (random B, so they change the function), and the same weights
    in PEFT: the base through torchtitan's state-dict adapter into Transformers' Qwen3, the
    adapters as our export writes them, loaded by PEFT into its own ``LoraModel`` (float32)."""
    import peft
    import transformers
    from torchtitan.config import OverrideConfig, apply_overrides
    from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter

    from qwen3_trainium.data import assets
    from qwen3_trainium.rank.titan import SDPA_OVERRIDE

    spec = flavors.model_spec("tiny", "varlen")
    apply_overrides(OverrideConfig(imports=[SDPA_OVERRIDE]), spec)  # before LoRA, as in a rank
    torch.manual_seed(0)
    ours = lora.with_lora(spec.model, rank=4, alpha=8, targets=targets).build()
    ours.init_weights(buffer_device=None)
    for _, module in lora.lora_modules(ours):
        torch.nn.init.normal_(module.lora_b.weight, std=0.1)
    sd_adapter = Qwen3StateDictAdapter(spec.model, None)
    hf = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.from_pretrained(assets.ensure_hf_model()), dtype=torch.float32
    )
    base = {k: v for k, v in ours.state_dict().items() if ".lora_" not in k}
    assert hf.load_state_dict(sd_adapter.to_hf(base), strict=False).missing_keys == ["lm_head.weight"]  # tied
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0)
    theirs = peft.get_peft_model(hf, config)
    loaded = peft.set_peft_model_state_dict(theirs, lora.peft_state_dict(ours, sd_adapter))
    assert loaded.unexpected_keys == [] and not [k for k in loaded.missing_keys if ".lora_" in k]
    return ours.eval(), theirs.eval(), sd_adapter


def _logits(ours, tokens):
    positions = torch.arange(tokens.shape[1]).repeat(tokens.shape[0], 1)
    return ours(tokens, positions=positions, attention_masks=ours.get_attention_masks(positions))


@pytest.mark.parametrize("targets", [QKVO, ALL], ids=["qkvo", "all"])
def test_our_adapted_model_computes_what_peft_computes(targets):
    """PEFT's ``LoraModel`` (three adapters on q/k/v) against our one adapter on the fused wqkv."""
    ours, theirs, _ = _ours_and_peft(targets)
    tokens = torch.randint(0, 500, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, want = _logits(ours, tokens), theirs(tokens).logits
        with theirs.disable_adapter():
            base_only = theirs(tokens).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert (want - base_only).abs().max() > 0.1, "the adapters change the model (else this shows nothing)"


def test_our_merge_gives_the_weights_and_logits_of_peft_merge_and_unload():
    ours, theirs, sd_adapter = _ours_and_peft(QKVO + ["gate_proj"])
    tokens = torch.randint(0, 500, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert lora.merge_(ours) == 12  # 2 layers x wqkv, wo, w1
        got = _logits(ours, tokens)
    merged = theirs.merge_and_unload()
    want = merged.state_dict()
    base = {k: v for k, v in ours.state_dict().items() if ".lora_" not in k}
    for key, value in sd_adapter.to_hf(base).items():
        torch.testing.assert_close(value, want[key], rtol=0, atol=1e-6, msg=lambda m, key=key: f"{key}: {m}")
    assert all(m.lora_b.weight.abs().sum() == 0 for _, m in lora.lora_modules(ours))
    with torch.no_grad():
        torch.testing.assert_close(got, merged(tokens).logits, rtol=0, atol=1e-5)


def test_the_estimate_counts_gradients_and_adamw_for_the_adapters_only():
    run = resolve("model=native", "smoke=on", "peft=lora")
    config, model = _model("tiny")
    full = estimate.model_shape(flavors.model_spec("tiny", "varlen").model, _full("tiny"))
    adapted = estimate.model_shape(config, model)
    assert adapted.params == full.params + adapted.trainable and full.trained == full.params
    e_full = estimate.estimate(run, full, dp_shard=1, capacity=None).parts
    e_lora = estimate.estimate(run, adapted, dp_shard=1, capacity=None).parts
    assert e_lora["AdamW states (fp32)"] == 8 * adapted.trainable < e_full["AdamW states (fp32)"] / 20


def test_selective_checkpointing_keeps_more_matmul_outputs_with_adapters():
    """torchtitan's selective policy saves every other matmul output of a layer; an adapter adds two
    matmuls behind its base (lora_a rank-wide, lora_b base-wide). Qwen3-30B-A3B's layer
    (dim 2048, q 4096, kv 512, router over 128 experts) with q/k/v/o at rank 8: the matmuls are
    wqkv 5120, a 8, b 5120, wo 2048, a 8, b 2048, gate 128; saved 1st/3rd/5th/7th = 10376,
    against 5120 + 128 without adapters."""
    shape = estimate.model_shape(*_model("tiny"))
    assert shape.adapters == (("wo", 4), ("wqkv", 4))  # read from the built model
    moe = dataclasses.replace(
        shape, dim=2048, q_dim=4096, kv_dim=512, num_experts=128, adapters=(("wo", 8), ("wqkv", 8))
    )
    assert estimate._lora_saved_matmuls(moe) == 10376 - 5248
    dense = dataclasses.replace(shape, dim=2048, q_dim=4096, kv_dim=512, ffn=6144, num_experts=0,
                                adapters=(("w1", 8), ("w2", 8), ("w3", 8), ("wo", 8), ("wqkv", 8)))  # fmt: skip
    # wqkv a b | wo a b | w1 a b | w3 a b | w2 a b: saved 5120 5120 8 6144 6144 8 2048 2048,
    # against wqkv, w1 and w2 (5120 + 6144 + 2048) without adapters
    assert estimate._lora_saved_matmuls(dense) == (5120 + 5120 + 8 + 6144 + 6144 + 8 + 2048 + 2048) - 13312
    assert estimate._lora_saved_matmuls(dataclasses.replace(shape, adapters=())) == 0


def _full(flavor):
    with torch.device("meta"):
        return flavors.model_spec(flavor, "varlen").model.build()


@pytest.mark.parametrize(
    "overrides, key, words",
    [
        (["model=hf"], "peft.method", "model=native (dense Qwen3) or model=nki_moe"),
        (["peft.target_modules=[q_proj,wq]"], "peft.target_modules", "wq is no module LoRA can target"),
        (
            ["peft.target_modules=[q_proj,v_proj]"],
            "peft.target_modules",
            "q_proj, k_proj and v_proj together",
        ),
        (
            ["model=nki_moe", "peft.target_modules=[o_proj,gate_proj]"],
            "peft.target_modules",
            "list gate_proj and up_proj together",
        ),
        (["checkpoint=hf_export"], "checkpoint.last_save_in_hf", "checkpoint=[hf_finetune,hf_export]"),
        (["peft.rank=0"], "peft.rank", ">= 1"),
    ],
)
def test_what_lora_refuses_before_anything_starts(overrides, key, words, dry_run, tmp_path):
    (status, code), out, err = dry_run(ROOT, tmp_path, "smoke=on", "tracking=off", "peft=lora", *overrides)
    assert (status, code) == ("failed", 2), out[-2000:]
    assert f"- {key} = " in err and words in err, err
    assert "Traceback" not in err + out


def test_the_dry_run_prints_the_trainable_share_and_a_smaller_estimate(dry_run, tmp_path):
    (_, code), out, _ = dry_run(ROOT, tmp_path / "lora", "model=native", "smoke=on", "peft=lora")
    (_, code_full), full, _ = dry_run(ROOT, tmp_path / "full", "model=native", "smoke=on")
    assert code == code_full == 0
    assert "peft=lora: 40,960 trainable parameters of 3,320,576 (1.234%); the base is frozen" in out

    def adamw(text):
        return float(next(line for line in text.splitlines() if "AdamW states" in line).split()[-2])

    assert adamw(out) < adamw(full) / 20
