"""torchrun argv and rank env for cpu, cpu2 and the trn2 single-node option."""

from __future__ import annotations

from conftest import resolve

from qwen3_trainium.parent import launcher
from qwen3_trainium.shared.contract import RUN_DIR_ENV


def _flag(argv: list[str], name: str) -> str:
    for i, arg in enumerate(argv):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name:
            return argv[i + 1]
    raise AssertionError(f"{name} not in {argv}")


def test_cpu_single_rank_argv_is_the_guides_launch_form(tmp_path):
    argv = launcher.torchrun_argv(resolve("device=cpu"), str(tmp_path))
    assert argv[0].endswith("torchrun")
    assert _flag(argv, "--nproc_per_node") == "1"
    assert _flag(argv, "--rdzv_backend") == "c10d"
    assert _flag(argv, "--rdzv_endpoint") == "localhost:0"
    assert argv[argv.index("-m") + 1] == "qwen3_trainium.rank.train"
    assert _flag(argv, "--module") == "qwen3_trainium.rank.titan"
    assert _flag(argv, "--config") == "trainer_config"


def test_cpu2_runs_two_ranks_with_one_thread_each_on_two_cores(tmp_path, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    run = resolve("parallel=cpu2")
    argv = launcher.torchrun_argv(run, str(tmp_path))
    env = launcher.rank_env(run, str(tmp_path), {})
    assert _flag(argv, "--nproc_per_node") == "2"
    assert env["OMP_NUM_THREADS"] == "1"
    assert env[RUN_DIR_ENV] == str(tmp_path)


def test_trn2_dp64_env_has_the_neuron_settings(tmp_path):
    run = resolve("parallel=trn2_dp64")
    argv = launcher.torchrun_argv(run, str(tmp_path))
    env = launcher.rank_env(run, str(tmp_path), {})
    assert _flag(argv, "--nproc_per_node") == "64"
    assert _flag(argv, "--rdzv_endpoint") == "localhost:0"
    assert env["NEURON_LOGICAL_NC_CONFIG"] == "2"
    assert (
        "NEURON_RT_NUM_CORES" not in env
    )  # "Number of NeuronCores required by the process": not ours to set
    assert "TORCH_NEURONX_NEFF_CACHE_DIR" in env
    assert "OMP_NUM_THREADS" not in env


def test_wandb_is_offline_without_an_api_key(tmp_path):
    run = resolve("device=cpu")
    env = launcher.rank_env(run, str(tmp_path), {})
    assert env["WANDB_MODE"] == "offline"
    assert launcher.rank_env(run, str(tmp_path), {"WANDB_API_KEY": "k"})["WANDB_MODE"] == "online"
    assert launcher.rank_env(run, str(tmp_path), {"WANDB_MODE": "disabled"})["WANDB_MODE"] == "disabled"


def test_tracking_off_sets_no_wandb_env(tmp_path):
    env = launcher.rank_env(resolve("tracking=off"), str(tmp_path), {})
    assert not any(key.startswith("WANDB") for key in env)


def test_data_preview_of_preference_data_shows_pairs(tmp_path):
    """data.preview=N with objective=dpo: the preference rows, each pair's two completions marked
    (data/preference/source.py), not chat's reader, which cannot read preference records."""
    launcher._preview(resolve("objective=dpo", "smoke=on", "data.preview=1"), str(tmp_path))
    md = (tmp_path / "data_preview.md").read_text()
    assert "chosen" in md and "rejected" in md and "<|im_end|>\n⟧" in md
