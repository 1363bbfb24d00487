"""peft=lora end to end: the smoke run trains; the base stays bit-identical while the adapters
move; the PEFT adapter (loaded with ``peft``) and the merged export (``AutoModelForCausalLM``)
reproduce our model's logits; kill and resume is exact."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import launch_killed_after, read_metrics, run_launch

from qwen3_trainium.data import assets

LORA = ["smoke=on", "tracking=off", "peft=lora"]


def _dcp(directory) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = directory.parent / f"{directory.name}.pt"
    dcp_to_torch_save(str(directory), str(out))
    return torch.load(out, weights_only=False)


def test_the_base_stays_bit_identical_and_the_adapters_train(tmp_path):
    from safetensors.torch import load_file
    from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter

    from qwen3_trainium.config import flavors

    tiny = assets.ensure_hf_model()
    start = [
        "checkpoint=[hf_finetune,resume]",
        f"checkpoint.initial_load_path={tiny}",
        "checkpoint.interval=5",
        "activation_checkpoint.mode=selective",  # its wrapper renames every parameter's path
    ]
    proc = run_launch("model=native", *LORA, *start, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [r["loss"] for r in read_metrics(tmp_path)]
    assert len(losses) == 10 and losses[-1] < losses[0]
    step5, step10 = _dcp(tmp_path / "checkpoint" / "step-5"), _dcp(tmp_path / "checkpoint" / "step-10")
    base = Qwen3StateDictAdapter(flavors.model_spec("tiny", "varlen").model, None).from_hf(
        load_file(str(tiny / "model.safetensors"))
    )
    compared = 0
    for key, value in base.items():
        if key in step10:
            assert torch.equal(step10[key], value), f"{key} moved"
            compared += 1
    assert compared >= 40, compared
    adapters = [k for k in step10 if ".lora_" in k and not k.startswith("optimizer")]
    assert len(adapters) == 16
    for key in adapters:
        assert not torch.equal(step5[key], step10[key]), f"{key} did not train"
        if ".lora_b." in key:
            assert step10[key].abs().sum() > 0  # initialised to zeros
    states = {
        k.removeprefix("state.").rsplit(".", 1)[0] for k in step10["optimizer"] if k.startswith("state.")
    }
    assert states == set(adapters), states
    print(
        f"lora: {compared} base tensors bit-identical after 10 steps; {len(adapters)} adapter tensors moved;"
        f" optimizer state for {len(states)} tensors, all adapters"
    )


PEFT_CHECK = r"""
import json, sys, torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
adapter, merged, probe_path = sys.argv[1:]
probe = torch.load(probe_path)
base_dir = json.load(open(adapter + "/adapter_config.json"))["base_model_name_or_path"]
base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
with torch.no_grad():
    plain = base(probe["tokens"]).logits
    peft_model = PeftModel.from_pretrained(base, adapter)
    with_adapter = peft_model(probe["tokens"]).logits
    full = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)(probe["tokens"]).logits
print(json.dumps({"peft": (with_adapter - probe["logits"]).abs().max().item(),
                  "merged": (full - probe["logits"]).abs().max().item(),
                  "base_only": (plain - probe["logits"]).abs().max().item()}))
