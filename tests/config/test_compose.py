"""Every shipped YAML option composes, resolves and translates to the values it says."""

from __future__ import annotations

import pytest
from conftest import compose_cfg, resolve, shipped_options
from hydra.errors import ConfigCompositionException

from qwen3_trainium.config.schema import AttnBackend, DeviceType, ModelPath
from qwen3_trainium.parent import compose, preflight
from qwen3_trainium.rank.titan import SDPA_OVERRIDE, to_trainer_config

NEEDS_VALUE = {
    ("parallel", "trn2_ep"): ["model.flavor=30B-A3B"],  # expert parallel needs an MoE flavor
    ("data", "local"): ["data.dataset_path=qwen3_trainium/data/corpus"],
    ("checkpoint", "hf_finetune"): ["checkpoint.initial_load_path=qwen3_trainium/data/hf/qwen3-tiny"],
    ("data", "preference"): ["objective=dpo"],  # preference pairs train only with objective=dpo
}


@pytest.mark.parametrize(("group", "option"), shipped_options())
def test_every_shipped_option_composes_and_passes_preflight(group, option, tmp_path):
    overrides = [f"{group}={option}", *NEEDS_VALUE.get((group, option), [])]
    assert preflight.unknown_keys(compose_cfg(*overrides)) == []  # no option adds a key the schema lacks
    run = resolve(*overrides)
    problems = preflight.check(run, str(tmp_path), launching=False)
    assert problems == [], preflight.format_problems(problems)


def test_defaults_resolve_for_cpu():
    run = resolve("device=cpu")
    assert run.model.path is ModelPath.native
    assert run.model.flavor == "tiny"
    assert run.model.attn_backend is AttnBackend.sdpa
    assert run.launcher.nproc_per_node == 1
    assert run.data.dataset_path.endswith("qwen3_trainium/data/corpus")


def test_smoke_on_sets_ten_steps_batch_one_and_keeps_the_rest():
    run = resolve("smoke=on", "parallel=cpu2", "training.seq_len=128")
    assert (run.training.steps, run.training.local_batch_size) == (10, 1)
    assert run.training.seq_len == 128
    assert run.launcher.nproc_per_node == 2


def test_trainer_config_has_the_yaml_values(tmp_path):
    run = resolve(
        "device=cpu", "smoke=on", "optimizer.lr=3e-3", "training.seq_len=128",
        "parallel.data_parallel_shard_degree=1", "lr_scheduler.warmup_steps=3",
    )  # fmt: skip
    cfg = to_trainer_config(run, str(tmp_path))
    assert cfg.training.steps == 10 and cfg.training.local_batch_size == 1
    assert cfg.training.seq_len == 128
    assert cfg.parallelism.data_parallel_shard_degree == 1
    assert cfg.lr_scheduler.warmup_steps == 3
    assert cfg.optimizer.param_groups[0].optimizer_kwargs["lr"] == 3e-3
    assert cfg.model_spec.flavor == "tiny"
    assert cfg.override.imports == [SDPA_OVERRIDE]
    assert cfg.dump_folder == str(tmp_path)
    assert cfg.metrics.jsonl_path == str(tmp_path / "metrics.jsonl")
    assert cfg.metrics.report_mfu is False
    assert cfg.dataloader.dataset_path == run.data.dataset_path
    assert cfg.activation_checkpoint is None
    assert cfg.checkpoint.enable is False


@pytest.mark.parametrize("flavor", ["0.6B", "8B", "30B-A3B", "235B-A22B"])
def test_titan_flavors_translate(flavor, tmp_path):
    run = resolve("device=cuda", f"model.flavor={flavor}", "launcher.nproc_per_node=8")
    cfg = to_trainer_config(run, str(tmp_path))
    assert cfg.model_spec.flavor == flavor
    assert run.model.attn_backend is AttnBackend.flex  # cuda default
    assert cfg.override.imports == []


def test_trn2_parallel_option_selects_neuron_with_64_ranks():
    run = resolve("parallel=trn2_dp64")
    assert run.device.type is DeviceType.neuron
    assert run.launcher.nproc_per_node == 64
    assert run.parallel.data_parallel_shard_degree == -1
    assert run.model.attn_backend is AttnBackend.sdpa


def test_lnc1_doubles_the_neuron_ranks():
    assert resolve("device=neuron", "device.lnc=1").launcher.nproc_per_node == 128


def test_relative_paths_resolve_against_the_launch_directory(tmp_path):

    cfg = compose_cfg("data=local", "data.dataset_path=./corpus")
    run = compose.resolve(cfg, launch_dir=str(tmp_path))
    assert run.data.dataset_path == str(tmp_path / "corpus")


@pytest.mark.parametrize(
    "override", ["training.stepz=3", "training.steps=ten", "model=nativ", "model.attn_backend=sdpaa"]
)
def test_typos_and_wrong_types_fail_at_compose(override):
    with pytest.raises(ConfigCompositionException):
        compose_cfg(override)
