"""``bench/moe.py`` (make bench-moe): the report's math on hand-made metrics rows, the jobs it
launches, its ABBA order, its refusals, and one real CPU run of both MoE routes whose report is
checked against the runs' own metrics.jsonl files."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, compose_cfg
from omegaconf import OmegaConf

from bench import moe, moe_facts
from bench import moe_report as report


def _row(step, tps, *, time=0.0, **extra):
    return {"step": step, "time": time, "tokens_per_second": tps, "step_time_s": 256 / tps, **extra}


def test_summarize_skips_warmup_measures_ttfi_from_start_and_keeps_only_peaks():
    rows = [
        _row(1, 10.0, time=1012.5, memory_max_reserved_gib=0.5, memory_capacity_gib=20.0),
        _row(2, 100.0, time=1013.0, memory_max_reserved_gib=0.75, neuron_driver_total_gib=3.0),
        _row(3, 300.0, time=1014.0, memory_max_reserved_gib=0.7, watched_peak_gib=2.5),
        _row(4, 200.0, time=1015.0, watched_from_accelerator=True, mfu_pct=12.0),
    ]
    got = report.summarize(rows, warmup=1, started=1000.0)
    assert got["tokens_per_second"] == 200.0  # median of 100, 300, 200: step 1 left out
    assert got["mfu_pct"] == 12.0
    assert got["ttfi_s"] == 12.5 and got["first_step"] == 1
    # capacity and the driver's current total are not peaks; a flag is not a size
    assert got["peaks_gib"] == {"memory_max_reserved_gib": 0.75, "watched_peak_gib": 2.5}


def test_summarize_refuses_a_run_with_no_step_after_warmup():
    with pytest.raises(ValueError, match="none after the 2 warm-up"):
        report.summarize([_row(1, 1.0), _row(2, 2.0)], warmup=2, started=0.0)


def _run(route, tps, ttfi, peaks, mfu=None):
    return {
        "route": route,
        "tokens_per_second": tps,
        "mfu_pct": mfu,
        "ttfi_s": ttfi,
        "step_time_s": 1.0,
        "peaks_gib": peaks,
    }


def test_headline_memory_is_the_best_figure_every_run_has():
    both = {"watched_peak_gib": 20.0, "memory_max_reserved_gib": 18.0}
    assert report.headline_memory_key([_run("grouped_mm", 1, 1, both)] * 2) == "watched_peak_gib"
    one_lacks = [_run("grouped_mm", 1, 1, both), _run("nki_moe", 1, 1, {"memory_max_reserved_gib": 9.0})]
    assert report.headline_memory_key(one_lacks) == "memory_max_reserved_gib"
    assert report.headline_memory_key([_run("nki_moe", 1, 1, {})]) is None


def test_medians_and_ratios_grouped_mm_over_nki_moe():
    runs = [
        _run("grouped_mm", 300.0, 10.0, {"neuron_driver_peak_gib": 16.0}, mfu=30.0),
        _run("nki_moe", 50.0, 40.0, {"neuron_driver_peak_gib": 20.0}, mfu=10.0),
        _run("nki_moe", 150.0, 20.0, {"neuron_driver_peak_gib": 22.0}, mfu=20.0),
        _run("grouped_mm", 100.0, 20.0, {"neuron_driver_peak_gib": 18.0}, mfu=10.0),
    ]
    med = report.medians(runs, "neuron_driver_peak_gib")
    assert med["grouped_mm"] == {
        "tokens_per_second": 200.0,
        "mfu_pct": 20.0,
        "ttfi_s": 15.0,
        "step_time_s": 1.0,
        "peak_gib": 17.0,
    }
    assert med["nki_moe"]["tokens_per_second"] == 100.0 and med["nki_moe"]["ttfi_s"] == 30.0
    ratio = report.ratios(med)
    assert ratio["tokens_per_second"] == 2.0
    assert ratio["mfu_pct"] == 20.0 / 15.0
    assert ratio["ttfi_s"] == 0.5
    assert ratio["peak_gib"] == 17.0 / 21.0
    table = report.medians_table(med, ratio)
    assert "| tokens/s | 200 | 100 | 2 |" in table and "| TTFI s | 15 | 30 | 0.5 |" in table


def test_mfu_ratio_is_na_on_cpu_where_no_run_logs_mfu():
    runs = [_run("grouped_mm", 2.0, 1.0, {}), _run("nki_moe", 1.0, 1.0, {})]
    ratio = report.ratios(report.medians(runs, None))
    assert ratio["mfu_pct"] is None and ratio["peak_gib"] is None and ratio["tokens_per_second"] == 2.0
    assert "| MFU % | n/a | n/a | n/a |" in report.medians_table(report.medians(runs, None), ratio)


def test_jobs_differ_only_in_the_model_and_extras_reach_both():
    args = moe.parse(["--steps", "3", "training.seed=7"])
    jobs = moe.jobs(args)
    rest = [
        "device=cpu",
        "model.flavor=tiny_moe",
        "smoke=on",
        "tracking=off",
        "training.steps=3",
        "training.seed=7",
    ]
    assert jobs == {"grouped_mm": ["model=native", *rest], "nki_moe": ["model=nki_moe", *rest]}
    neuron = moe.jobs(moe.parse(["--device", "neuron", "--nki-moe-job", "experiment=x model.flavor=y"]))
    assert neuron["grouped_mm"] == ["experiment=qwen3_30b_a3b_trn2", "tracking=off", "training.steps=20"]
    assert neuron["nki_moe"] == ["experiment=x", "model.flavor=y", "tracking=off", "training.steps=20"]


@pytest.mark.parametrize("device", ["cpu", "neuron"], ids=["cpu_job", "trn2_job"])
def test_both_routes_default_jobs_compose_to_the_same_job(device):
    """What issue 38 asks the routes to share: flavor, seq_len, batch, steps, seed, data, layout."""
    composed = {
        route: OmegaConf.to_container(compose_cfg(*job), resolve=False, enum_to_str=True)
        for route, job in moe.jobs(moe.parse(["--device", device])).items()
    }
    grouped, nki = composed["grouped_mm"], composed["nki_moe"]
    assert (grouped["model"]["path"], nki["model"]["path"]) == ("native", "nki_moe")
    assert moe_facts.job_differences(grouped, nki) == []
    expected = {"cpu": ("tiny_moe", 256, 1), "neuron": ("30B-A3B", 4096, 1)}[device]
    assert (
        grouped["model"]["flavor"],
        grouped["training"]["seq_len"],
        grouped["training"]["local_batch_size"],
    ) == expected
    if device == "neuron":  # AWS's layout: TP4 x FSDP16 (FSDP over the rest), selective AC
        assert grouped["parallel"]["tensor_parallel_degree"] == 4
        assert grouped["activation_checkpoint"]["mode"] == "selective"


def test_runs_are_interleaved_abba(monkeypatch, tmp_path):
    order = []

    def run_once(args, route, overrides, run_dir):
        order.append(route)
        return {
            "route": route,
            "tokens_per_second": 1.0,
            "ttfi_s": 1.0,
            "wall_s": 1.0,
            "run_dir": str(run_dir),
        }

    monkeypatch.setattr(moe, "run_once", run_once)
    monkeypatch.setattr(moe_facts, "same_job_or_exit", lambda dirs: None)
    moe.measure(moe.parse(["--rounds", "3"]), {"grouped_mm": [], "nki_moe": []}, tmp_path)
    assert order == ["grouped_mm", "nki_moe", "nki_moe", "grouped_mm", "grouped_mm", "nki_moe"]


def test_route_keys_may_differ_the_job_may_not():
    a = {"model": {"path": "native", "flavor": "tiny_moe", "kernels": []}, "training": {"seq_len": 256}}
    b = {
        "model": {"path": "nki_moe", "flavor": "tiny_moe", "kernels": ["moe_experts"]},
        "training": {"seq_len": 256},
    }
    assert moe_facts.job_differences(a, b) == []
    b["training"]["seq_len"] = 512
    b["model"]["flavor"] = "debugmodel_moe"
    assert moe_facts.job_differences(a, b) == [
        "model.flavor: 'tiny_moe' / 'debugmodel_moe'",
        "training.seq_len: 256 / 512",
    ]


@pytest.mark.parametrize(
    "argv, says",
    [(["--steps", "1"], "--steps 1 must exceed --warmup 1"), (["--cold"], "--cold picks a fresh Neuron")],
)
def test_bad_arguments_are_refused_with_exit_2(argv, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        moe.parse(argv)
    assert exit_.value.code == 2 and says in capsys.readouterr().err


def test_neuron_without_neuron_refuses_in_one_line_before_launching(monkeypatch, capsys):
    monkeypatch.setattr(moe_facts, "neuron_here", lambda: False)
    monkeypatch.setattr(moe, "measure", lambda *a: pytest.fail("launched"))
    assert moe.main(["--device", "neuron"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a Trainium host" in err and "--device cpu" in err


def test_the_mfu_peak_named_on_neuron_is_158_tflops_per_rank_at_lnc_2():
    # AWS: 79 dense BF16 TFLOPS per NeuronCore-v3 (Neuron docs, NeuronCore-v3 architecture), x LNC 2
    text = moe_facts.mfu_peak({"device": {"type": "neuron", "lnc": 2, "instance": "trn2.48xlarge"}})
    assert "158 TFLOPS" in text and "LNC 2" in text
    assert moe_facts.mfu_peak({"device": {"type": "cpu"}}).startswith("n/a on cpu")


@pytest.mark.heavy  # 27 s: two smoke jobs (make test near 20 minutes)
def test_cpu_bench_runs_both_routes_and_reports_their_numbers(tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "bench/moe.py", "--rounds", "1", "--steps", "2", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "bench_moe.json").read_text())
    assert sorted(run["route"] for run in result["runs"]) == ["grouped_mm", "nki_moe"]
    steady = {}  # the oracle: each run's own metrics.jsonl after step 1
    for run in result["runs"]:
        rows = [
            json.loads(line) for line in (Path(run["run_dir"]) / "metrics.jsonl").read_text().splitlines()
        ]
        steady[run["route"]] = statistics.median(r["tokens_per_second"] for r in rows[1:])
        assert run["tokens_per_second"] == steady[run["route"]]
        assert 0 < run["ttfi_s"] < run["wall_s"] and run["first_step"] == 1
        assert run["peaks_gib"]["memory_max_reserved_gib"] == max(r["memory_max_reserved_gib"] for r in rows)
    assert result["ratios"]["tokens_per_second"] == steady["grouped_mm"] / steady["nki_moe"]
    assert result["ratios"]["mfu_pct"] is None and result["memory_key"] == "memory_max_reserved_gib"
    md = (out / "bench_moe.md").read_text()
    assert "model=native device=cpu model.flavor=tiny_moe" in md and "model=nki_moe device=cpu" in md
    assert "| tokens/s |" in md and "grouped_mm / nki_moe" in proc.stdout


def test_compile_cache_cold_is_a_new_empty_dir_and_warm_counts_the_configured_cache(tmp_path):
    cold = moe.parse(["--device", "neuron", "--cold"])
    extra, label = moe_facts.compile_cache(cold, [], tmp_path / "runs" / "1-nki_moe")
    fresh = tmp_path / "runs" / "1-nki_moe-neff-cache"
    assert extra == [f"device.compile_cache={fresh}"] and label == "cold (new, empty)"
    assert fresh.is_dir() and not any(fresh.iterdir())
    cache = tmp_path / "neff"
    (cache / "MODULE_1").mkdir(parents=True)
    given = [f"device.compile_cache={cache}"]
    warm = moe.parse(["--device", "neuron"])
    assert moe_facts.compile_cache(warm, given, tmp_path / "r") == ([], "cold (empty)")
    (cache / "MODULE_1" / "model.neff").write_bytes(b"x")
    (cache / "MODULE_1" / "model.done").write_bytes(b"")
    assert moe_facts.compile_cache(warm, given, tmp_path / "r") == ([], "warm (2 files)")
    assert moe_facts.compile_cache(moe.parse([]), given, tmp_path / "r") == ([], "n/a (CPU eager)")
