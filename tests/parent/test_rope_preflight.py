"""Pre-flight's RoPE check (``parent/preflight/rope.py``): training.seq_len against the model's
max_position_embeddings, YaRN's values, and model.rope_scaling against a checkpoint's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import resolve

from qwen3_trainium.config import flavors, rope
from qwen3_trainium.data import assets
from qwen3_trainium.parent.preflight import check_static
from qwen3_trainium.parent.preflight.rope import check_rope
from tests.support.tiny_models import QWEN_YARN, YARN4

TINY = assets.ensure_hf_model()


def _checkpoint(tmp_path: Path, **changes) -> str:
    """The tiny HF checkpoint's config.json with ``changes`` (no weights: only config.json is read)."""
    target = tmp_path / "ckpt"
    target.mkdir()
    config = json.loads((TINY / "config.json").read_text()) | changes
    (target / "config.json").write_text(json.dumps(config))
    return str(target)


def _finetune(path: str, *overrides: str):
    return resolve("checkpoint=hf_finetune", f"checkpoint.initial_load_path={path}", *overrides)


def _one(problems, key: str):
    assert [p.key for p in problems] == [key], problems
    assert problems[0].message and problems[0].fix
    return problems[0]


def test_seq_len_8192_is_legal_on_the_tiny_flavor_and_its_checkpoint():
    assert flavors.TINY_DIMS["max_seq_len"] == 40960  # every published Qwen3's max_position_embeddings
    assert json.loads((TINY / "config.json").read_text())["max_position_embeddings"] == 40960
    assert check_rope(resolve("training.seq_len=8192")) == []
    assert check_rope(_finetune(str(TINY), "training.seq_len=8192")) == []


def test_seq_len_past_max_position_embeddings_is_refused_naming_yarn_and_its_factor():
    problem = _one(check_rope(_finetune(str(TINY), "training.seq_len=65536")), "training.seq_len")
    assert problem.value == 65536 and "40960" in problem.message and "config.json" in problem.message
    assert (
        "model.rope_scaling.rope_type=yarn" in problem.fix and "model.rope_scaling.factor=2.0" in problem.fix
    )
    assert "original_max_position_embeddings=32768" in problem.fix
    # no checkpoint: the flavor's table, and the quick tier reports it before torch is imported
    run = resolve("training.seq_len=131072")
    assert "model.rope_scaling.factor=4.0" in _one(check_rope(run), "training.seq_len").fix
    assert "training.seq_len" in [p.key for p in check_static(run, "/tmp", launching=False)]


def test_yarn_allows_up_to_original_times_factor():
    run = _finetune(str(TINY), "training.seq_len=131072", *QWEN_YARN)
    assert check_rope(run) == []
    assert rope.of_run(run, 40960).max_position_embeddings == 131072
    too_long = _finetune(str(TINY), "training.seq_len=135168", *QWEN_YARN)
    assert "model.rope_scaling.factor=5.0" in _one(check_rope(too_long), "training.seq_len").fix


@pytest.mark.parametrize(
    ("overrides", "key", "value"),
    [
        (("model.rope_scaling.rope_type=yarn", "model.rope_scaling.factor=4"),
         "model.rope_scaling.original_max_position_embeddings", None),
        (QWEN_YARN + ("model.rope_scaling.factor=1",), "model.rope_scaling.factor", 1.0),
        (QWEN_YARN + ("model.rope_scaling.factor=0.5",), "model.rope_scaling.factor", 0.5),
        (QWEN_YARN + ("model.rope_scaling.attention_factor=0",), "model.rope_scaling.attention_factor", 0.0),
        (QWEN_YARN + ("model.rope_scaling.beta_fast=-1",), "model.rope_scaling.beta_fast", -1.0),
        (("model.rope_scaling.factor=4",), "model.rope_scaling.factor", 4.0),  # no rope_type=yarn
        (("model.max_position_embeddings=0",), "model.max_position_embeddings", 0),
    ],
)  # fmt: skip
def test_bad_yarn_values_are_refused_with_key_value_and_fix(overrides, key, value):
    problem = _one(check_rope(resolve(*overrides)), key)
    assert problem.value == value
    assert "model." in problem.fix or "training.seq_len" in problem.fix


def test_a_setting_that_contradicts_the_checkpoints_yarn_is_refused_naming_both(tmp_path):
    path = _checkpoint(tmp_path, rope_scaling=YARN4, max_position_embeddings=131072)
    problem = _one(check_rope(_finetune(path, "model.rope_scaling.factor=2")), "model.rope_scaling.factor")
    assert problem.value == 2.0 and "factor=4.0" in problem.message and path in problem.message
    problem = _one(
        check_rope(_finetune(path, "model.rope_scaling.rope_type=default")), "model.rope_scaling.rope_type"
    )
    assert problem.value == "default" and "yarn" in problem.message
    # the checkpoint's own values repeated, or nothing set: its YaRN, up to its 131072
    assert check_rope(_finetune(path, *QWEN_YARN, "training.seq_len=131072")) == []
    assert rope.of_run(_finetune(path), 40960) == rope.Rope(
        "yarn", 131072, **{k: v for k, v in YARN4.items() if k != "rope_type"}
    )


def test_explicit_yarn_on_a_default_rope_checkpoint_is_allowed():
    """Qwen's documented recipe: add rope_scaling to a default checkpoint's config.json."""
    resolved = rope.of_run(_finetune(str(TINY), *QWEN_YARN), 40960)
    assert (resolved.rope_type, resolved.factor, resolved.original_max_position_embeddings) == (
        "yarn",
        4.0,
        32768,
    )
    assert resolved.scale() == pytest.approx(0.1 * 1.3862943611198906 + 1)


def test_rope_scaling_the_native_model_cannot_build_is_refused(tmp_path):
    path = _checkpoint(tmp_path, rope_scaling={"rope_type": "linear", "factor": 2.0})
    problem = _one(check_rope(_finetune(path)), f"{path}/config.json: rope_type")
    assert problem.value == "linear" and "model=hf" in problem.fix
