"""``bench/auto_calibration.py`` (make bench-auto): which plan rows it measures, the report's math
(error %, medians after the warm-up, the two rankings, the table) on a hand-made plan and fake
measurements, and its refusal of --device neuron off a trn2. No real run."""

from __future__ import annotations

import json

import pytest

from bench import auto_calibration as bench


def _row(rank, layout, tp, dp_shard, *, cp=1, ac="none", local=1, accum=1, step=1.0, fits=True):
    return {
        "rank": rank,
        "layout": layout,
        "overrides": [f"launcher.nproc_per_node={tp * cp * dp_shard}", f"activation_checkpoint.mode={ac}"],
        "tp": tp,
        "cp": cp,
        "ep": 1,
        "dp_shard": dp_shard,
        "ac": ac,
        "local_batch": local,
        "accum": accum,
        "fits": fits,
        "peak_source": "traced" if rank < 4 else "estimated",
        "compute_seconds": step * 0.75,
        "comm_seconds": step * 0.25,
        "step_seconds": step,
        "tokens_per_second": 512 / step,
    }


# A CPU plan of world 2 as the planner ranks it: FSDP2 first; a TP2 row that does not fit ranks
# before the one that does; a second FSDP2 row (full AC) and a CP2 row the bench does not measure.
PLAN = {
    "world": 2,
    "device": "cpu",
    "planning_seconds": 3.2,
    "winner": 0,
    "rows": [
        _row(1, "FSDP2", 1, 2, step=0.30),
        _row(2, "TP2 x FSDP1", 2, 1, local=2, step=0.35, fits=False),
        _row(3, "TP2 x FSDP1", 2, 1, local=1, accum=2, step=0.40),
        _row(4, "FSDP2", 1, 2, ac="full", step=0.45),
        _row(5, "CP2 x FSDP1", 1, 1, cp=2, step=0.50),
        _row(6, "FSDP1", 1, 1, local=2, step=0.60),
    ],
}


def test_pick_takes_each_cpu_layouts_best_fitting_row_in_plan_order():
    picked = bench.pick(PLAN, "cpu")
    assert [(label, row["rank"]) for label, row in picked] == [("FSDP2", 1), ("TP2", 3), ("1 rank", 6)]


def test_pick_on_neuron_takes_the_top_three_fitting_rows():
    assert [row["rank"] for _, row in bench.pick(PLAN, "neuron")] == [1, 3, 4]


def test_error_is_predicted_minus_measured_over_measured_in_percent():
    assert bench.error_pct(1.2, 1.0) == pytest.approx(20.0)
    assert bench.error_pct(0.5, 2.0) == pytest.approx(-75.0)


def test_steady_medians_leave_out_the_warmup_steps():
    rows = [
        {"step": s, "step_time_s": t, "tokens_per_second": 512 / t} for s, t in enumerate([9, 5, 1, 3, 2], 1)
    ]
    got = bench.steady(rows, warmup=2)
    assert got == {"step_seconds": 2, "tokens_per_second": 256.0, "steps_measured": 3}
    with pytest.raises(ValueError, match="none after the 2 warm-up"):
        bench.steady(rows[:2], warmup=2)


def _results(measured: dict[str, float]) -> list[dict]:
    rows = {label: row for label, row in bench.pick(PLAN, "cpu")}
    return [
        bench.compare(label, rows[label], {"step_seconds": s, "tokens_per_second": 512 / s})
        for label, s in measured.items()
    ]


def test_compare_reports_the_rows_prediction_parts_beside_the_measurement():
    (fsdp,) = _results({"FSDP2": 0.25})
    parts = (fsdp["predicted_compute_s"], fsdp["predicted_comm_s"], fsdp["predicted_step_s"])
    assert parts == pytest.approx((0.225, 0.075, 0.3))
    assert fsdp["measured_step_s"] == 0.25 and fsdp["error_pct"] == pytest.approx(20.0)
    assert fsdp["plan_rank"] == 1 and fsdp["measured_tokens_per_second"] == 512 / 0.25


def test_ranking_says_whether_the_planners_first_choice_ran_fastest():
    right = bench.ranking(_results({"1 rank": 0.9, "FSDP2": 0.3, "TP2": 0.5}), PLAN)
    assert right["planner"] == ["FSDP2", "TP2", "1 rank"] and right["measured"] == ["FSDP2", "TP2", "1 rank"]
    assert right["picked_fastest"] and right["plan_winner_measured"]
    wrong = bench.ranking(_results({"FSDP2": 0.6, "TP2": 0.5, "1 rank": 0.55}), PLAN)
    assert wrong["measured"] == ["TP2", "1 rank", "FSDP2"] and not wrong["picked_fastest"]
    # |0.3-0.6|/0.6, |0.4-0.5|/0.5, |0.6-0.55|/0.55
    assert wrong["mean_abs_error_pct"] == pytest.approx((50 + 20 + 100 * 0.05 / 0.55) / 3)


def test_table_lists_layouts_in_the_planners_order_with_their_error():
    lines = bench.table(_results({"TP2": 0.5, "FSDP2": 0.25})).splitlines()
    head = "| layout | rank | ac | batch x accum | traced | compute s | comm s | predicted s | measured s |"
    assert lines[0].startswith(head)
    fsdp = "| FSDP2 | 1 | none | 1 x 1 | yes | 0.2250 | 0.0750 | 0.3000 | 0.2500 | +20.0 | 1707 | 2048 |"
    assert lines[2] == fsdp
    assert lines[3].startswith("| TP2 | 3 | none | 1 x 2 | yes |") and "| -20.0 |" in lines[3]


