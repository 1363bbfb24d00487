"""parallel=auto: the legal layouts, the screen, the traced confirmation, the ranked table and the
winner the launcher goes on with. Traces are replaced by a stand-in (``_fake_traces``) except in
``test_the_cpu_smoke_plan_traces_its_best_and_runs_the_winner`` (tests/rank: heavy e2e)."""

from __future__ import annotations

import json
import os

import pytest
from conftest import resolve

from qwen3_trainium.memory.trace import Trace
from qwen3_trainium.parent import auto
from qwen3_trainium.parent.auto import candidates, plan

GiB = 2**30
HEADLINE = ("model=nki_moe", "model.flavor=30B-A3B", "device=neuron", "parallel=auto")


def _shape(run, tmp_path):
    return auto._shape(run, str(tmp_path))


def _fake_traces(monkeypatch, peak_of=lambda run: 1 * GiB, calls=None):
    """trace_rows without subprocesses: each run's peak from ``peak_of``, its roofline at the
    FLOP count (so the order stays the screen's)."""

    def fake(run_dir, runs, limits):
        out = []
        for run in runs:
            if calls is not None:
                calls.append(run)
            trace = Trace(world=64, parts={"activations": int(peak_of(run))})
            trace.step_seconds = 0.5
            out.append((trace, ""))
        return out

    monkeypatch.setattr(plan, "trace_rows", fake)


def test_trn2_layouts_keep_tp_within_a_chip_divide_the_kv_heads_and_hold_the_global_batch(tmp_path):
    run = resolve(*HEADLINE)
    shape, _ = _shape(run, tmp_path)
    world = candidates.world_of(run, cpu_count=2)
    assert world.sizes == (64,) and world.ranks_per_chip == 4  # 8 physical cores a chip / LNC 2
    legal, refused = candidates.legal(run, shape, world)
    tps = {layout.tp for layout, _ in legal}
    assert tps == {1, 2, 4}  # 30B-A3B has 4 KV heads; TP 8 would leave a chip
    assert {layout.global_batch for layout, _ in legal} == {8 * 64}
    # AWS's Neuron EP backend "does not run on Trn2": no EP there
    assert {layout.ep for layout, _ in legal} == {1}
    # 8B's 32 heads and 8 KV heads would take TP 8: only the chip keeps it to 4
    dense = resolve("model=native", "model.flavor=8B", "device=neuron", "parallel=auto")
    legal, _ = candidates.legal(dense, _shape(dense, tmp_path)[0], candidates.world_of(dense, cpu_count=2))
    assert {layout.tp for layout, _ in legal} == {1, 2, 4}


def test_each_layout_is_one_the_launcher_accepts_from_its_overrides(tmp_path):
    run = resolve(*HEADLINE)
    shape, _ = _shape(run, tmp_path)
    legal, _ = candidates.legal(run, shape, candidates.world_of(run, 2))
    layout, chosen = next((lay, r) for lay, r in legal if lay.tp == 4 and lay.accum > 1)
    again = resolve(*HEADLINE[:-1], "parallel=fsdp", *candidates.overrides(run, layout))
    for key in ("tensor_parallel_degree", "context_parallel_degree", "expert_parallel_degree"):
        assert getattr(again.parallel, key) == getattr(chosen.parallel, key)
    assert again.training.global_batch_size == layout.global_batch == 512
    assert again.activation_checkpoint.mode == chosen.activation_checkpoint.mode


def test_a_cpu_moe_job_gets_expert_parallel_where_the_blockwise_kernel_is_off(tmp_path):
    for kernels, eps in (("model.kernels=[]", {1, 2}), ("model.kernels=[moe_experts]", {1})):
        run = resolve("model=nki_moe", "smoke=on", "parallel=auto", kernels)
        legal, refused = candidates.legal(
            run, _shape(run, tmp_path)[0], candidates.world_of(run, cpu_count=2)
        )
        assert {layout.ep for layout, _ in legal} == eps
    assert refused["parallel.expert_parallel_degree"] > 0  # the kernel splits experts by TP only


