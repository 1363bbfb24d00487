"""Several nodes, one torchrun each: rendezvous, node rank and EFA from Slurm or by hand."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest
from conftest import resolve, start_launch

from qwen3_trainium.config import nodes
from qwen3_trainium.parent import launcher, preflight


@pytest.mark.parametrize(
    ("nodelist", "head"),
    [
        ("trn2-[003-006,9],x", "trn2-003"),
        ("node1", "node1"),
        ("a,b", "a"),
        ("ip-10-0-[7,9]-1", "ip-10-0-7-1"),
        ("", ""),
    ],
)
def test_head_node_is_the_first_host_of_the_slurm_nodelist(nodelist, head):
    assert nodes.first_host(nodelist) == head


def test_under_slurm_the_rendezvous_is_on_the_head_node(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "trn2-[01-04]")
    monkeypatch.setenv("SLURM_NODEID", "2")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    run = resolve("device=neuron", "parallel=trn2_dp64", "launcher.nnodes=4")
    argv = launcher.torchrun_argv(run, str(tmp_path))
    assert "--nnodes=4" in argv and "--nproc_per_node=64" in argv
    assert argv[argv.index("--rdzv_endpoint") + 1] == "trn2-01:29500"
    assert argv[argv.index("--rdzv_id") + 1] == "4242"
    assert run.launcher.node_rank == 2
    env = launcher.rank_env(run, str(tmp_path), {})
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert env["QWEN3_TRAINIUM_RESOLVED"] == "resolved.node2.yaml"
    assert preflight.check_nodes(run, launching=True) == []


def test_one_node_keeps_the_guides_form_and_no_efa(tmp_path):
    run = resolve("device=neuron", "parallel=trn2_dp64")
    argv = launcher.torchrun_argv(run, str(tmp_path))
    assert argv[argv.index("--rdzv_endpoint") + 1] == "localhost:0" and "--rdzv_id" not in argv
    assert "FI_PROVIDER" not in launcher.rank_env(run, str(tmp_path), {})


def test_several_nodes_without_a_reachable_rendezvous_are_refused(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    monkeypatch.delenv("SLURM_NODEID", raising=False)
    problems = preflight.check_nodes(
        resolve("launcher.nnodes=2", "launcher.nproc_per_node=1"), launching=True
    )
    assert [(p.key, p.value) for p in problems] == [("launcher.rdzv_endpoint", "auto")]
    assert "SLURM_JOB_NODELIST is unset" in problems[0].message
    dry = preflight.check_nodes(resolve("launcher.nnodes=2", "launcher.nproc_per_node=1"), launching=False)
    assert dry == []  # a dry run shows <head node>:29500
    bad = resolve("launcher.nnodes=2", "launcher.rdzv_endpoint=localhost:0", "launcher.node_rank=2")
    assert [p.key for p in preflight.check_nodes(bad, launching=True)] == ["launcher.rdzv_endpoint"]
    ranged = [p for p in preflight.check_ranges(bad) if p.key == "launcher.node_rank"]
    assert [(p.value, p.fix) for p in ranged] == [(2, "launcher.node_rank=-1")]
    assert "[0, launcher.nnodes)" in ranged[0].message


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.heavy  # 26 s: two torchruns (make test near 20 minutes)
def test_two_nodes_as_two_torchruns_on_this_machine_train_the_same_model(tmp_path):
    run_dir = tmp_path / "run"
    common = [
        "model=native", "smoke=on", "training.steps=3", "tracking=off", "launcher.nnodes=2",
        "launcher.nproc_per_node=1", f"launcher.rdzv_endpoint=127.0.0.1:{_free_port()}", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    procs = [
        start_launch(
            *common,
            f"launcher.node_rank={rank}",
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for rank in (1, 0)
    ]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    last = [next(line for line in reversed(o.splitlines()) if "step:  3" in line) for o in outputs]
    losses = {line.split("loss:")[1].split()[0] for line in last}
    assert len(losses) == 1, last  # one model: the same global loss on both nodes
    assert (run_dir / "resolved.yaml").is_file() and (run_dir / "resolved.node1.yaml").is_file()
    assert len(list(run_dir.glob("logs/*/attempt_0/0/stdout.log"))) == 2  # one torchrun per node
    assert '"status": "ok"' in (run_dir / "job.json").read_text()
