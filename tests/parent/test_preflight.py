"""Pre-flight: each user error names the key, the value and the fix; all are reported together."""

from __future__ import annotations

import pytest
from conftest import compose_cfg, resolve

from qwen3_trainium.parent import preflight


def _keys(*overrides: str, launching: bool = False, tmp_path=None) -> list[str]:
    run = resolve(*overrides)
    return [p.key for p in preflight.check(run, str(tmp_path or "/tmp"), launching=launching)]


def test_flex_on_cpu_is_refused_with_the_fix():
    problems = preflight.check(resolve("device=cpu", "model.attn_backend=flex"), "/tmp", launching=False)
    assert [p.key for p in problems] == ["model.attn_backend"]
    assert "no backward on CPU" in problems[0].message
    assert "model.attn_backend=sdpa" in problems[0].fix


@pytest.mark.parametrize("backend", ["flex", "varlen"])
def test_neuron_takes_flex_and_varlen_from_sdk_2_34_and_refuses_them_on_2_33(backend, monkeypatch):
    """AWS's SDK 2.34 notes: varlen_attn works on Neuron, FlexAttention runs faster there."""
    from qwen3_trainium.parent.preflight import stack

    overrides = ("device=neuron", f"model.attn_backend={backend}", "memory=estimate")
    assert _keys(*overrides) == []  # no Neuron packages here: checked again on the trn2
    versions = {"torch": "2.14.0", "torchtitan": "0.3.0", "transformers": "5.24.0", "hydra-core": "1.3.2"}
    neuron = {"neuronx-cc": "2.29.1.0", "nki": "0.8.0"}
    monkeypatch.setattr(stack, "installed", {**versions, **neuron, "torch-neuronx": "2.14.3.0.1"}.get)
    assert _keys(*overrides) == ["model.attn_backend"]
    monkeypatch.setattr(stack, "installed", {**versions, **neuron, "torch-neuronx": "2.14.3.1.1"}.get)
    assert _keys(*overrides) == []


def test_unknown_flavor_lists_the_known_ones():
    problems = preflight.check(resolve("model.flavor=9B"), "/tmp", launching=False)
    assert problems[0].key == "model.flavor" and "0.6B" in problems[0].fix and "tiny" in problems[0].fix


def test_several_problems_are_reported_together():
    keys = _keys("device=cpu", "model.attn_backend=flex", "training.steps=0", "training.seq_len=0")
    assert keys == ["model.attn_backend", "training.steps", "training.seq_len"]


def test_world_size_must_match_the_degrees():
    assert _keys("parallel=cpu2", "parallel.data_parallel_shard_degree=4") == ["parallel"]
    assert (
        _keys("parallel=cpu2", "parallel.tensor_parallel_degree=2", "parallel.data_parallel_shard_degree=1")
        == []
    )


def test_dataset_path_must_be_an_existing_directory(tmp_path):
    file = tmp_path / "train.jsonl"
    file.write_text('{"text": "hi"}\n')
    problems = preflight.check(resolve("data=local", f"data.dataset_path={file}"), "/tmp", launching=False)
    assert problems[0].key == "data.dataset_path" and "not a directory" in problems[0].message
    assert problems[0].fix == f"data.dataset_path={tmp_path}"
    assert _keys("data=local", f"data.dataset_path={tmp_path}/nope") == ["data.dataset_path"]


def test_required_dataset_path_is_reported_before_resolving():
    problems = preflight.missing_values(compose_cfg("data=local"))
    assert [p.key for p in problems] == ["data.dataset_path"]


def test_hub_dataset_offline_says_how_to_download(tmp_path):
    problems = preflight.check(resolve("data=hf_hub"), str(tmp_path), launching=True)
    assert [p.key for p in problems] == ["data.dataset"]
    assert "hf download --repo-type dataset allenai/c4" in problems[0].fix


def test_unknown_dataset_name():
    assert _keys("data.dataset=wikitext") == ["data.dataset"]


def test_missing_tokenizer(tmp_path):
    assert _keys(f"data.hf_assets_path={tmp_path}") == ["data.hf_assets_path"]


def test_launching_on_a_missing_device_is_refused_but_a_dry_run_validates():
    assert "device" in _keys("parallel=trn2_dp64", launching=True)
    assert _keys("parallel=trn2_dp64", launching=False) == []


def test_torchtitan_validation_runs_in_the_parent():
    # torchtitan's CheckpointManager.Config refuses last_save_in_hf without last_save_model_only.
    keys = _keys("checkpoint.last_save_in_hf=true", "checkpoint.last_save_model_only=false")
    assert keys == ["(torchtitan)"]


def test_problem_text_names_key_value_and_fix():
    text = preflight.format_problems(
        [preflight.Problem("training.steps", 0, "must be at least 1", "training.steps=10")]
    )
    assert "training.steps = 0" in text and "fix: training.steps=10" in text and "nothing was started" in text


def test_seq_len_beyond_the_rope_table_is_caught_before_launch():
    # the tiny flavor's table is Qwen3's 40960 positions: past it, the rope check names YaRN
    problems = preflight.check(resolve("training.seq_len=65536"), "/tmp", launching=False)
    assert [p.key for p in problems] == ["training.seq_len"]
    assert "40960" in problems[0].message and "model.rope_scaling.factor=2.0" in problems[0].fix


def test_a_key_added_with_plus_is_refused_with_the_nearest_spelling():
    problems = preflight.unknown_keys(compose_cfg("+training.stepz=3", "+optimizer.zzz=1"))
    assert [(p.key, p.value) for p in problems] == [("training.stepz", 3), ("optimizer.zzz", 1)]
    assert problems[0].fix.startswith("training.steps=3")
    assert "optimizer has: betas, eps, implementation, lr, name, weight_decay" in problems[1].fix
    assert preflight.unknown_keys(compose_cfg("override.imports=[a.b]", "tracking.tags=[x]")) == []


def test_torchtitan_messages_are_relayed_under_our_key_names():
    from qwen3_trainium.parent.preflight.titan import ours, relayed

    text = "training.local_batch_size (3) must be evenly divisible by parallelism.pipeline_parallel_microbatch_size (2)"
    assert ours(text) == text.replace("parallelism.", "parallel.")
    assert ours("--checkpoint.load_step=7 not found; metrics.enable_tensorboard") == (
        "checkpoint.load_step=7 not found; tracking.tensorboard"
    )
    problem = relayed(
        resolve("parallel.pipeline_parallel_microbatch_size=2"),
        "parallelism.pipeline_parallel_microbatch_size must be > 0",
    )
    assert (problem.key, problem.value) == ("parallel.pipeline_parallel_microbatch_size", 2)
    assert relayed(resolve(), "something else went wrong").key == "(torchtitan)"


def test_neuron_only_knobs_are_noted_as_ignored_elsewhere():
    from qwen3_trainium.parent.preflight.run import device_notes

    notes = device_notes(resolve("device=cpu", "device.lnc=1", "device.instance=trn2u.48xlarge"))
    assert notes == [
        "note: device.instance=trn2u.48xlarge is ignored on device.type=cpu (Neuron only)",
        "note: device.lnc=1 is ignored on device.type=cpu (Neuron only)",
    ]
    assert device_notes(resolve("device=cpu", "model=nki_moe", "device.lnc=1")) == []  # rope_hf reads it
    assert device_notes(resolve("device=neuron", "device.lnc=1")) == []
    assert _keys("device=cpu", "device.lnc=3", "model=nki_moe") == ["device.lnc"]  # not seq_len's rule