def test_dpo_layouts_have_no_context_parallel(tmp_path):
    run = resolve("objective=dpo", "parallel=auto", "smoke=on")
    shape, _ = _shape(run, tmp_path)
    assert all(layout.cp == 1 for layout in candidates.layouts(run, shape, candidates.world_of(run, 2)))


def test_a_layout_the_trace_says_does_not_fit_is_never_chosen(tmp_path, monkeypatch):
    run = resolve(*HEADLINE)
    shape, flops = _shape(run, tmp_path)
    calls = []
    # the trace puts every layout without checkpointing over the rank's memory
    _fake_traces(
        monkeypatch, lambda r: 30 * GiB if r.activation_checkpoint.mode.value == "none" else GiB, calls
    )
    made = plan.make_plan(run, str(tmp_path), shape, flops)
    winner = made.winner
    assert winner is not None and winner.traced and winner.fits
    assert winner.layout.ac != "none"
    over = [r for r in made.rows if r.traced and not r.fits]
    assert over and all(r.verdict.startswith("does not fit: traced 30.00 GiB > 90%") for r in over), [
        r.verdict for r in over
    ]
    # the screen let layouts without checkpointing through (their estimate may fit): traced, refused
    assert {r.layout.ac for r in over} == {"none"}


def test_losers_say_why_and_the_table_has_auto_top_rows(tmp_path, monkeypatch):
    run = resolve(*HEADLINE, "parallel.auto_top=4")
    shape, flops = _shape(run, tmp_path)
    _fake_traces(monkeypatch)
    data = plan.as_json(plan.make_plan(run, str(tmp_path), shape, flops), run)
    verdicts = [r["verdict"] for r in data["rows"]]
    assert verdicts[0] == "winner" and verdicts.count("winner") == 1
    assert all(v.startswith(("slower by", "does not fit", "not traced")) for v in verdicts[1:])
    assert any(v.startswith("does not fit: estimated") for v in verdicts)  # the screen's
    steps = [r["step_seconds"] for r in data["rows"] if r["verdict"].startswith("slower")]
    assert steps == sorted(steps) and steps[0] >= data["rows"][0]["step_seconds"]
    from qwen3_trainium.parent.auto import table

    text = table.text(data, 4)
    assert len([line for line in text.splitlines() if line.strip()[:2].strip().isdigit()]) == 4
    json_path, md_path = table.write(data, str(tmp_path), 4)
    assert json.load(open(json_path))["rows"][0]["verdict"] == "winner"
    assert "| 1 |" in open(md_path).read()


def test_no_layout_that_fits_refuses_the_job_naming_parallel_auto(tmp_path, monkeypatch, capsys):
    run = resolve(*HEADLINE)
    _fake_traces(monkeypatch, lambda r: 100 * GiB)
    chosen, problems = auto.choose(run, str(tmp_path))
    assert chosen is None and problems[0].key == "parallel"
    assert "no layout on device=neuron (trn2.48xlarge) fits a rank's memory" in problems[0].message
    assert "device=neuron" not in problems[0].fix


@pytest.mark.parametrize("budget, rounds", [(60, 1), (100, 2)])
def test_a_round_starts_only_if_it_would_end_within_the_budget(tmp_path, monkeypatch, budget, rounds):
    """Rounds of 40 s on a fake clock, each row over the limit so that tracing goes on: after the
    first, a round starts only if one as long as the last ends within parallel.auto_budget."""
    clock = [0.0]
    monkeypatch.setattr(plan.time, "perf_counter", lambda: clock[0])
    calls = []

    def peak_of(run):
        if len(calls) in (1, 2):  # the first round's first row fits, the rest never
            return 1 * GiB
        return 100 * GiB

    _fake_traces(monkeypatch, peak_of, calls)
    traced = plan.trace_rows

    def timed(run_dir, runs, limits):
        clock[0] += 40.0
        return traced(run_dir, runs, limits)

    monkeypatch.setattr(plan, "trace_rows", timed)
    run = resolve(*HEADLINE, f"parallel.auto_budget={budget}", "parallel.auto_traces=5")
    shape, flops = _shape(run, tmp_path)
    made = plan.make_plan(run, str(tmp_path), shape, flops)
    slots = min(os.cpu_count() or 1, 5)
    assert len(calls) == rounds * slots
    assert any("would end past parallel.auto_budget" in note for note in made.notes)


