"""config.json's RoPE in and out: read in both forms as Transformers 5 reads them, exported in both
(Transformers 5's rope_parameters, 4.x's top-level rope_theta + rope_scaling), round-tripped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import resolve
from transformers import AutoConfig

from qwen3_trainium.config import flavors, rope
from qwen3_trainium.data import assets
from qwen3_trainium.models import hf_config
from qwen3_trainium.rank.titan import to_trainer_config
from tests.support.tiny_models import QWEN_YARN, YARN4

TINY = assets.ensure_hf_model()


def _tiny_config(**changes) -> dict:
    config = json.loads((TINY / "config.json").read_text())
    for key in ("rope_parameters", "rope_scaling", "rope_theta"):
        config.pop(key, None)
    return config | changes


FORMS = {  # a Transformers-4.x config.json (as the Hub's Qwen3), and a Transformers-5 one
    "4.x rope_scaling": _tiny_config(rope_theta=1e6, rope_scaling=YARN4, max_position_embeddings=131072),
    "5.x rope_parameters": _tiny_config(rope_parameters={**YARN4, "rope_theta": 1e6}, max_position_embeddings=131072),
    "4.x default": _tiny_config(rope_theta=1e6, rope_scaling=None),
    "legacy type, no original": _tiny_config(rope_theta=1e6, rope_scaling={"type": "yarn", "factor": 2.0}),
    "both forms, rope_scaling wins": _tiny_config(rope_scaling=YARN4, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    "top-level original": _tiny_config(rope_theta=5e6, rope_scaling=YARN4, original_max_position_embeddings=16384),
}  # fmt: skip


def _write(directory: Path, config: dict) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


def _auto_rope(directory: str) -> dict:
    return dict(AutoConfig.from_pretrained(directory, local_files_only=True).rope_parameters)


@pytest.mark.parametrize("form", list(FORMS))
def test_config_json_is_read_as_transformers_reads_it(form, tmp_path):
    assert rope.checkpoint_rope(FORMS[form]) == _auto_rope(_write(tmp_path, FORMS[form]))


def test_rope_table_is_each_flavors_own():
    for name in flavors.all_flavors():
        built = flavors.model_spec(name, "flex").model.layers[0].attention.rope.max_seq_len
        assert flavors.rope_table(name) == built, name


def _export(tmp_path: Path, source: str, *overrides: str) -> dict:
    """The config.json an HF fine-tune of ``source`` exports (as written by the checkpointer)."""
    run = resolve("checkpoint=[hf_finetune,hf_export]", f"checkpoint.initial_load_path={source}", *overrides)
    text = to_trainer_config(run, str(tmp_path / "run")).checkpoint.hf_config_json
    return json.loads(text)


@pytest.mark.parametrize("form", ["4.x rope_scaling", "5.x rope_parameters"])
def test_a_yarn_directory_round_trips_through_the_export_unchanged(form, tmp_path):
    source = FORMS[form]
    source_dir = _write(tmp_path / "source", source)
    exported = _export(tmp_path, source_dir, "training.seq_len=8192")
    assert {k: exported[k] for k in source} == source  # every key the source had, unchanged
    assert _auto_rope(_write(tmp_path / "export", exported)) == _auto_rope(source_dir)
    # a Transformers-4 reader (and vLLM on it): top-level rope_theta and rope_scaling
    assert exported["rope_theta"] == 1e6 and exported["rope_scaling"] == YARN4
    assert exported["rope_parameters"] == {**YARN4, "rope_theta": 1e6}
    assert exported["max_position_embeddings"] == 131072  # the model's, not training.seq_len


def test_yarn_configured_on_a_default_checkpoint_is_written_in_both_forms(tmp_path):
    exported = _export(tmp_path, str(TINY), *QWEN_YARN, "training.seq_len=8192")
    assert exported["rope_scaling"] == YARN4 and exported["rope_theta"] == 1e6
    assert exported["max_position_embeddings"] == 131072  # Qwen's recipe: original x factor
    assert _auto_rope(_write(tmp_path / "export", exported)) == {**YARN4, "rope_theta": 1e6}


def test_default_export_keeps_max_position_embeddings_and_adds_the_4x_keys(tmp_path):
    exported = _export(tmp_path, str(TINY), "training.seq_len=8192")
    source = json.loads((TINY / "config.json").read_text())
    assert {k: exported[k] for k in source} == source
    assert (exported["rope_theta"], exported["rope_scaling"], exported["max_position_embeddings"]) == (
        1e6,
        None,
        40960,
    )


def test_export_without_a_source_writes_the_models_rope_in_both_forms(tmp_path):
    run = resolve("checkpoint=hf_export", "training.seq_len=8192", *QWEN_YARN)
    made = json.loads(to_trainer_config(run, str(tmp_path)).checkpoint.hf_config_json)
    assert (made["rope_scaling"], made["rope_theta"], made["max_position_embeddings"]) == (YARN4, 1e6, 131072)
    assert _auto_rope(_write(tmp_path / "export", made)) == {**YARN4, "rope_theta": 1e6}


def test_a_yarn_checkpoint_matches_no_default_flavor_but_the_yarn_model_built_for_it(tmp_path):
    cfg = hf_config.load(_write(tmp_path, FORMS["5.x rope_parameters"] | {"max_position_embeddings": 40960}))
    assert hf_config.matching_flavor(hf_config.load(str(TINY))) == "tiny"
    assert hf_config.matching_flavor(cfg) is None
    spec = to_trainer_config(resolve(*QWEN_YARN), str(tmp_path / "run")).model_spec
    assert hf_config.differences(hf_config.flavor_fields(spec.model), hf_config.published_fields(cfg)) == []
