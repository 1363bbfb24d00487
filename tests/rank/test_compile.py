"""compile=off|on: torchtitan's CompileConfig, a backend per device, refusals that say why."""

from __future__ import annotations

import pytest
from conftest import resolve

from qwen3_trainium.parent import preflight
from qwen3_trainium.parent.preflight.run import check_compile
from qwen3_trainium.rank import titan


def test_compile_is_off_by_default_and_on_maps_to_torchtitans_compile_config(tmp_path):
    assert titan.to_trainer_config(resolve("model=native"), str(tmp_path)).compile.enable is False
    compiled = titan.to_trainer_config(resolve("model=native", "compile=on"), str(tmp_path)).compile
    assert compiled.enable is True
    assert compiled.components == ["model", "loss"]
    assert compiled.backend == "inductor"  # auto on CPU
    assert compiled.enable_async_tensor_parallel is False


@pytest.mark.parametrize(
    ("overrides", "backend", "async_tp"),
    [
        (("device=cpu",), "inductor", False),
        (("device=cuda", "parallel=cuda_single"), "inductor", False),
        (("device=cuda", "launcher.nproc_per_node=2", "parallel.tensor_parallel_degree=2"), "inductor", True),
        (("device=neuron", "parallel=trn2_tp4_fsdp16"), "neuron", False),
    ],
)
def test_auto_picks_the_backend_and_async_tp_by_device(overrides, backend, async_tp):
    run = resolve("model=native", "compile=on", *overrides)
    assert run.compile.backend.value == backend
    assert run.compile.enable_async_tensor_parallel is async_tp


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        (("compile.backend=neuron",), "compile.backend", "Trainium only"),
        (("device=neuron", "compile.backend=inductor"), "compile.backend", "does not target Neuron"),
        (("compile.enable_async_tensor_parallel=true",), "compile.enable_async_tensor_parallel", "CUDA"),
        (("compile.components=[]",), "compile.components", "compiles nothing"),
    ],
)
def test_combinations_that_cannot_work_are_refused_with_the_reason(overrides, key, words):
    problems = preflight.check_static(
        resolve("model=native", "compile=on", *overrides), "/tmp", launching=False
    )
    assert [p.key for p in problems] == [key]
    assert words in problems[0].message and problems[0].fix


def test_inductor_on_cpu_without_a_cpp_compiler_is_refused(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler")
    problems = check_compile(resolve("model=native", "compile=on"))
    assert [p.key for p in problems] == ["compile.backend"]
    assert "C++" in problems[0].message and "compile=off" in problems[0].fix
    assert check_compile(resolve("model=native")) == []  # eager needs no compiler


def test_async_tp_names_every_reason_it_does_not_apply():
    run = resolve("model=native", "compile.enable_async_tensor_parallel=true")  # compile off, CPU, TP 1
    (problem,) = check_compile(run)
    assert "CUDA" in problem.message and "tensor_parallel_degree is 1" in problem.message
    assert "needs the model compiled" in problem.message


@pytest.mark.slow
@pytest.mark.heavy
def test_native_smoke_trains_compiled_on_cpu_to_the_eager_losses(tmp_path):
    """`python launch.py model=native smoke=on compile=on`: Inductor on CPU, the eager losses."""
    from conftest import run_launch

    from qwen3_trainium.parent import report

    losses = {}
    for mode, extra in (("on", ()), ("off", ("training.steps=3",))):
        run_dir = tmp_path / mode
        args = (
            "model=native",
            "smoke=on",
            f"compile={mode}",
            "tracking=off",
            *extra,
            f"hydra.run.dir={run_dir}",
        )
        proc = run_launch(*args)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        losses[mode] = [r["loss"] for r in report.read_metrics(str(run_dir))]
    rank_log = "".join(p.read_text() for p in (tmp_path / "on" / "logs").rglob("stdout.log"))
    assert "Compiling each TransformerBlock with torch.compile" in rank_log
    assert len(losses["on"]) == 10
    assert losses["on"][:3] == pytest.approx(losses["off"], rel=1e-3)
