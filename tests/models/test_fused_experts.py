"""model=nki_moe's experts in the kernels' layout: HF weights in and out, the same initial model as
torchtitan's layout, and the gathered experts freed after each layer's forward."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, read_metrics, resolve, run_launch

from qwen3_trainium.data import assets
from qwen3_trainium.models import expert_layout
from qwen3_trainium.models.overrides import blockwise_experts as fused
from qwen3_trainium.parent import compose


def _model(tmp_path, *overrides):
    """(model, trainer config) of ``model=nki_moe`` as a rank builds it: overrides applied."""
    from torchtitan.config import apply_overrides

    from qwen3_trainium.rank.titan import to_trainer_config

    cfg = copy.deepcopy(to_trainer_config(resolve("model=nki_moe", "device=cpu", *overrides), str(tmp_path)))
    cfg.model_spec.model.update_from_config(config=cfg)
    apply_overrides(cfg.override, cfg)
    model = cfg.model_spec.model.build()
    model.init_weights(buffer_device=None)
    return model, cfg


def test_the_experts_are_two_parameters_in_the_kernels_layout(tmp_path):
    model, _ = _model(tmp_path)
    experts = model.layers["0"].moe.routed_experts.inner_experts
    assert {n for n, _ in experts.named_parameters()} == {expert_layout.GATE_UP, expert_layout.DOWN}
    assert tuple(experts.gate_up_ED2F.shape) == (8, 256, 2, 256)  # tiny_moe: E, D, 2, F
    assert tuple(experts.down_EFD.shape) == (8, 256, 256)


def test_hf_weights_load_into_the_fused_layout_and_give_transformers_logits(tmp_path):
    """Qwen3MoeForCausalLM's per-expert weights through the adapter: the same logits (float32)."""
    from safetensors.torch import load_file

    from qwen3_trainium.rank.checkpoint import model_logits, probe_tokens

    source = assets.ensure_hf_moe_model()
    model, cfg = _model(tmp_path, "checkpoint=hf_finetune", f"checkpoint.initial_load_path={source}")
    adapter = cfg.model_spec.state_dict_adapter(cfg.model_spec.model, cfg.hf_assets_path)
    assert isinstance(adapter, fused.FusedExpertsStateDictAdapter)
    hf_weights = load_file(str(source / "model.safetensors"))
    assert set(adapter.to_hf(model.state_dict())) == set(hf_weights)  # every HF key, none more
    missing, unexpected = model.load_state_dict(adapter.from_hf(hf_weights), strict=False)
    assert unexpected == [] and all("expert_bias" in k or "tokens_per_expert" in k for k in missing)
    tokens = probe_tokens(cfg.hf_assets_path)
    ours = model_logits(model, tokens)
    theirs = _transformers_logits(source, tokens, tmp_path)
    diff = (ours - theirs).abs().max().item()
    print(f"HF Qwen3-MoE weights loaded into the fused layout: max abs logit diff {diff:.2e}")
    assert diff <= 1e-5


