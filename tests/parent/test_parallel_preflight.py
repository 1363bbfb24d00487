"""Parallel and device groups for trn2, and pre-flight: 30 bad configs, each caught in the parent."""

from __future__ import annotations

import pytest
from conftest import read_metrics, resolve, run_launch

from qwen3_trainium.data import assets
from qwen3_trainium.parent import launcher, preflight
from qwen3_trainium.parent.preflight import stack

TINY = str(assets.ensure_hf_model())
OTHER_ROPE = "tests.support.conflicting_override.other_rope"

BAD = [  # (overrides, the key the problem must name)
    (["training.steps=0"], "training.steps"),
    (["training.seq_len=0"], "training.seq_len"),
    (["training.local_batch_size=0"], "training.local_batch_size"),
    (["launcher.nproc_per_node=0"], "launcher.nproc_per_node"),
    (["model.flavor=9B"], "model.flavor"),
    (["device=cpu", "model.attn_backend=flex"], "model.attn_backend"),
    (["device=neuron", "model.attn_backend=flex", "memory=trace"], "model.attn_backend"),
    (["device=neuron", "device.lnc=3"], "device.lnc"),
    (["device=neuron", "device.instance=trn9.huge"], "device.instance"),
    (["parallel=cpu2", "parallel.data_parallel_shard_degree=4"], "parallel"),
    (
        [
            "launcher.nproc_per_node=3",
            "parallel.tensor_parallel_degree=3",
            "parallel.data_parallel_shard_degree=1",
        ],
        "parallel.tensor_parallel_degree",
    ),
    (
        ["model.flavor=debugmodel_moe", "launcher.nproc_per_node=3", "parallel.expert_parallel_degree=3"],
        "parallel.expert_parallel_degree",
    ),
    (["parallel=cpu2", "parallel.expert_parallel_degree=2"], "parallel.expert_parallel_degree"),
    (
        [
            "launcher.nproc_per_node=8",
            "parallel.pipeline_parallel_degree=8",
            "parallel.data_parallel_shard_degree=1",
        ],
        "parallel.pipeline_parallel_degree",
    ),
    (["parallel=cpu2", "training.global_batch_size=3"], "training.global_batch_size"),
    (
        [
            "launcher.nproc_per_node=4",
            "parallel.tensor_parallel_degree=2",
            "model.flavor=debugmodel",
            "training.seq_len=255",
        ],
        "training.seq_len",
    ),
    (["data=local", "data.dataset_path=/nonexistent/corpus"], "data.dataset_path"),
    (["data.hf_assets_path=/tmp"], "data.hf_assets_path"),
    (["data.dataset=wikitext"], "data.dataset"),
    (["model=hf", "model.hf_model=Qwen/Qwen3-8B"], "model.hf_model"),
    (["model=hf", "model.flavor=8B"], "model.flavor"),
    (["model=nki_moe", "training.seq_len=300"], "training.seq_len"),
    (["model=nki_moe", "model.kernels=[bogus]"], "model.kernels"),
    (["model=native", "model.kernels=[rope_hf]"], "model.kernels"),
    (["model=nki_moe", "model.moe_block_size=100"], "model.moe_block_size"),
    (["checkpoint=hf_finetune"], "checkpoint.initial_load_path"),
    (
        ["checkpoint=hf_finetune", "checkpoint.initial_load_path=/nonexistent/hf"],
        "checkpoint.initial_load_path",
    ),
    (
        ["model.flavor=debugmodel", "checkpoint=hf_finetune", f"checkpoint.initial_load_path={TINY}"],
        "model.flavor",
    ),
    (["model.flavor=32B", "parallel=trn2_dp64", "training.local_batch_size=16"], "memory"),
    (["checkpoint.last_save_in_hf=true", "checkpoint.last_save_model_only=false"], "(torchtitan)"),
    (["model=nki_moe", f"override.imports=[{OTHER_ROPE}]"], "override.imports"),
    (["training.seq_len=65536"], "training.seq_len"),
]


