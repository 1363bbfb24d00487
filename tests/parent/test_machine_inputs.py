"""The bad-machine table, beside the bad-input table (``test_bad_inputs.py``): what a config cannot
say (the host, the files it reads, the folders it writes, the trackers it asks for) is caught in
the parent before torchrun starts (``preflight/host.py``, ``preflight/files.py``).

Each case is a real ``python launch.py`` process: exit 2, no traceback, the message names the key
and the file or value, no torchrun command printed and no rank log, and the checkpoint that was in
the run directory before is byte-identical after.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from conftest import ROOT, resolve, run_launch

from qwen3_trainium.config import devices
from qwen3_trainium.data import assets
from qwen3_trainium.parent import tracking
from qwen3_trainium.parent.preflight import files, host

BASE = ("smoke=on", "tracking=off", "model=native")


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _hf_copy(dest: Path) -> Path:
    shutil.copytree(assets.HF_TINY_DIR, dest)
    return dest


def _edit_config(directory: Path, **fields) -> Path:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(fields)
    path.write_text(json.dumps(config))
    return directory


def _truncated(tmp: Path) -> tuple[Path, str]:
    d = _hf_copy(tmp / "truncated")
    weights = d / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 4096)  # an interrupted download
    return d, str(weights)


def _garbage(tmp: Path) -> tuple[Path, str]:
    d = _hf_copy(tmp / "garbage")
    weights = d / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:40] = b"\x00" * 32  # the header's JSON overwritten
    weights.write_bytes(bytes(data))
    return d, str(weights)


def _index_missing_shard(tmp: Path) -> tuple[Path, str]:
    d = _hf_copy(tmp / "sharded")
    (d / "model.safetensors").rename(d / "model-00001-of-00002.safetensors")
    weight_map = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                  "lm_head.weight": "model-00002-of-00002.safetensors"}  # fmt: skip
    (d / files.INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d, "model-00002-of-00002.safetensors"


def _llama(tmp: Path) -> tuple[Path, str]:
    d = _edit_config(_hf_copy(tmp / "llama"), model_type="llama", architectures=["LlamaForCausalLM"])
    return d, "'llama'"


def _moe_for_dense(tmp: Path) -> tuple[Path, str]:
    d = _edit_config(_hf_copy(tmp / "moe"), model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"])
    return d, "'qwen3_moe'"


def _previous_checkpoint(run_dir: Path) -> None:
    """What an earlier run left: two DCP steps (their bytes only matter for the digest)."""
    for step in (2, 4):
        folder = run_dir / "checkpoint" / f"step-{step}"
        folder.mkdir(parents=True)
        (folder / ".metadata").write_bytes(os.urandom(256))
        (folder / "__0_0.distcp").write_bytes(os.urandom(4096))
    (run_dir / "resolved.yaml").write_text("# an earlier run's resolved config\n")


HF_CASES = {
    "truncated safetensors": (_truncated, "checkpoint.initial_load_path"),
    "corrupt safetensors header": (_garbage, "checkpoint.initial_load_path"),
    "shard index names a missing shard": (_index_missing_shard, "checkpoint.initial_load_path"),
    "config.json of another architecture": (_llama, "checkpoint.initial_load_path"),
    "Qwen3-MoE weights for a dense flavor": (_moe_for_dense, "checkpoint.initial_load_path"),
}


def _cases(tmp: Path) -> list[tuple[str, list[str], dict, str, str]]:
    """(name, overrides, environment, key, what else the message names)."""
    cases = []
    for name, (make, key) in HF_CASES.items():
        directory, named = make(tmp)
        cases.append(
            (name, ["checkpoint=hf_finetune", f"checkpoint.initial_load_path={directory}"], {}, key, named)
        )
    llama_hf, _ = _llama(tmp / "hf")
    cases += [
        ("model=hf on a Llama directory", ["model=hf", f"model.hf_model={llama_hf}"], {}, "model.hf_model", "'llama'"),
        ("a Trainium layout on a CPU host (device=auto)", ["parallel=trn2_dp64"], {}, "device", "parallel=trn2_dp64"),
        (
            "more CPU ranks than cores",
            [f"launcher.nproc_per_node={host.host_cores() + 1}"],
            {},
            "launcher.nproc_per_node",
            f"{host.host_cores()} cores",
        ),
        ("a resume step that does not exist", ["checkpoint=resume", "checkpoint.load_step=3"], {}, "checkpoint.load_step", "2, 4"),
        ("a checkpoint folder under a file", ["checkpoint=resume", f"checkpoint.folder={tmp / 'a-file' / 'ck'}"], {}, "checkpoint.folder", "not a folder"),
        ("a checkpoint folder on a read-only filesystem", ["checkpoint=resume", "checkpoint.folder=/sys/qwen3-trainium-ck"], {}, "checkpoint.folder", "cannot write"),
        ("W&B online without credentials", ["tracking=wandb", "tracking.wandb_mode=online"], {}, "tracking.wandb_mode", "no W&B credentials"),
        (
            "W&B online with a key and no route to the server",
            ["tracking=wandb", "tracking.wandb_mode=online"],
            {"WANDB_API_KEY": "x" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9"},
            "tracking.wandb_mode",
            "127.0.0.1:9",
        ),
        (
            "W&B auto with a key is online, and refused the same",
            ["tracking=wandb"],
            {"WANDB_MODE": "", "WANDB_API_KEY": "x" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9"},
            "tracking.wandb_mode",
            "WANDB_API_KEY is set",
        ),
    ]  # fmt: skip
    (tmp / "a-file").write_text("not a folder\n")
    return cases


def test_every_bad_machine_file_or_credential_is_refused_before_torchrun(tmp_path):
    failures, cases = [], _cases(tmp_path / "inputs")
    for n, (name, overrides, env, key, named) in enumerate(cases):
        run_dir = tmp_path / f"run{n}"
        _previous_checkpoint(run_dir)
        before = _tree_digest(run_dir)
        proc = run_launch(*BASE, *overrides, f"hydra.run.dir={run_dir}", env=env, timeout=120)
        text = proc.stdout + proc.stderr
        now = _tree_digest(run_dir)  # Hydra's own files (.hydra/, launch.log) and job.json are new
        after = {k: now.get(k) for k in before}
        why = []
        if proc.returncode != 2:
            why.append(f"exit {proc.returncode}")
        if "Traceback" in text:
            why.append("a traceback")
        if f"- {key} = " not in text or named not in text:
            why.append(f"the message does not name {key} and {named!r}")
        if "torchrun --nnodes" in text or (run_dir / "logs").exists():
            why.append("torchrun started")
        if after != before:
            why.append("the earlier checkpoint changed")
        if why:
            failures.append(f"{name}: {', '.join(why)}\n{text[-1500:]}")
    print(f"bad-machine cases: {len(cases)}, refused cleanly: {len(cases) - len(failures)}")
    assert not failures, "\n\n".join(failures)


class Launched(Exception):
    """torchrun would have started here."""


def _launch_in_process(run_dir: Path, monkeypatch, available: int, *overrides: str):
    """What ``python launch.py OVERRIDES`` does after Hydra (the launcher's ``_run_job``), in this
    process, with the host's available memory (``MemAvailable``, what the check reads) set to
    ``available``: ((status, code), stdout, stderr), or ``Launched`` where torchrun would start."""
    import contextlib
    import io

    from conftest import compose_cfg

    from qwen3_trainium.parent import launcher

    def start(*args, **kwargs):
        raise Launched

    monkeypatch.setattr(host, "available_memory", lambda: available)
    monkeypatch.setattr(launcher, "_start", start)
    job = launcher.Job(run_dir=str(run_dir), launch_dir=str(ROOT), run_name="test")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        result = launcher._run_job(compose_cfg(*BASE, *overrides), job)
    return result, out.getvalue(), err.getvalue()


RANK_GIB = devices.RANK_BASE_BYTES / 2**30  # 800 MiB: a CPU rank with torch imported
FOUR_RANKS = ("device=cpu", "launcher.nproc_per_node=4", "launcher.oversubscribe=true")


def test_more_cpu_ranks_than_the_hosts_memory_holds_is_refused_before_torchrun(tmp_path, monkeypatch):
    """4 ranks of 0.78 GiB with 3.1 GiB less a byte available: refused, nothing started or changed.
    With exactly 4 ranks' worth available the same launch goes on to torchrun."""
    run_dir = tmp_path / "run"
    _previous_checkpoint(run_dir)
    before = _tree_digest(run_dir)
    (status, code), out, err = _launch_in_process(
        run_dir, monkeypatch, 4 * devices.RANK_BASE_BYTES - 1, *FOUR_RANKS
    )
    assert (status, code) == ("failed", 2), out + err
    assert "Traceback" not in out + err and "torchrun" not in out
    assert "- launcher.nproc_per_node = 4: 4 processes x 0.78 GiB" in err
    assert f"over the {4 * RANK_GIB:.1f} GiB this host has available" in err and "at most 3" in err
    assert _tree_digest(run_dir) == before
    with pytest.raises(Launched):
        _launch_in_process(tmp_path / "fits", monkeypatch, 4 * devices.RANK_BASE_BYTES, *FOUR_RANKS)


def test_the_folder_probe_leaves_nothing_behind(tmp_path):
    assert files.probe_writable(str(tmp_path / "new" / "ck")) is None
    assert list(tmp_path.iterdir()) == [] and not (tmp_path / "new").exists()


# ---- the checks, one by one ------------------------------------------------------------------


def _safetensors(path: Path, tensors: dict[str, int], extra: int = 0) -> Path:
    offsets, header = 0, {}
    for name, nbytes in tensors.items():
        header[name] = {"dtype": "U8", "shape": [nbytes], "data_offsets": [offsets, offsets + nbytes]}
        offsets += nbytes
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * (offsets + extra))
    return path


