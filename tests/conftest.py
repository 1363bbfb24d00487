"""Shared fixtures: compose the real ``conf/`` tree the way ``launch.py`` does."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from qwen3_trainium.parent import compose
from qwen3_trainium.shared import contract

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"

compose.register()
compose.register_resolvers()


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """No test may reach the network: the Hub and W&B are switched off."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def _hf_init_methods() -> dict:
    """What torchtitan's HF backend patches process-wide whenever it builds a model
    (``transformers_modeling_backend/model.py``: ``PreTrainedModel._init_weights``,
    ``_initialize_weights`` and the decoder layer's ``__init__``), for Qwen3 and Qwen3-MoE."""
    from transformers.modeling_utils import PreTrainedModel
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeDecoderLayer

    return {
        (PreTrainedModel, "_init_weights"): PreTrainedModel.__dict__["_init_weights"],
        (PreTrainedModel, "_initialize_weights"): PreTrainedModel.__dict__["_initialize_weights"],
        (Qwen3DecoderLayer, "__init__"): Qwen3DecoderLayer.__dict__["__init__"],
        (Qwen3MoeDecoderLayer, "__init__"): Qwen3MoeDecoderLayer.__dict__["__init__"],
    }


_HF_INIT = _hf_init_methods()


@pytest.fixture(autouse=True)
def _transformers_as_shipped():
    """Each test starts with Transformers' own init methods. Once a test has built a model=hf
    model in this process, torchtitan's patches make every later ``from_pretrained`` skip the
    non-persistent buffers: Qwen3's rotary ``inv_freq`` stayed uninitialised memory, and an
    in-process HF oracle gave NaN or wrong logits in later tests (seen in make test's order)."""
    for (cls, name), method in _HF_INIT.items():
        if cls.__dict__.get(name) is not method:
            setattr(cls, name, method)
    yield


@pytest.fixture(autouse=True)
def _own_preflight_cache(monkeypatch, tmp_path_factory):
    """Each test starts with an empty pre-flight cache of its own (no pass remembered from
    another test, none written to the user's ~/.cache)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


def compose_cfg(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides))


def resolve(*overrides: str):
    return compose.resolve(compose_cfg(*overrides), launch_dir=str(ROOT))


@pytest.fixture
def dry_run():
    """The launcher's own job for ``python launch.py OVERRIDES dry_run=true`` run from
    ``launch_dir`` (what launch.py does after Hydra): ``((status, code), stdout, stderr)``."""
    import contextlib
    import io

    from qwen3_trainium.parent import launcher

    def run(launch_dir, run_dir, *overrides: str):
        job = launcher.Job(run_dir=str(run_dir), launch_dir=str(launch_dir), run_name="test")
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            result = launcher._run_job(compose_cfg(*overrides, "dry_run=true"), job)
        return result, out.getvalue(), err.getvalue()

    return run


def shipped_options() -> list[tuple[str, str]]:
    return sorted(
        (group.name, yaml.stem) for group in CONF.iterdir() if group.is_dir() for yaml in group.glob("*.yaml")
    )


# One pre-flight cache for the session's real launches, as a user's machine has one: a config
# launched by several tests is checked in full once. (In-process tests keep their own, empty.)
SESSION_PREFLIGHT_CACHE = Path(tempfile.mkdtemp(prefix="qwen3-trainium-preflight-"))


TEST_ENV = "QWEN3_TRAINIUM_TEST"  # marks every process a test launched, and their children
_current_test = {"token": ""}


def launch_env(env: dict | None = None) -> dict[str, str]:
    """A user's environment, offline, with the session's pre-flight cache and this test's mark."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "XDG_CACHE_HOME": str(SESSION_PREFLIGHT_CACHE),
        TEST_ENV: _current_test["token"],
        **(env or {}),
    }


def start_launch(*args: str, cwd: Path = ROOT, env: dict | None = None, **popen) -> subprocess.Popen:
    """``python launch.py ARGS`` started as a user starts it; the one launch helper (the test's
    teardown kills whatever it left running)."""
    return subprocess.Popen(
        [sys.executable, str(ROOT / "launch.py"), *args], cwd=cwd, env=launch_env(env), **popen
    )


def run_launch(*args: str, cwd: Path = ROOT, timeout: float = 600, env: dict | None = None):
    """``python launch.py ARGS`` run to the end; returns the CompletedProcess."""
    with start_launch(
        *args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def launch_killed_after(checkpoint: Path, *args: str) -> None:
    """``python launch.py ARGS`` started, then every torchrun worker SIGKILLed as soon as
    ``checkpoint`` (a DCP step folder) is complete: a crash just after a save."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    first = start_launch(*args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (checkpoint / ".metadata").exists():
        assert time.time() < deadline and first.poll() is None, f"no checkpoint {checkpoint.name}"
        time.sleep(0.05)
    workers = [w for torchrun in _children(first.pid) for w in _children(torchrun)]
    assert workers, "torchrun's workers not found"
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    assert first.wait(timeout=120) != 0


def _marked(token: str) -> list[int]:
    """Processes whose environment carries ``TEST_ENV=token`` (a launch of this test, its children)."""
    needle = f"{TEST_ENV}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.fixture(autouse=True)
def _no_launch_left(request):
    """Teardown of every launch a test made: any launcher, torchrun or rank still running is killed."""
    _current_test["token"] = f"{os.getpid()}-{request.node.nodeid}"
    yield
    if sys.platform == "linux":
        for pid in _marked(_current_test["token"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def read_metrics(run_dir, *, merge: bool = False) -> list[dict]:
    """``metrics.jsonl`` through the project's one reader (``shared/contract.py``)."""
    return contract.read_metrics(str(run_dir), merge=merge)


# On-device tests (markers neuron, gpu): collected everywhere, skipped with a reason that names the
# device unless it is here; the figures they measure go to trn2_report.md / gpu_report.md.
def _neuron_absent() -> str | None:
    from qwen3_trainium.config import devices

    if devices.detect_device_type() == "neuron":
        return None
    return "needs a Trainium (Neuron) device: torch_neuronx does not import here or sees no NeuronCore"


def _gpu_absent() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "needs a CUDA GPU: torch.cuda.is_available() is False here"


def pytest_collection_modifyitems(config, items):
    checks = {"neuron": _neuron_absent, "gpu": _gpu_absent}
    reasons: dict[str, str | None] = {}
    for item in items:
        for marker, absent in checks.items():
            if marker in item.keywords:
                if marker not in reasons:
                    reasons[marker] = absent()
                if reasons[marker]:
                    item.add_marker(pytest.mark.skip(reason=reasons[marker]))


@pytest.fixture(scope="session")
def device_report():
    """Figures the on-device tests measure, written as a report when any test recorded one."""
    from tests.support.device_report import DeviceReport

    report = DeviceReport()
    yield report
    report.write(ROOT)