def _transformers_logits(source, tokens, tmp_path):
    """Transformers' own logits, in a fresh process (as export_check.py does): what other tests
    import here registers attention implementations and patches in Transformers' globals."""
    out = tmp_path / "theirs.pt"
    code = (
        "import sys, torch; from transformers import AutoModelForCausalLM; "
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval(); "
        "torch.save(m(torch.load(sys.argv[2])).logits.detach(), sys.argv[3])"
    )
    torch.save(tokens, tmp_path / "tokens.pt")
    proc = subprocess.run([sys.executable, "-c", code, str(source), str(tmp_path / "tokens.pt"), str(out)],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return torch.load(out)


def test_to_hf_then_from_hf_gives_back_the_fused_weights_exactly(tmp_path):
    model, cfg = _model(tmp_path)
    adapter = cfg.model_spec.state_dict_adapter(cfg.model_spec.model, cfg.hf_assets_path)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    back = adapter.from_hf(adapter.to_hf(state))
    experts = [k for k in state if k.endswith((expert_layout.GATE_UP, expert_layout.DOWN))]
    assert len(experts) == 2 * 4 and all(torch.equal(back[k], state[k]) for k in experts)


def test_torchtitan_layout_round_trips_through_the_fused_one():
    gen = torch.Generator().manual_seed(0)
    titan = {f"l.{n}": torch.randn(3, 5, 7, generator=gen) for n in ("w1_EFD", "w3_EFD")}
    titan["l.w2_EDF"] = torch.randn(3, 7, 5, generator=gen)
    ours = expert_layout.to_fused(titan)
    assert torch.equal(ours[f"l.{expert_layout.GATE_UP}"][:, :, 1, :], titan["l.w3_EFD"].transpose(1, 2))
    back = expert_layout.to_titan(ours)
    assert back.keys() == titan.keys() and all(torch.equal(back[k], titan[k]) for k in titan)


def test_a_checkpoints_adamw_states_convert_as_their_weights_and_steps_are_renamed():
    """The conversion ``convert_experts`` applies to a DCP step: each weight's AdamW moments
    (``<weight>.exp_avg``) go through the same transform as the weight; the step counters (0-d)
    follow under the new name; other keys are left alone."""
    gen = torch.Generator().manual_seed(1)
    head = "model.layers.0.moe.routed_experts.inner_experts"
    titan = {f"{head}.{n}": torch.randn(3, 5, 7, generator=gen) for n in ("w1_EFD", "w3_EFD")}
    titan[f"{head}.w2_EDF"] = torch.randn(3, 7, 5, generator=gen)
    opt = {
        f"optimizer.state.{k}.{m}": torch.randn(v.shape, generator=gen)
        for k, v in titan.items()
        for m in ("exp_avg", "exp_avg_sq")
    }
    steps = {f"optimizer.state.{k}.step": torch.tensor(4.0) for k in titan}
    flat = {**titan, **opt, **steps, "model.norm.weight": torch.ones(5)}
    fused_flat = expert_layout.to_fused(flat)
    weights = expert_layout.to_fused(titan)
    for key, value in weights.items():
        moment = {k.removeprefix("optimizer.state."): v for k, v in opt.items() if k.endswith(".exp_avg")}
        expected = expert_layout.to_fused({k.removesuffix(".exp_avg"): v for k, v in moment.items()})[key]
        assert torch.equal(fused_flat[key], value)
        assert torch.equal(fused_flat[f"optimizer.state.{key}.exp_avg"], expected)
        assert torch.equal(fused_flat[f"optimizer.state.{key}.step"], torch.tensor(4.0))
    assert torch.equal(fused_flat["model.norm.weight"], torch.ones(5))
    assert expert_layout.layout_of(fused_flat) == "fused" and expert_layout.layout_of(flat) == "torchtitan"
    back = expert_layout.to_titan(fused_flat)
    assert back.keys() == flat.keys() and all(torch.equal(back[k], flat[k]) for k in flat)


@pytest.mark.heavy  # 20-30 s: moved out of make test to keep it near 20 minutes
def test_after_each_layers_forward_its_experts_are_sharded_again(tmp_path):
    """A 30B-A3B-shaped layer on a fake world of 64 (FSDP, torchtitan's parallelize): after the
    forward of layer 0, nothing saved for its backward holds gathered experts (the op saves the
    parameters, whose gathered storage FSDP frees), and its parameters are the shards again."""
    resolved = tmp_path / "resolved.yaml"

    run = resolve("model=nki_moe", "device=neuron", "parallel=trn2_dp64", "model.flavor=30B-A3B",
                  "training.seq_len=512", "training.local_batch_size=1")  # fmt: skip
    compose.save(run, str(tmp_path), resolved.name)
    script = ROOT / "tests" / "support" / "experts_after_forward.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(resolved)], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    print("layer 0 after its forward:", found)
    assert found["experts_local_rows"] == 2  # 128 experts over 64 ranks
    assert found["saved_gathered_bytes"] == 0  # no gathered copy outlives the forward
    assert found["gathered_param_bytes_during_forward"] > 0  # the op did save the parameters


@pytest.mark.slow
@pytest.mark.heavy  # over a minute on 2 cores: make test-heavy (CI runs both)
def test_tensor_parallel_splits_the_experts_width_and_trains_as_one_rank(tmp_path):
    """parallel.tensor_parallel_degree=2: each rank holds half of every expert's width (the fused
    layout shards gate_up_ED2F on dim 3 and down_EFD on dim 1); from the same HF weights its losses
    and grad norms are those of one rank."""
    source = assets.ensure_hf_moe_model()
    common = ["model=nki_moe", "smoke=on", "tracking=off", "training.steps=3", "checkpoint=hf_finetune",
              f"checkpoint.initial_load_path={source}"]  # fmt: skip
    runs = {
        "1 rank": ["launcher.nproc_per_node=1"],
        "tp 2": ["parallel=cpu2", "parallel.tensor_parallel_degree=2"],
    }
    rows = {}
    for name, layout in runs.items():
        run_dir = tmp_path / name.replace(" ", "")
        proc = run_launch(*common, *layout, f"hydra.run.dir={run_dir}")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        rows[name] = read_metrics(run_dir)
    for key in ("loss", "grad_norm"):
        one, tp = ([r[key] for r in rows[n]] for n in runs)
        print(f"{key}: 1 rank {one}, tp 2 {tp}")
        assert len(one) == 3 and all(
            abs(a - b) <= 1e-5 * max(1.0, abs(a)) for a, b in zip(one, tp, strict=True)
        )