def test_safetensors_headers(tmp_path):
    whole = _safetensors(tmp_path / "a.safetensors", {"a": 16, "b": 8})
    assert files.safetensors_header_problem(str(whole)) is None
    assert "holds 20 bytes" in files.safetensors_header_problem(
        str(_safetensors(tmp_path / "b.safetensors", {"a": 24}, -4))
    )
    assert "holds 28 bytes" in files.safetensors_header_problem(
        str(_safetensors(tmp_path / "c.safetensors", {"a": 24}, 4))
    )
    (tmp_path / "d.safetensors").write_bytes(b"\x01\x02")
    assert "too short" in files.safetensors_header_problem(str(tmp_path / "d.safetensors"))
    (tmp_path / "e.safetensors").write_bytes(struct.pack("<Q", 10**12) + b"{}")
    assert "of header alone" in files.safetensors_header_problem(str(tmp_path / "e.safetensors"))
    real = assets.HF_TINY_DIR / "model.safetensors"
    assert files.safetensors_header_problem(str(real)) is None  # what safetensors itself writes


def test_load_step_lists_the_steps_there_are(tmp_path):
    run = resolve("checkpoint=resume", "checkpoint.load_step=5")
    assert files.check_load_step(run, str(tmp_path))[0].fix == "checkpoint.load_step=-1 (start fresh)"
    for step in (3, 10):
        (tmp_path / "checkpoint" / f"step-{step}").mkdir(parents=True)
        (tmp_path / "checkpoint" / f"step-{step}" / ".metadata").write_bytes(b"x")
    (problem,) = files.check_load_step(run, str(tmp_path))
    assert "the saved steps are 3, 10" in problem.message and "checkpoint.load_step=10" in problem.fix
    assert files.check_load_step(resolve("checkpoint=resume", "checkpoint.load_step=10"), str(tmp_path)) == []


