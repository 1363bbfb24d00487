"""YaRN through every model path: model=hf gets model.rope_scaling (Transformers' own YaRN, the
oracle), model=native's YarnRoPE gives the same logits, and (heavy) training at 8192 tokens from the
tiny HF checkpoint exports a directory Transformers reloads with the same logits."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import read_metrics, resolve, run_launch
from transformers import AutoConfig
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from qwen3_trainium.data import assets
from qwen3_trainium.rank.titan import to_trainer_config
from tests.support.tiny_models import QWEN_YARN, YARN4, build_tiny

TINY = str(assets.ensure_hf_model())


def test_model_hf_trains_transformers_yarn_from_model_rope_scaling(tmp_path):
    model = build_tiny(tmp_path, "model=hf", *QWEN_YARN)
    rotary = model.model.model.rotary_emb
    reference = AutoConfig.from_pretrained(
        TINY, rope_parameters={**YARN4, "rope_theta": 1e6}, max_position_embeddings=131072
    )
    oracle = Qwen3RotaryEmbedding(reference)
    assert rotary.rope_type == "yarn" and rotary.attention_scaling == pytest.approx(0.1 * math.log(4) + 1)
    assert torch.equal(rotary.inv_freq, oracle.inv_freq)


def test_native_yarn_and_hf_yarn_give_the_same_logits(tmp_path):
    native = build_tiny(tmp_path / "n", "model=native", *QWEN_YARN)
    hf_model = build_tiny(tmp_path / "h", "model=hf", *QWEN_YARN)
    plain = build_tiny(tmp_path / "p", "model=native")
    tokens = torch.randint(0, 512, (1, 256), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(256)[None]
    with torch.no_grad():
        a = native(tokens, positions=positions, attention_masks=native.get_attention_masks(positions))
        b = hf_model(tokens, positions=positions)
        c = plain(tokens, positions=positions, attention_masks=plain.get_attention_masks(positions))
    diff = (a - b).abs().max().item()
    print(f"YaRN logits, native vs model=hf (Transformers' YaRN): max abs diff {diff:.3e}")
    assert diff <= 1e-5 and (a - c).abs().max() > 1e-2  # YaRN changes the logits


def _finetune_and_export(tmp_path, *overrides):
    args = ("model=native", "checkpoint=[hf_finetune,hf_export]", f"checkpoint.initial_load_path={TINY}",
            "training.steps=2", "training.local_batch_size=1", "launcher.nproc_per_node=1", "tracking=off")  # fmt: skip
    proc = run_launch(*args, *overrides, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    report = json.loads((tmp_path / "export_check.json").read_text())
    assert report["max_abs_logit_diff"] <= 1e-5
    return report, json.loads((tmp_path / "checkpoint" / "step-2" / "config.json").read_text())


@pytest.mark.slow
@pytest.mark.heavy  # two minutes on 2 cores (8192-token steps)
def test_seq_len_8192_trains_from_the_tiny_hf_checkpoint_and_exports(tmp_path):
    report, config = _finetune_and_export(tmp_path, "training.seq_len=8192")
    print(f"seq 8192 export round trip: max abs logit diff {report['max_abs_logit_diff']:.3e}")
    assert config["max_position_embeddings"] == 40960 and config["rope_scaling"] is None


@pytest.mark.slow
@pytest.mark.heavy
def test_a_yarn_finetune_exports_what_transformers_reloads_with_the_same_logits(tmp_path):
    report, config = _finetune_and_export(tmp_path, "training.seq_len=256", *QWEN_YARN)
    print(f"YaRN export round trip: max abs logit diff {report['max_abs_logit_diff']:.3e}")
    assert config["rope_scaling"] == YARN4 and config["max_position_embeddings"] == 131072


def test_rope_hf_kernel_replaces_the_yarn_rope_and_keeps_its_attention_factor(tmp_path):
    from torchtitan.config import apply_overrides

    from qwen3_trainium.models.overrides.nki import NkiRoPE

    cfg = to_trainer_config(resolve("model=nki_moe", "model.kernels=[rope_hf]", *QWEN_YARN), str(tmp_path))
    apply_overrides(cfg.override, cfg)
    ropes = [layer.attention.rope for layer in cfg.model_spec.model.layers]
    assert all(type(r) is NkiRoPE.Config for r in ropes)
    assert {(r.scaling, r.rope_factor, r.original_seq_len) for r in ropes} == {("yarn", 4.0, 32768)}
    assert [r.attention_factor for r in ropes] == pytest.approx([0.1 * math.log(4) + 1] * len(ropes))
