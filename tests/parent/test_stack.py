"""The Trainium stack: torchtitan by capability (seams), TorchTitan Neuron accepted, the Neuron
packages and NKI runtime checked, and `make setup-neuron`'s plan."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT, resolve

from qwen3_trainium.config import seams
from qwen3_trainium.models.kernels import neuron
from qwen3_trainium.parent import setup_neuron
from qwen3_trainium.parent.preflight import stack

GUIDE_MOE = [
    "experiment=qwen3_30b_a3b_trn2_nki_moe_dp64"
]  # model=nki_moe, 30B-A3B, trn2_dp64, seq 4096, batch 1
NEURON_STACK = {  # what AWS's SDK 2.33 DLAMI venv reports, with TorchTitan Neuron installed editable
    "torch": "2.14.0",
    "torchtitan": "0.2.2+neuron.1",
    "transformers": "5.24.0",
    "hydra-core": "1.3.8",
    "torch-neuronx": "2.14.3.0.1",
    "neuronx-cc": "2.28.7631.0",
    "nki": "0.7.0",
}


@pytest.fixture
def neuron_stack(monkeypatch):
    """The installed versions faked to the Neuron SDK 2.33 stack, the NKI runtime faked importable."""
    monkeypatch.setattr(stack, "installed", NEURON_STACK.get)
    monkeypatch.setattr(neuron, "runtime_error", lambda: None)
    monkeypatch.setattr(neuron, "signature_mismatches", lambda: [])


def test_the_guides_moe_dry_run_passes_with_torchtitan_neuron_and_the_neuron_packages(
    neuron_stack, dry_run, tmp_path
):
    result, out, err = dry_run(ROOT, tmp_path, *GUIDE_MOE)
    assert result == ("dry_run", 0), err
    assert "0.2.2+neuron.1" in out and "torch-neuronx  2.14.3.0.1" in out
    assert "--nproc_per_node=64" in out and "NEURON_RT_NUM_CORES" not in out


def test_a_missing_seam_fails_the_dry_run_naming_it(neuron_stack, dry_run, monkeypatch, tmp_path):
    from torchtitan.components.checkpointer.dcp import CheckpointManager

    monkeypatch.delattr(CheckpointManager, "_create_checkpoint_id")
    result, _, err = dry_run(ROOT, tmp_path, *GUIDE_MOE)
    assert result == ("failed", 2)
    assert (
        "torchtitan seam torchtitan.components.checkpoint.CheckpointManager._create_checkpoint_id is missing"
        in err
    )
    assert "versions.torchtitan = '0.2.2+neuron.1'" in err and "aws-neuron/torchtitan-neuron" in err
    assert "Traceback" not in err


def test_a_missing_config_field_is_named_too(monkeypatch):
    import dataclasses

    from torchtitan.config import ParallelismConfig

    real = dataclasses.fields

    def without_cp(obj):
        return tuple(
            f for f in real(obj) if not (obj is ParallelismConfig and f.name == "context_parallel_degree")
        )

    monkeypatch.setattr(dataclasses, "fields", without_cp)
    seam = next(s for s in seams.SEAMS if s.target == "torchtitan.config:ParallelismConfig")
    assert seams.probe(seam) == "ParallelismConfig lacks field(s) context_parallel_degree"


def test_every_listed_seam_is_in_the_installed_torchtitan():
    assert seams.missing() == []
    private = {s.name for s in seams.SEAMS if s.is_private}
    for name in (
        "torchtitan.components.checkpoint.CheckpointManager._save_last_step",
        "torchtitan.components.metrics._get_metrics_rank",
        "torchtitan.tools.utils.device_module",
        "torchtitan.experiments.transformers_modeling_backend.state_dict_adapter.HFTransformerStateDictAdapter._tie_word_embeddings",
        "torchtitan.experiments.transformers_modeling_backend.model.HFTransformerModel._build_dense_attention_mask",
    ):
        assert name in private
    assert {s.name for s in seams.needed("native", "cuda")}.isdisjoint(
        {s.name for s in seams.SEAMS if "experiments" in s.target}
    )


@pytest.mark.parametrize(
    ("version", "device", "status"),
    [
        ("0.3.0", "cpu", "ok"),
        ("0.2.2+neuron.1", "neuron", "ok"),
        ("0.2.2+neuron.1", "cpu", "warn"),
        ("0.2.2", "cpu", "MISMATCH"),
        ("0.4.0", "neuron", "MISMATCH"),
    ],
)
def test_torchtitan_versions_accepted(monkeypatch, version, device, status):
    from conftest import resolve

    monkeypatch.setattr(stack, "installed", {**NEURON_STACK, "torchtitan": version}.get)
    problems, table = stack.versions(resolve(f"device={device}"), launching=False)
    row = next(line for line in table.splitlines() if line.strip().startswith("torchtitan"))
    assert row.split()[-1] == status
    assert bool(problems) == (status == "MISMATCH")


def test_launching_on_neuron_without_nki_names_the_package_and_the_fix(monkeypatch):
    from conftest import resolve

    monkeypatch.setattr(
        neuron, "runtime_error", lambda: "import nki failed (ModuleNotFoundError: No module named 'nki')"
    )
    run = resolve(*GUIDE_MOE)
    problems = stack.check_nki_runtime(run, launching=True, notes=[])
    assert [p.key for p in problems] == ["model.kernels"]
    assert "No module named 'nki'" in problems[0].message and "model.kernels=[]" in problems[0].fix
    notes: list[str] = []
    assert stack.check_nki_runtime(run, launching=False, notes=notes) == [] and "not here" in notes[0]
    run.model.kernels = []  # the references on purpose: nothing to check
    assert stack.check_nki_runtime(run, launching=True, notes=[]) == []


def test_a_kernel_signature_that_moved_is_named(monkeypatch):
    from conftest import resolve

    monkeypatch.setattr(neuron, "runtime_error", lambda: None)
    moved = "nkilib.core.moe.moe_cte.moe_cte:moe_cte takes no compute_dtype (checked against ...)"
    monkeypatch.setattr(neuron, "signature_mismatches", lambda: [moved])
    problems = stack.check_nki_runtime(resolve(*GUIDE_MOE), launching=True, notes=[])
    assert problems and "takes no compute_dtype" in problems[0].message


def test_trn2_ep_is_experimental_with_awss_reason():
    from conftest import resolve

    notes = stack.trainium_notes(resolve("parallel=trn2_ep", "model.flavor=30B-A3B"))
    assert any("experimental" in n and "does not run on Trn2" in n for n in notes)


# make setup-neuron ------------------------------------------------------------------------------


def test_venv_choice_follows_neuron_venv_then_the_active_venv_then_the_dlami(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").touch()
    has_neuronx = {"/venvs/neuron": True, "/venvs/plain": False}.get
    assert setup_neuron.choose_venv(
        {"NEURON_VENV": str(tmp_path), "VIRTUAL_ENV": "/venvs/neuron"}, has_neuronx
    )[0] == str(tmp_path)
    assert setup_neuron.choose_venv({"VIRTUAL_ENV": "/venvs/neuron"}, has_neuronx)[0] == "/venvs/neuron"
    dlami = setup_neuron.DLAMI_VENV
    assert (
        setup_neuron.choose_venv({"VIRTUAL_ENV": "/venvs/plain"}, has_neuronx, isdir={dlami: True}.get)[0]
        == dlami
    )
    with pytest.raises(setup_neuron.SetupError, match="no working torch_neuronx.*NEURON_VENV="):
        setup_neuron.choose_venv({"VIRTUAL_ENV": "/venvs/plain"}, has_neuronx, isdir=lambda _: False)
    with pytest.raises(setup_neuron.SetupError, match="no bin/python"):
        setup_neuron.choose_venv({"NEURON_VENV": "/nonexistent"}, has_neuronx)


def test_plan_keeps_what_the_neuron_sdk_owns_and_installs_only_whats_missing():
    installed = {
        "torch": "2.14.0",
        "torchtitan": "0.2.2+neuron.1",
        "torch-neuronx": "2.14.3.0.1",
        "neuronx-cc": "2.28.7631.0",
        "nki": "0.7.0",
        "transformers": "4.57.1",
        "omegaconf": "2.3.0",
    }
    plan = setup_neuron.make_plan(setup_neuron.read_requirements(), installed)
    names = [setup_neuron._requirement(spec).name for spec in plan.install]
    assert not set(names) & set(setup_neuron.PROTECTED)
    assert {"hydra-core", "wandb", "datasets"} <= set(names) and "omegaconf" not in names
    assert [p.split()[0] for p in plan.protected] == [
        "torch",
        "torchtitan",
        "torch-neuronx",
        "neuronx-cc",
        "nki",
    ]
    assert plan.outside == [("transformers", "4.57.1", "<6,>=5")]  # reported, not changed
    pins = setup_neuron.protecting_constraints(installed).splitlines()
    assert {"torch==2.14.0", "torchtitan==0.2.2+neuron.1", "nki==0.7.0"} <= set(pins) and len(pins) == 5


def test_setup_neuron_dry_run_into_this_venv_changes_nothing(tmp_path):
    env = {**os.environ, "NEURON_VENV": sys.prefix, "NEURON_PIP_INDEX": "https://example.invalid/neuron"}
    proc = subprocess.run(
        [sys.executable, "-m", "qwen3_trainium.setup_neuron", "--dry-run"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"venv: {sys.prefix} (NEURON_VENV)" in out
    assert "kept as installed (never reinstalled or upgraded): torch 2.14" in out
    install = next(line for line in out.splitlines() if "pip install -c" in line)
    assert "--extra-index-url https://example.invalid/neuron" in install
    assert "torch-neuronx==2.14.*" in install and " torch==" not in install and "torchtitan" not in install
    assert out.rstrip().endswith(f"pip install --no-deps -e {ROOT}")


@pytest.mark.parametrize(("lnc", "peak", "capacity_gib"), [(2, 158e12, 23.8125), (1, 79e12, 11.90625)])
def test_mfu_peak_and_hbm_budget_follow_the_lnc_in_use(lnc, peak, capacity_gib, tmp_path):
    from conftest import resolve

    from qwen3_trainium.rank import titan

    metrics = titan._metrics(resolve("parallel=trn2_dp64", f"device.lnc={lnc}"), str(tmp_path))
    assert metrics.peak_flops_per_rank == peak  # torchtitan's own table says 158e12 whatever the LNC
    assert metrics.memory_capacity_gib == capacity_gib  # 12 GiB per physical core less 96 MB micro-code
    assert titan._metrics(resolve("device=cpu"), str(tmp_path)).peak_flops_per_rank == 0.0


def test_a_missing_private_torch_seam_names_torch_not_torchtitan(monkeypatch):
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    monkeypatch.delattr(FSDPState, "_lazy_init")
    problems = stack.check_seams(resolve("model=native"))
    assert [(p.key, p.value) for p in problems] == [("versions.torch", stack.installed("torch"))]
    assert "torch seam torch.distributed.fsdp._fully_shard._fsdp_state.FSDPState._lazy_init is missing" in (
        problems[0].message
    )
    assert "torch==2.14" in problems[0].fix and "float32 forward" in problems[0].message


# Neuron SDK releases ----------------------------------------------------------------------------


def test_the_installed_torch_neuronx_names_its_sdk_release():
    from qwen3_trainium.config import neuron_sdk

    assert neuron_sdk.release_of("2.14.3.1.20261130") is neuron_sdk.SDK_2_34
    assert neuron_sdk.release_of("2.13.3.1") is neuron_sdk.SDK_2_34
    assert neuron_sdk.release_of("2.14.3.0.1") is neuron_sdk.SDK_2_33
    assert neuron_sdk.release_of("2.14.3") is None and neuron_sdk.release_of(None) is None
    assert neuron_sdk.at_least(neuron_sdk.SDK_2_34, neuron_sdk.SDK_2_34)
    assert not neuron_sdk.at_least(neuron_sdk.SDK_2_33, neuron_sdk.SDK_2_34)


HEADLINE = ["experiment=qwen3_30b_a3b_trn2"]  # grouped_mm route, TP4 x FSDP16: varlen attention


def test_the_grouped_mm_route_on_neuron_takes_torchtitans_varlen_attention():
    assert resolve(*HEADLINE).model.attn_backend.value == "varlen"
    assert resolve(*GUIDE_MOE).model.attn_backend.value == "sdpa"  # nki_moe: unchanged
    assert resolve("device=neuron", "model=native").model.attn_backend.value == "sdpa"  # dense 0.6B
    assert resolve("model=native", "model.flavor=tiny_moe").model.attn_backend.value == "sdpa"  # CPU


def _release_check(monkeypatch, torch_neuronx, *overrides):
    monkeypatch.setattr(stack, "installed", {**NEURON_STACK, "torch-neuronx": torch_neuronx}.get)
    notes: list[str] = []
    return stack.check_neuron_release(resolve(*overrides), notes), notes


def test_varlen_attention_on_sdk_2_33_is_refused_with_the_upgrade_and_passes_on_2_34(monkeypatch):
    problems, notes = _release_check(monkeypatch, "2.14.3.0.1", *HEADLINE)
    assert [p.key for p in problems] == ["model.attn_backend"]
    assert "SDK 2.34.0" in problems[0].message and "SDK 2.33 is installed" in problems[0].message
    assert "torch-neuronx==2.14.*" in problems[0].fix and "model.attn_backend=sdpa" in problems[0].fix
    assert any(n.startswith("WARNING model=native 30B-A3B on SDK 2.33") for n in notes)
    problems, notes = _release_check(monkeypatch, "2.14.3.1.0", *HEADLINE)
    assert problems == [] and notes[0].startswith("Neuron SDK 2.34.0")
    assert any("ships TorchTitan Neuron 0.2.2+neuron.2" in n for n in notes)  # neuron.1 installed


def test_sdk_2_33_keeps_running_the_nki_moe_job(monkeypatch):
    problems, notes = _release_check(monkeypatch, "2.14.3.0.1", *GUIDE_MOE)
    assert problems == [] and not any("WARNING" in n for n in notes)


def test_flex_attention_is_refused_for_a_trace_it_cannot_run():
    from qwen3_trainium.parent.preflight import run as runs

    problems = runs.check_attention(resolve(*HEADLINE, "model.attn_backend=flex", "memory=trace"))
    assert [p.key for p in problems] == ["model.attn_backend"] and "memory=estimate" in problems[0].fix
    assert runs.check_attention(resolve(*HEADLINE, "model.attn_backend=flex", "memory=estimate")) == []


def test_the_dlami_venvs_are_tried_newest_first(tmp_path):
    for version in ("0", "10", "2"):
        (tmp_path / f"aws_neuronx_venv_torch_neuronx_2_14_{version}").mkdir()
    found = setup_neuron.dlami_venvs(str(tmp_path / "aws_neuronx_venv_torch_neuronx_2_14*"))
    assert [p.rsplit("_", 1)[1] for p in found] == ["10", "2", "0"]
    assert setup_neuron.dlami_venvs(str(tmp_path / "none*")) == [setup_neuron.DLAMI_VENV]


@pytest.mark.parametrize(
    ("torch_neuronx", "good", "words"),
    [
        ("2.14.3.1.0", True, "Neuron SDK 2.34.0 (torch-neuronx 2.14.3.1.0;"),
        ("2.14.3.0.1", None, "Neuron SDK 2.33 (torch-neuronx 2.14.3.0.1); 2.34.0 is current"),
        ("2.14.2.9", False, "2.14.2.9 is no release this project knows"),
        (None, False, "not installed"),
    ],
)
def test_the_doctor_names_the_neuron_sdk_release(monkeypatch, torch_neuronx, good, words):
    from qwen3_trainium.parent import doctor

    monkeypatch.setattr(doctor, "installed", {"torch-neuronx": torch_neuronx}.get)
    assert doctor.neuron_sdk_line()[0] is good and words in doctor.neuron_sdk_line()[1]


def test_the_grouped_mm_routes_seams_are_needed_by_it_alone(neuron_stack, dry_run, monkeypatch, tmp_path):
    """A torchtitan whose experts no longer go through ``_grouped_mm`` fails the headline's dry run
    naming the seam; the nki_moe job, which does not use it, passes."""
    from torchtitan.models.common.moe import GroupedExperts

    grouped = {s.name for s in seams.needed("native", "neuron", moe=True)}
    assert (
        "torchtitan.models.common.moe.GroupedExperts._grouped_mm" in grouped
        and "torch._grouped_mm" in grouped
    )
    assert "torch._grouped_mm" not in {s.name for s in seams.needed("native", "neuron", moe=False)}  # dense
    assert "torch._grouped_mm" not in {s.name for s in seams.needed("nki_moe", "neuron", moe=True)}
    monkeypatch.delattr(GroupedExperts, "_grouped_mm")
    result, _, err = dry_run(ROOT, tmp_path / "a", *HEADLINE)
    assert result == ("failed", 2) and "GroupedExperts._grouped_mm is missing" in err
    result, _, err = dry_run(ROOT, tmp_path / "b", *GUIDE_MOE)
    assert result == ("dry_run", 0), err