"""


@pytest.mark.parametrize(
    "model", ["native", pytest.param("nki_moe", marks=[pytest.mark.slow, pytest.mark.heavy])]
)
def test_the_peft_adapter_and_the_merged_export_match_our_logits(model, tmp_path):
    source = assets.ensure_hf_model() if model == "native" else assets.ensure_hf_moe_model()
    proc = run_launch(
        f"model={model}", *LORA, "peft.merge_on_export=true", "checkpoint=[hf_finetune,hf_export]",
        f"checkpoint.initial_load_path={source}", f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    adapter, merged = tmp_path / "checkpoint" / "step-10-adapter", tmp_path / "checkpoint" / "step-10"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["base_model_name_or_path"] == str(source)
    assert config["target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"] and config["r"] == 8
    out = subprocess.run(
        [sys.executable, "-c", PEFT_CHECK, str(adapter), str(merged), str(tmp_path / "export_probe.pt")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    diffs = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"lora {model}: max abs logit diff vs our model: {diffs}")
    assert diffs["peft"] <= 1e-5 and diffs["merged"] <= 1e-5
    assert diffs["base_only"] > 1e-3, "the adapters changed the model"


@pytest.mark.slow
@pytest.mark.heavy
def test_kill_and_resume_is_exact_with_lora(tmp_path):
    tiny = assets.ensure_hf_model()
    resume = ["model=native", *LORA, "checkpoint=[hf_finetune,resume]", f"checkpoint.initial_load_path={tiny}",
              "checkpoint.interval=10", "training.steps=30"]  # fmt: skip
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    proc = run_launch(*resume, f"hydra.run.dir={straight}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    launch_killed_after(killed / "checkpoint" / "step-10", *resume, f"hydra.run.dir={killed}")
    again = run_launch(*resume, f"hydra.run.dir={killed}")
    assert again.returncode == 0, again.stderr[-3000:]
    losses = {d.name: {r["step"]: r["loss"] for r in read_metrics(d)} for d in (straight, killed)}
    diffs = [abs(losses["straight"][s] - losses["killed"][s]) for s in range(11, 31)]
    print(f"lora resume: steps 11-30 max |loss diff| {max(diffs):.2e}")
    assert max(diffs) <= 1e-5
    saved = _dcp(killed / "checkpoint" / "step-30")
    assert saved["optimizer"] and all(".lora_" in k for k in saved["optimizer"]), (
        "optimizer state beyond adapters"
    )


ISSUE_TARGETS = "peft.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]"


@pytest.mark.slow
@pytest.mark.heavy
def test_expert_lora_on_nki_moe_trains_keeps_the_base_and_loads_in_peft(tmp_path):
    """Issue 40's command (model=nki_moe, LoRA on attention and the experts) on two FSDP ranks:
    at step 5 the base is bit-identical to the HF source and the optimizer holds only adapters,
    the experts' among them, which moved; at step 10 PEFT on Transformers' Qwen3-MoE and the
    merged export reproduce our logits."""
    from safetensors.torch import load_file

    from qwen3_trainium.config import flavors
    from qwen3_trainium.models.overrides.blockwise_experts import FusedExpertsStateDictAdapter

    source = assets.ensure_hf_moe_model()
    proc = run_launch(
        "model=nki_moe", *LORA, ISSUE_TARGETS, "parallel=cpu2", "peft.merge_on_export=true",
        "checkpoint=[hf_finetune,hf_export]", f"checkpoint.initial_load_path={source}", "checkpoint.interval=5",
        f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [r["loss"] for r in read_metrics(tmp_path)]
    assert len(losses) == 10 and losses[-1] < losses[0]
    step5 = _dcp(tmp_path / "checkpoint" / "step-5")
    base = FusedExpertsStateDictAdapter(flavors.model_spec("tiny_moe", "varlen").model, None).from_hf(
        load_file(str(source / "model.safetensors"))
    )
    compared = [key for key in base if key in step5]
    for key in compared:
        assert torch.equal(step5[key], base[key]), f"{key} moved"
    assert sum(".inner_experts.gate_up_ED2F" in k for k in compared) == 4, compared
    adapters = {k for k in step5 if ".lora_" in k and not k.startswith("optimizer")}
    experts = {k for k in adapters if ".inner_experts.lora_" in k}
    assert len(experts) == 16 and all(step5[k].abs().sum() > 0 for k in experts)  # B starts at zero
    states = {
        k.removeprefix("state.").rsplit(".", 1)[0] for k in step5["optimizer"] if k.startswith("state.")
    }
    assert states == adapters, states ^ adapters
    adapter, merged = tmp_path / "checkpoint" / "step-10-adapter", tmp_path / "checkpoint" / "step-10"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["target_parameters"] == ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    out = subprocess.run(
        [sys.executable, "-c", PEFT_CHECK, str(adapter), str(merged), str(tmp_path / "export_probe.pt")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    diffs = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"expert lora nki_moe, 2 FSDP ranks: {len(compared)} base tensors bit-identical at step 5,"
          f" {len(states)} optimizer states all adapters; max abs logit diff vs ours {diffs}")  # fmt: skip
    assert diffs["peft"] <= 1e-5 and diffs["merged"] <= 1e-5
    assert diffs["base_only"] > 1e-3, "the adapters changed the model"