@pytest.mark.parametrize(("overrides", "key"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_config_is_caught_before_launch_naming_the_key(overrides, key):
    problems = preflight.check(resolve(*overrides), "/tmp", launching=False)
    assert key in [p.key for p in problems], preflight.format_problems(problems)
    for problem in problems:
        assert problem.message and problem.fix


def test_a_bad_config_never_starts_torchrun(tmp_path):
    proc = run_launch(
        "model.flavor=32B",
        "parallel=trn2_dp64",
        "training.local_batch_size=16",
        "dry_run=true",
        f"hydra.run.dir={tmp_path}",
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "over the 23.8 GiB a rank has" in proc.stderr and "total per rank" in proc.stderr
    assert not (tmp_path / "logs").exists() and not (tmp_path / "resolved.yaml").exists()


@pytest.mark.parametrize(
    ("option", "flavor"), [("trn2_dp64", "tiny"), ("trn2_tp4_fsdp16", "debugmodel"), ("trn2_ep", "tiny_moe")]
)
def test_trn2_options_compose_pass_preflight_and_launch_64_ranks(option, flavor, tmp_path):
    run = resolve(f"parallel={option}", f"model.flavor={flavor}")
    notes: list[str] = []
    assert preflight.check(run, str(tmp_path), launching=False, notes=notes) == []
    argv = launcher.torchrun_argv(run, str(tmp_path))
    assert "--nproc_per_node=64" in argv and argv[argv.index("--rdzv_endpoint") + 1] == "localhost:0"
    arithmetic = next(n for n in notes if n.startswith("parallel degrees"))
    assert "world 64 = nnodes 1 x nproc_per_node 64" in arithmetic


def test_dry_run_of_the_8b_reference_layout_prints_everything(tmp_path):
    proc = run_launch(
        "model=native",
        "model.flavor=8B",
        "parallel=trn2_tp4_fsdp16",
        "device=neuron",
        "dry_run=true",
        f"hydra.run.dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "--nproc_per_node=64" in out
    assert "dp_shard 16 x tp 4" in out
    assert "torch-neuronx" in out and "not here" in out  # the versions table
    assert (
        "device memory per rank (estimate" in out and "23.812 GiB" in out
    )  # 24 GiB less 2 x 96 MB of runtime micro-code


def test_versions_table_catches_a_torch_neuronx_mismatch(monkeypatch):
    fake = {
        "torch": "2.14.1",
        "torchtitan": "0.3.0",
        "transformers": "5.24.0",
        "hydra-core": "1.3.8",
        "torch-neuronx": "2.13.2",
        "neuronx-cc": "2.28.7631.0",
        "nki": "0.7.0",
    }
    monkeypatch.setattr(stack, "installed", fake.get)
    problems, table = stack.versions(resolve("device=neuron"), launching=True)
    assert [p.key for p in problems] == ["versions.torch-neuronx"]
    assert "2.13.2 installed" in problems[0].message and "2.14" in problems[0].fix
    assert "MISMATCH" in table
    fake["torch-neuronx"] = "2.14.3"
    assert stack.versions(resolve("device=neuron"), launching=True)[0] == []
    fake["torch"] = "2.13.0"
    assert [p.key for p in stack.versions(resolve("device=neuron"), launching=True)[0]] == ["versions.torch"]
    del fake["neuronx-cc"]
    assert "versions.neuronx-cc" in [
        p.key for p in stack.versions(resolve("device=neuron"), launching=True)[0]
    ]


@pytest.mark.heavy  # 20-30 s: moved out of make test to keep it near 20 minutes
def test_doctor_reports_and_exits_by_colour(tmp_path):
    proc = run_launch("doctor=true", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "device: configured cpu, detected cpu" in proc.stdout and "rendezvous" in proc.stdout
    red = run_launch("doctor=true", "device=neuron", f"hydra.run.dir={tmp_path}")
    assert red.returncode == 1 and "FAIL" in red.stdout and "neuronx-cc" in red.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [["model.flavor=debugmodel", "training.local_batch_size=4"]],  # batch 8: bench/memory.py (issue 17)
)
def test_memory_estimate_is_within_25_percent_of_measured_cpu_peak(overrides, tmp_path):
    proc = run_launch(*overrides, "training.steps=4", "tracking=off", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if "total per rank" in x)
    estimate = float(line.split()[3])
    rows = read_metrics(tmp_path)
    measured = max(r["memory_max_active_gib"] for r in rows)
    assert all(
        r["memory_max_all_ranks_gib"] >= 0.97 * r["memory_max_active_gib"] for r in rows
    )  # read moments apart
    print(
        f"{overrides}: estimate {estimate:.3f} GiB, measured {measured:.3f} GiB ({100 * (estimate / measured - 1):+.0f}%)"
    )
    assert abs(estimate - measured) <= 0.25 * measured