def test_architectures_by_path(tmp_path):
    dense = _hf_copy(tmp_path / "dense")
    assert files.check_architecture("k", str(dense), moe=False) == []
    assert files.check_architecture("k", str(dense), moe=None) == []
    assert "not model_type 'qwen3_moe'" in files.check_architecture("k", str(dense), moe=True)[0].message
    _edit_config(dense, architectures=["Qwen2ForCausalLM"])
    assert "not Qwen3ForCausalLM" in files.check_architecture("k", str(dense), moe=False)[0].message
    (dense / "config.json").write_text("{not json")
    assert "not a valid JSON config" in files.check_architecture("k", str(dense), moe=False)[0].message


def test_cpu_ranks_against_cores_and_memory(monkeypatch):
    run = resolve("device=cpu", "launcher.nproc_per_node=4")
    monkeypatch.setattr(host, "host_cores", lambda: 4)
    monkeypatch.setattr(host, "available_memory", lambda: 64 * 2**30)
    assert host.check_host(run) == []
    monkeypatch.setattr(host, "host_cores", lambda: 2)
    assert [p.key for p in host.check_host(run)] == ["launcher.nproc_per_node"]
    run.launcher.oversubscribe = True
    assert host.check_host(run) == []
    monkeypatch.setattr(host, "available_memory", lambda: 3 * devices.RANK_BASE_BYTES)
    (problem,) = host.check_host(run)
    assert "4 processes x 0.78 GiB" in problem.message and "at most 3" in problem.fix


