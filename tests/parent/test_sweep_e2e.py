"""Multirun sweeps, W&B and TensorBoard, end to end: real ``launch.py -m`` on CPU.

W&B runs are read back with wandb's own reader of its transaction log (``wandb leet inspect``),
TensorBoard's with TensorBoard's ``EventAccumulator``.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import read_metrics, run_launch

pytestmark = pytest.mark.slow

WANDB = str(Path(sys.executable).with_name("wandb"))
STEPS = "training.steps=4"


def wandb_records(run_dir: Path) -> tuple[dict, list[dict]]:
    """(the run summary, every record) of the one offline W&B run in ``run_dir/wandb``."""
    (offline,) = run_dir.glob("wandb/offline-run-*")
    summary = subprocess.run(
        [WANDB, "leet", "inspect", "--summary", "--json", str(offline)],
        capture_output=True,
        text=True,
        check=True,
    )
    records = subprocess.run(
        [WANDB, "leet", "inspect", "--json", str(offline)], capture_output=True, text=True, check=True
    )
    return json.loads(summary.stdout), [
        json.loads(line) for line in records.stdout.splitlines() if line.strip()
    ]


def wandb_runs(run_dir: Path) -> list[tuple[dict, list[dict]]]:
    out = []
    for offline in sorted(run_dir.glob("wandb/offline-run-*")):
        proc = subprocess.run(
            [WANDB, "leet", "inspect", "--json", str(offline)], capture_output=True, text=True, check=True
        )
        records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
        out.append((next(r["run"] for r in records if r["type"] == "run"), records))
    return out


def history_losses(records: list[dict]) -> dict[int, float]:
    return {
        r["history"]["step"]["num"]: r["history"]["item"]["loss_metrics/global_avg_loss"]
        for r in records
        if r["type"] == "history"
    }


def metrics(run_dir: Path) -> list[dict]:
    return read_metrics(run_dir)


def summary_rows(sweep_dir: Path) -> list[dict]:
    with open(sweep_dir / "summary.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.heavy
def test_three_paths_in_one_multirun_with_summary_plots_and_one_wandb_run_each(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = run_launch("-m", "model=hf,native,nki_moe", "smoke=on", STEPS, f"hydra.sweep.dir={sweep_dir}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[qwen3-trainium] sweep summary" in proc.stdout
    assert "| job | overrides | status | steps | first_loss | final_loss |" in proc.stdout
    assert "step 4/4 [" not in proc.stdout  # no progress line: output is not a terminal

    rows = summary_rows(sweep_dir)
    assert [r["overrides"] for r in rows] == [
        f"model={m} smoke=on {STEPS}" for m in ("hf", "native", "nki_moe")
    ]
    for row in rows:
        run_dir = Path(row["run_dir"])
        losses = [r["loss"] for r in metrics(run_dir)]
        assert row["status"] == "ok" and row["steps"] == "4/4"
        assert float(row["first_loss"]) == pytest.approx(losses[0], abs=1e-4)
        assert float(row["final_loss"]) == pytest.approx(losses[-1], abs=1e-4) and losses[-1] < losses[0]
        assert float(row["median_tokens_per_s"]) > 0 and float(row["peak_memory_gib"]) > 0
        assert float(row["wall_s"]) > 0
        assert (run_dir / "loss.png").is_file()
    assert {"summary.csv", "summary.md", "loss.png"} <= {p.name for p in sweep_dir.iterdir()}

    groups, previous_end = set(), ""
    for row in rows:
        run_dir = Path(row["run_dir"])
        summary, records = wandb_records(run_dir)
        resolved = yaml.safe_load((run_dir / "resolved.yaml").read_text())
        assert summary["state"] == "finished"
        assert summary["config"]["model"] == resolved["model"]  # every group of the resolved config
        assert set(resolved) <= set(summary["config"])
        assert summary["name"] == row["overrides"].replace(" ", ",")
        assert summary["run_id"] == (run_dir / "wandb_run_id").read_text().strip()
        model = resolved["model"]["path"]
        assert {f"model:{model}", "device:cpu", "parallel:fsdp"} <= set(summary["tags"])
        assert summary["summary"]["versions"]["torchtitan"] == "0.3.0"
        assert len(summary["summary"]["git_commit"].split("-")[0]) == 40
        run = next(r["run"] for r in records if r["type"] == "run")
        groups.add(run["run_group"])
        losses = history_losses(records)
        assert losses == pytest.approx({r["step"]: r["loss"] for r in metrics(run_dir)}, abs=1e-6)
        # this job's W&B run was finished before the next job started
        assert previous_end < run["start_time"]
        previous_end = summary["last_write"]
    assert groups == {f"sweep-{tmp_path.name}_sweep"}


@pytest.mark.heavy  # 20-30 s: moved out of make test to keep it near 20 minutes
def test_a_failing_job_is_recorded_and_the_sweep_goes_on(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    (good / "train.jsonl").write_text(
        "".join(json.dumps({"text": f"line {i} of a tiny corpus"}) + "\n" for i in range(200))
    )
    (bad / "train.jsonl").write_text("this is not json\n")  # only the rank's dataset loader can tell
    sweep_dir = tmp_path / "sweep"
    proc = run_launch(
        "-m", "data=local", f"data.dataset_path={bad},{good}", "smoke=on", "training.steps=3", "tracking=off",
        f"hydra.sweep.dir={sweep_dir}",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 of 2 jobs failed: 0" in proc.stderr
    assert "Traceback" not in proc.stdout
    rows = summary_rows(sweep_dir)
    assert [(r["job"], r["status"]) for r in rows] == [("0", "failed"), ("1", "ok")]
    assert rows[1]["steps"] == "3/3" and float(rows[1]["final_loss"]) > 0
    assert json.loads((sweep_dir / "0" / "job.json").read_text())["exit_code"] != 0


@pytest.mark.heavy  # two real runs, 30 s: make test-heavy
def test_resume_continues_the_same_wandb_run_beside_tensorboard(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    common = ["checkpoint=resume", "checkpoint.interval=1", "smoke=on", "tracking=[wandb,tensorboard]"]
    for steps in (2, 4):
        proc = run_launch(*common, f"training.steps={steps}", f"hydra.run.dir={run_dir}")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (first, first_records), (second, second_records) = wandb_runs(run_dir)
    assert first["run_id"] == second["run_id"] == (run_dir / "wandb_run_id").read_text().strip()
    assert sorted(history_losses(first_records)) == [1, 2]
    assert sorted(history_losses(second_records)) == [3, 4]  # history continues after the resume

    event_files = sorted(run_dir.glob("tb/*/events.out.tfevents.*"))
    assert event_files, "no TensorBoard event file"
    steps = []
    for path in event_files:
        events = EventAccumulator(str(path))
        events.Reload()
        steps += [e.step for e in events.Scalars("loss_metrics/global_avg_loss")]
    assert sorted(steps) == [1, 2, 3, 4]


def test_progress_line_replaces_the_scrolling_log(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_launch(
        "smoke=on",
        "training.steps=3",
        "tracking=off",
        "launcher.progress=on",
        f"hydra.run.dir={run_dir}",
        env={"COLUMNS": "200"},  # the line is cut at the terminal's width (COLUMNS=80: cut before the ETA)
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "step 3/3 [####################] | loss " in proc.stdout and "ETA 0:00" in proc.stdout
    assert "[rank0]:" not in proc.stdout + proc.stderr  # rank 0's log went to torchrun.log
    assert "step:  3  loss:" in (run_dir / "torchrun.log").read_text()


@pytest.mark.heavy  # 20-30 s: moved out of make test to keep it near 20 minutes
def test_optuna_records_failed_trials_and_searches_on(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = run_launch(
        "-m", "hydra/sweeper=lr_search", "hydra.sweeper.n_trials=3", "training.steps=choice(0,1,2,3)", "smoke=on",
        "lr_scheduler.warmup_steps=0", "tracking=off", f"hydra.sweep.dir={sweep_dir}",
    )  # fmt: skip
    rows = summary_rows(sweep_dir)
    failed = [r for r in rows if r["status"] == "failed"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(rows) == 3 and failed and ok  # seeded TPE: steps=0 (refused before launch) and a real run
    assert all("training.steps=0" in r["overrides"] for r in failed)
    assert proc.returncode == 1 and f"{len(failed)} of 3 jobs failed" in proc.stderr
    result = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    # lr_search turns eval on: Optuna got each trial's held-out loss, and the summary says so
    assert all(r["objective"] == "val_loss" and "eval=on" in r["overrides"] for r in rows)
    assert result["best_value"] == pytest.approx(min(float(r["final_val_loss"]) for r in ok), abs=1e-4)
    assert "| objective |" in (sweep_dir / "summary.md").read_text()
    lrs = [float(r["overrides"].split("optimizer.lr=")[1].split()[0]) for r in rows]
    assert len(set(lrs)) == 3 and all(1e-4 <= lr <= 1e-2 for lr in lrs)  # lr_search's log-uniform range


def test_an_optuna_search_whose_every_trial_failed_ends_with_the_summary_not_a_traceback(tmp_path):
    sweep_dir = tmp_path / "sweep"
    proc = run_launch(
        "-m", "hydra/sweeper=lr_search", "hydra.sweeper.n_trials=2", "training.steps=0", "smoke=on",
        "tracking=off", f"hydra.sweep.dir={sweep_dir}",
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert "no trial of the Optuna search completed" in proc.stderr
    assert [r["status"] for r in summary_rows(sweep_dir)] == ["failed", "failed"]