def test_a_cpu_plan_that_fits_nothing_says_it_planned_for_the_cpu(tmp_path, capsys):
    """The headline experiment's device comes with its parallel preset; parallel=auto replaces the
    preset, so without device=neuron the 30B model is planned for this CPU's ranks."""
    run = resolve("experiment=qwen3_30b_a3b_trn2", "parallel=auto", "memory=estimate")
    chosen, problems = auto.choose(run, str(tmp_path))
    assert chosen is None and "no layout on device=cpu fits" in problems[0].message
    assert problems[0].fix.endswith("or device=neuron to plan for a trn2")


def test_the_winner_goes_on_with_its_trace_and_the_plan_is_remembered(tmp_path, monkeypatch, capsys):
    run = resolve(*HEADLINE)
    calls = []
    _fake_traces(monkeypatch, calls=calls)
    chosen, problems = auto.choose(run, str(tmp_path))
    assert problems == [] and calls
    assert chosen.memory.mode.value == "trace"
    from qwen3_trainium.parent.auto import winner

    assert winner.planned_trace(chosen, str(tmp_path))["parts"] == {"activations": GiB}
    assert (tmp_path / "auto_plan.md").exists() and (tmp_path / "auto_plan.json").exists()
    first = len(calls)
    again, _ = auto.choose(resolve(*HEADLINE), str(tmp_path / "again"))
    assert len(calls) == first  # remembered: nothing traced again
    assert again.parallel.tensor_parallel_degree == chosen.parallel.tensor_parallel_degree
    assert "remembered" in capsys.readouterr().out


def test_memory_estimate_plans_without_tracing(tmp_path, monkeypatch):
    run = resolve(*HEADLINE, "memory=estimate")
    calls = []
    _fake_traces(monkeypatch, calls=calls)
    chosen, problems = auto.choose(run, str(tmp_path))
    assert problems == [] and calls == [] and chosen.memory.mode.value == "estimate"


@pytest.mark.heavy  # a real plan (two traces) and a 2-rank smoke run: about 90 s on 2 cores
def test_the_cpu_smoke_plan_traces_its_best_and_runs_the_winner(tmp_path):
    """``python launch.py model=native smoke=on parallel=auto``: the plan is printed, its winner
    was traced and fits, and the run trains on exactly the winner's layout (torchrun's process
    count and the resolved degrees), to its last step."""
    from conftest import read_metrics, run_launch

    from qwen3_trainium.config import runconfig

    run_dir = tmp_path / "run"
    proc = run_launch("model=native", "smoke=on", "parallel=auto", "tracking=off", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((run_dir / "auto_plan.json").read_text())
    best = data["rows"][0]
    assert best["verdict"] == "winner" and best["peak_source"] == "traced" and best["fits"]
    assert "parallel=auto:" in proc.stdout and "winner" in proc.stdout
    ran = runconfig.load(str(run_dir / "resolved.yaml"))
    assert ran.launcher.nproc_per_node == best["world"]
    assert ran.parallel.tensor_parallel_degree == best["tp"]
    assert ran.activation_checkpoint.mode.value == best["ac"]
    assert ran.training.local_batch_size == best["local_batch"]
    assert f"--nproc_per_node={best['world']}" in proc.stdout
    assert [r["step"] for r in read_metrics(run_dir)][-1] == 10


@pytest.mark.slow  # a two-job dry-run sweep: about 20 s
def test_a_sweep_plans_each_job_on_its_own(tmp_path):
    """``-m ... training.seq_len=128,256 parallel=auto``: each job's run directory has its own
    plan, made for its own sequence length."""
    from conftest import run_launch

    sweep = tmp_path / "sweep"
    proc = run_launch(
        "-m", "model=native", "smoke=on", "parallel=auto", "memory=estimate", "tracking=off",
        "training.seq_len=128,256", "dry_run=true", f"hydra.sweep.dir={sweep}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    plans = sorted(json.loads(p.read_text())["seq_len"] for p in sweep.glob("*/auto_plan.json"))
    assert plans == [128, 256]