def test_cuda_ranks_against_visible_devices():
    run = resolve("device=cuda", "launcher.nproc_per_node=2")
    assert host.check_host(run, environ={"CUDA_VISIBLE_DEVICES": "0,1"}) == []
    (problem,) = host.check_host(run, environ={"CUDA_VISIBLE_DEVICES": "0"})
    assert "1 CUDA device(s)" in problem.message
    assert host.visible_cuda_devices({"CUDA_VISIBLE_DEVICES": ""}) == 0


def test_trackers(monkeypatch, tmp_path):
    run = resolve("tracking=wandb", "tracking.wandb_mode=online")
    netrc_file = tmp_path / "netrc"
    netrc_file.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    netrc_file.chmod(0o600)
    assert host.wandb_credentials({"NETRC": str(netrc_file)})
    assert not host.wandb_credentials({"NETRC": str(tmp_path / "none")})
    monkeypatch.setattr(host, "reachable", lambda url, timeout=3.0: None)
    assert host.check_trackers(run, environ={"WANDB_API_KEY": "k"}) == []
    assert (
        tracking.wandb_mode("auto", {}) == "offline"
        and host.check_trackers(resolve("tracking=wandb"), environ={}) == []
    )
    monkeypatch.setattr(host.importlib.util, "find_spec", lambda name: None)
    keys = [p.message for p in host.check_trackers(resolve("tracking=tensorboard"), environ={})]
    assert keys == ["the tensorboard package is not installed"]


def test_reachable_names_the_host_and_port():
    assert "127.0.0.1:9" in host.reachable("http://127.0.0.1:9", timeout=2)


def test_disk_refuses_what_cannot_fit_once_and_warns_for_the_rest(monkeypatch, tmp_path):
    run = resolve(
        "checkpoint=resume", "training.steps=100", "checkpoint.interval=10", "checkpoint.keep_latest_k=3",
        "checkpoint.last_save_model_only=true",
    )  # fmt: skip
    one, kept, final = host.checkpoint_bytes(run, 1_000_000)
    assert (one, kept, final) == (12_000_000, 3, 4_000_000)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(host.shutil, "disk_usage", lambda p: usage._replace(free=20_000_000))
    notes: list[str] = []
    assert host.check_disk(run, str(tmp_path), 1_000_000, notes) == []
    assert notes and "WARNING disk" in notes[0] and "40.00 GiB" not in notes[0]
    monkeypatch.setattr(host.shutil, "disk_usage", lambda p: usage._replace(free=10_000_000))
    (problem,) = host.check_disk(run, str(tmp_path), 1_000_000, [])
    assert problem.key == "checkpoint.folder" and "the first checkpoint alone needs" in problem.message


@pytest.mark.parametrize("layout", ["trn2_dp64", "trn2_tp4_fsdp16"])
def test_a_trainium_layout_still_dry_runs_on_cpu(layout, dry_run, tmp_path):
    (status, code), out, err = dry_run(tmp_path, tmp_path / "run", "model=native", f"parallel={layout}")
    assert (status, code) == ("dry_run", 0), err[-2000:]
    assert "--nproc_per_node=64" in out


def test_a_damaged_dcp_step_is_named_not_a_traceback(tmp_path):
    """The step a resume would load has a .metadata that is not a DCP one (a copy cut short)."""
    from qwen3_trainium.parent import preflight

    step = tmp_path / "checkpoint" / "step-4"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(b"\x80\x04truncated")
    problems = preflight.check(resolve("model=native", "checkpoint=resume"), str(tmp_path), launching=False)
    (problem,) = [p for p in problems if p.key == "checkpoint.folder"]
    assert "step-4/.metadata cannot be read as a DCP checkpoint" in problem.message