def test_job_pins_the_device_and_tracking_unless_given():
    assert bench.job(bench.parse([])) == ["model=native", "smoke=on", "device=cpu", "tracking=off"]
    neuron = bench.job(bench.parse(["--device", "neuron", "--job", "model=x device=neuron", "tracking=on"]))
    assert neuron == ["model=x", "device=neuron", "tracking=on"]


def test_measure_runs_the_rows_overrides_after_the_job_and_reads_its_metrics(monkeypatch, tmp_path):
    seen = []

    def fake_run(argv):
        seen.append(argv)
        with open(tmp_path / "metrics.jsonl", "w") as f:
            for step, seconds in enumerate([3.0, 1.0, 0.5, 0.4, 0.6], 1):
                f.write(
                    json.dumps({"step": step, "step_time_s": seconds, "tokens_per_second": 1 / seconds})
                    + "\n"
                )
        return 0.0, 12.0

    monkeypatch.setattr(bench, "started_and_wall", fake_run)
    row = PLAN["rows"][0]
    got = bench.measure(bench.parse(["--steps", "5"]), row, tmp_path)
    assert seen[0][2:] == [
        *bench.job(bench.parse([])),
        *row["overrides"],
        "training.steps=5",
        f"hydra.run.dir={tmp_path}",
    ]
    assert got["step_seconds"] == 0.5 and got["steps_measured"] == 3 and got["wall_s"] == 12.0


def test_one_bench_run_on_a_plan_writes_every_cpu_layouts_error(monkeypatch, tmp_path, capsys):
    plan_file = tmp_path / "auto_plan.json"
    plan_file.write_text(json.dumps(PLAN))
    fake = {1: 0.25, 3: 0.5, 6: 0.5}  # plan rank -> measured step seconds
    monkeypatch.setattr(
        bench,
        "measure",
        lambda args, row, run_dir: {
            "step_seconds": fake[row["rank"]],
            "tokens_per_second": 1.0,
            "run_dir": str(run_dir),
        },
    )
    assert bench.main(["--plan", str(plan_file), "--out", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "auto_calibration.json").read_text())
    errors = {r["layout"]: round(r["error_pct"], 6) for r in report["results"]}
    assert errors == {"FSDP2": 20.0, "TP2": -20.0, "1 rank": 20.0}
    assert report["ranking"]["picked_fastest"] and report["missing"] == []
    md = (tmp_path / "out" / "auto_calibration.md").read_text()
    assert "| TP2 | 3 |" in md and "picked the fastest: yes" in md
    assert "measured order:   FSDP2 > TP2 > 1 rank" in capsys.readouterr().out


def test_a_layout_the_plan_lacks_is_named_missing(monkeypatch, tmp_path):
    plan = {**PLAN, "rows": [r for r in PLAN["rows"] if r["tp"] == 1]}
    (tmp_path / "auto_plan.json").write_text(json.dumps(plan))
    monkeypatch.setattr(bench, "measure", lambda *a: {"step_seconds": 1.0, "tokens_per_second": 1.0})
    bench.main(["--plan", str(tmp_path / "auto_plan.json"), "--out", str(tmp_path)])
    assert json.loads((tmp_path / "auto_calibration.json").read_text())["missing"] == ["TP2"]
    assert "- not in the plan's rows: TP2" in (tmp_path / "auto_calibration.md").read_text()


def test_neuron_without_neuron_refuses_in_one_line_before_planning(monkeypatch, capsys):
    monkeypatch.setattr(bench, "neuron_here", lambda: False)
    monkeypatch.setattr(bench, "plan", lambda *a: pytest.fail("planned"))
    assert bench.main(["--device", "neuron"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a Trainium host" in err and "--device cpu" in err


def test_steps_must_exceed_the_warmup(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.parse(["--steps", "2"])
    assert exit_.value.code == 2 and "--steps 2 must exceed --warmup 2" in capsys.readouterr().err


def test_plan_is_a_fresh_dry_run_of_the_job_with_every_row_kept(monkeypatch, tmp_path):
    seen = []

    def fake_run(argv):
        seen.append(argv)
        if len(seen) == 1:  # the second dry run writes no plan
            run_dir = tmp_path / "plan"
            run_dir.mkdir()
            (run_dir / bench.PLAN_NAME).write_text(json.dumps(PLAN))
        return 0.0, 7.0

    monkeypatch.setattr(bench, "started_and_wall", fake_run)
    assert bench.plan(bench.parse([]), tmp_path) == (PLAN, 7.0)
    planned = [*bench.job(bench.parse([])), "parallel=auto", "parallel.auto_top=100", "dry_run=true"]
    assert seen[0][2:] == [*planned, "preflight_cache=false", f"hydra.run.dir={tmp_path / 'plan'}"]
    with pytest.raises(SystemExit, match="wrote no auto_plan.json"):
        bench.plan(bench.parse([]), tmp_path / "elsewhere")


def test_compare_gives_what_a_traced_row_achieved_in_flops_per_second():
    traced = {**PLAN["rows"][0], "trace": {"step_flops": 1e9}}
    measured = {"step_seconds": 0.5, "tokens_per_second": 1.0}
    assert bench.compare("FSDP2", traced, measured)["measured_flops_per_second"] == 2e9
    assert bench.compare("FSDP2", PLAN["rows"][0], measured)["measured_flops_per_second"] is None
