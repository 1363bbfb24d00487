"""model=hf: composition, the missing-model errors, RoPE after meta init, and parity with native."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import read_metrics, resolve, run_launch
from safetensors.torch import load_file

from qwen3_trainium.config.schema import AttnBackend
from qwen3_trainium.data import assets
from qwen3_trainium.models import hf
from qwen3_trainium.parent import preflight
from qwen3_trainium.rank.titan import to_trainer_config
from tests.support.tiny_models import build_tiny

TINY = str(assets.ensure_hf_model())
HF_INIT = [
    "checkpoint.enable=true",
    f"checkpoint.initial_load_path={TINY}",
    "checkpoint.initial_load_in_hf=true",
    "checkpoint.load_only=true",
]


def test_hf_yaml_translates_to_the_transformers_backend(tmp_path):
    from torchtitan.experiments.transformers_modeling_backend.configs import TransformersBackendConfig

    from qwen3_trainium.models.hf_model import DenseMaskHFTransformerModel

    run = resolve("model=hf", "device=cpu", "smoke=on")
    assert run.model.hf_model == TINY and run.data.hf_assets_path == TINY
    assert run.model.attn_backend is AttnBackend.sdpa
    cfg = to_trainer_config(run, str(tmp_path))
    assert isinstance(cfg, TransformersBackendConfig) and cfg.hf_model == TINY
    assert type(cfg.model_spec.model) is DenseMaskHFTransformerModel.Config
    assert cfg.model_spec.model._attn_implementation == "sdpa"
    assert cfg.model_spec.model.attn_mask_type == "block_causal"
    ckpt = cfg.checkpoint
    assert (ckpt.enable, ckpt.load_only, ckpt.initial_load_in_hf) == (True, True, True)
    assert ckpt.initial_load_path == TINY
    assert cfg.override.imports == []
    assert preflight.check(run, str(tmp_path), launching=False) == []


def test_hf_on_cuda_keeps_flex_and_random_init_loads_nothing(tmp_path):
    from qwen3_trainium.models.hf_model import Qwen3HFTransformerModel

    run = resolve("model=hf", "device=cuda", "model.load_weights=false")
    cfg = to_trainer_config(run, str(tmp_path))
    assert type(cfg.model_spec.model) is Qwen3HFTransformerModel.Config
    assert cfg.model_spec.model._attn_implementation == "flex_torchtitan"
    assert cfg.checkpoint.enable is False and cfg.checkpoint.initial_load_path is None


def test_hub_id_not_on_this_machine_says_how_to_download():
    run = resolve("model=hf", "model.hf_model=Qwen/Qwen3-4B-Instruct-2507")
    problems = preflight.check(run, "/tmp", launching=False)
    assert [p.key for p in problems] == ["model.hf_model"]
    assert (
        "hf download Qwen/Qwen3-4B-Instruct-2507 --local-dir ./assets/hf/Qwen3-4B-Instruct-2507"
        in problems[0].fix
    )
    assert "model.hf_model=./assets/hf/Qwen3-4B-Instruct-2507" in problems[0].fix


def test_directory_without_config_or_weights(tmp_path):
    (tmp_path / "tokenizer.json").write_text((assets.TOKENIZER_DIR / "tokenizer.json").read_text())
    problems = preflight.check(resolve("model=hf", f"model.hf_model={tmp_path}"), "/tmp", launching=False)
    assert [(p.key, p.message) for p in problems] == [("model.hf_model", "no config.json in this directory")]
    (tmp_path / "config.json").write_text(json.dumps(hf.read_config(TINY)))
    problems = preflight.check(resolve("model=hf", f"model.hf_model={tmp_path}"), "/tmp", launching=False)
    assert "no *.safetensors" in problems[0].message and "model.load_weights=false" in problems[0].fix


def test_transformers_older_than_v5_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(hf, "transformers_major", lambda: 4)
    problems = preflight.check(resolve("model=hf"), "/tmp", launching=False)
    assert problems[0].key == "model" and "needs Transformers v5" in problems[0].message


def test_flavor_is_not_a_knob_of_the_hf_path():
    problems = preflight.check(resolve("model=hf", "model.flavor=8B"), "/tmp", launching=False)
    assert [p.key for p in problems] == ["model.flavor"]


def test_embedded_hf_model_is_complete_and_deterministic(tmp_path):
    out = assets.make_hf_model(tmp_path / "again")
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in assets.HF_TINY_DIR.iterdir())
    a, b = load_file(f"{out}/model.safetensors"), load_file(f"{TINY}/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_rope_buffers_are_rebuilt_after_meta_init(tmp_path):
    model = build_tiny(tmp_path, "model=hf")
    rotary = model.model.model.rotary_emb
    expected, _ = rotary.compute_default_rope_parameters(rotary.config)
    assert torch.equal(rotary.inv_freq, expected)


def test_hf_and_native_logits_match_on_the_same_weights(tmp_path):
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset

    native, hf_model = build_tiny(tmp_path, "model=native"), build_tiny(tmp_path, "model=hf")
    tokenizer = HuggingFaceTokenizer(tokenizer_path=TINY)
    data = HuggingFaceTextDataset("c4_test", str(assets.CORPUS_DIR), tokenizer, seq_len=256)
    batch, labels = next(iter(data))
    tokens, positions = batch["input"][None], batch["positions"][None]
    assert (positions == 0).sum() > 1  # several packed documents: the masks matter
    with torch.no_grad():
        a = native(tokens, positions=positions, attention_masks=native.get_attention_masks(positions))
        b = hf_model(tokens, positions=positions)
    diff = (a - b).abs().max().item()
    print(f"max abs logit diff hf vs native: {diff:.3e}")
    assert diff <= 1e-5
    loss = [torch.nn.functional.cross_entropy(x[0], labels).item() for x in (a, b)]
    assert abs(loss[0] - loss[1]) <= 1e-5


@pytest.mark.slow
@pytest.mark.heavy  # 37 s: make test stays near 20 minutes; CI runs it with make test-heavy
def test_step_one_losses_match_between_paths_and_hf_smoke_trains(tmp_path):
    common = ["smoke=on", "tracking=off", "training.mixed_precision_param=float32"]
    hf_dir, native_dir = tmp_path / "hf", tmp_path / "native"
    proc = run_launch("model=hf", *common, f"hydra.run.dir={hf_dir}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = run_launch("model=native", *common, *HF_INIT, f"hydra.run.dir={native_dir}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {k: read_metrics(d) for k, d in [("hf", hf_dir), ("native", native_dir)]}
    assert [r["step"] for r in rows["hf"]] == list(range(1, 11))
    assert rows["hf"][-1]["loss"] < rows["hf"][0]["loss"]
    print(f"step-1 loss hf {rows['hf'][0]['loss']:.6f} native {rows['native'][0]['loss']:.6f}")
    assert abs(rows["hf"][0]["loss"] - rows["native"][0]["loss"]) <= 1e-5
