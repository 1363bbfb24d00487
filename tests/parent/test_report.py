"""Run records, summary rows, sweep summaries, the progress line and W&B identity (no training)."""

from __future__ import annotations

import csv
import json
import math

import pytest
from conftest import resolve

from qwen3_trainium.config.schema import Progress
from qwen3_trainium.parent import progress, report, sweep, tracking
from qwen3_trainium.parent.launcher import use_progress

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _fake_run(run_dir, *, num, status, losses, overrides=("model=native",), wall=12.5, tps=100.0):
    run_dir.mkdir(parents=True, exist_ok=True)
    report.update_job(str(run_dir), job_num=num, overrides=list(overrides), total_steps=len(losses) or 3)
    report.update_job(str(run_dir), status=status, wall_s=wall)
    with open(run_dir / report.METRICS_NAME, "w") as f:
        for step, loss in enumerate(losses, start=1):
            row = {"step": step, "time": 1000.0 + 2 * step, "loss": loss, "tokens_per_second": tps * step}
            f.write(json.dumps(row | {"memory_max_active_gib": 0.1 * step}) + "\n")
    return str(run_dir)


def test_run_row_reads_job_and_metrics(tmp_path):
    run_dir = _fake_run(tmp_path / "r", num=4, status="ok", losses=[6.0, 5.5, 5.25], wall=12.345)
    row = report.run_row(run_dir, job=4)
    assert row["status"] == "ok" and row["steps"] == "3/3" and row["job"] == 4
    assert (row["first_loss"], row["final_loss"]) == (6.0, 5.25)
    assert row["median_tokens_per_s"] == 200 and row["peak_memory_gib"] == pytest.approx(0.3)
    assert row["wall_s"] == 12.3 and row["overrides"] == "model=native"
    assert report.final_loss(run_dir) == 5.25


def test_metrics_keep_the_latest_row_per_step_and_skip_a_torn_line(tmp_path):
    run_dir = _fake_run(tmp_path / "r", num=0, status="ok", losses=[6.0, 5.0])
    with open(tmp_path / "r" / report.METRICS_NAME, "a") as f:
        f.write(json.dumps({"step": 2, "time": 2000.0, "loss": 4.5}) + "\n")  # a resumed attempt
        f.write('{"step": 3, "lo')  # still being written
    rows = report.read_metrics(run_dir)
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 6.0), (2, 4.5)]


def test_a_run_that_logged_nothing_has_nan_loss_and_empty_cells(tmp_path):
    run_dir = _fake_run(tmp_path / "r", num=1, status="failed", losses=[])
    assert math.isnan(report.final_loss(run_dir))
    row = report.run_row(run_dir)
    assert row["final_loss"] == "" and row["steps"] == "0/3"
    assert "| - |" in report.markdown_table([row])


def test_sweep_summary_writes_csv_md_and_plot_and_fails_the_sweep(tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    _fake_run(sweep_dir / "1", num=1, status="failed", losses=[6.1], overrides=("optimizer.lr=1",))
    _fake_run(sweep_dir / "0", num=0, status="ok", losses=[6.0, 5.0], overrides=("a=x|y",))
    assert sweep.job_dirs(str(sweep_dir)) == [str(sweep_dir / "0"), str(sweep_dir / "1")]

    from omegaconf import OmegaConf

    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}})
    sweep.SweepSummary().on_multirun_end(config)
    assert sweep.exit_status() == 1
    out = capsys.readouterr()
    assert "| 0 | a=x\\|y | ok | 2/2 | 6.0 | 5.0 |" in out.out
    assert "1 of 2 jobs failed: 1" in out.err
    with open(sweep_dir / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["status"], r["final_loss"]) for r in rows] == [
        ("0", "ok", "5.0"),
        ("1", "failed", "6.1"),
    ]
    assert (sweep_dir / "summary.md").read_text().count("\n| ") == 3  # header + 2 rows
    assert (sweep_dir / "loss.png").read_bytes()[:8] == PNG_MAGIC

    _fake_run(sweep_dir / "1", num=1, status="ok", losses=[6.1])
    sweep.SweepSummary().on_multirun_end(config)
    assert sweep.exit_status() == 0


def test_progress_line_shows_steps_loss_throughput_and_eta():
    rows = [
        {"step": 1, "time": 100.0, "loss": 6.0, "tokens_per_second": 50.0},
        {"step": 2, "time": 110.0, "loss": 5.5, "tokens_per_second": 250.0},
        {"step": 4, "time": 114.0, "loss": 5.0, "tokens_per_second": 260.0},
    ]
    line = progress.render(rows, total_steps=10, elapsed_s=75)
    assert "step 4/10 [########............]" in line
    assert "loss 5.0000" in line and "260 tok/s" in line
    assert "ETA 0:28" in line  # (114 - 100) s / 3 steps x 6 steps left
    assert "elapsed 1:15" in line
    assert progress.eta_seconds(rows[:1], 10) is None  # one row, no step time: unknown
    assert progress.eta_seconds([{"step": 1, "time": 0.0, "step_time_s": 2.0}], 10) == 18.0
    assert progress.render([], 10, 3).endswith("step 0/10")


@pytest.mark.parametrize(
    ("mode", "tty", "shown"),
    [
        (Progress.auto, True, True),
        (Progress.auto, False, False),
        (Progress.on, False, True),
        (Progress.off, True, False),
    ],
)
def test_progress_is_quiet_when_output_is_not_a_terminal(mode, tty, shown):
    assert use_progress(mode, tty) is shown


def test_stable_run_id_is_kept_in_the_run_directory(tmp_path):
    first = tracking.stable_run_id(str(tmp_path), create=True)
    assert len(first) == 8 and first.isalnum()
    assert tracking.stable_run_id(str(tmp_path), create=True) == first
    assert (tmp_path / tracking.RUN_ID_NAME).read_text().strip() == first
    assert tracking.stable_run_id(str(tmp_path / "dry"), create=False) != first
    assert not (tmp_path / "dry").exists()


def test_identity_group_is_the_sweep_and_tags_name_model_device_parallel(tmp_path):
    run = resolve("model=nki_moe", "device=cpu", "tracking=wandb", "tracking.tags=[mine,model:nki_moe]")
    sweep_dir = tmp_path / "multirun" / "2026-12-02" / "10-00-00"
    tracking.fill_identity(
        run, str(tmp_path), choices={"parallel": "cpu2"}, sweep_dir=str(sweep_dir), create=False
    )
    assert run.tracking.group == "sweep-2026-12-02_10-00-00"
    assert run.tracking.tags == ["model:nki_moe", "device:cpu", "parallel:cpu2", "mine"]
    pinned = resolve("tracking.run_id=abc", "tracking.group=mine")
    tracking.fill_identity(pinned, str(tmp_path), choices={}, sweep_dir=str(sweep_dir), create=True)
    assert (pinned.tracking.run_id, pinned.tracking.group) == ("abc", "mine")
    assert not (tmp_path / tracking.RUN_ID_NAME).exists()


@pytest.mark.parametrize(
    ("option", "wandb", "tensorboard"),
    [
        ("tracking=wandb", True, False),
        ("tracking=tensorboard", False, True),
        ("tracking=[wandb,tensorboard]", True, True),
        ("tracking=[tensorboard,wandb]", True, True),
        ("tracking=off", False, False),
    ],
)
def test_trackers_compose(option, wandb, tensorboard):
    run = resolve(option)
    assert (run.tracking.wandb, run.tracking.tensorboard) == (wandb, tensorboard)


def test_git_commit_names_head_or_is_empty_outside_git(tmp_path):
    commit = tracking.git_commit()
    assert len(commit.split("-")[0]) == 40
    assert tracking.git_commit(tmp_path) == ""


def test_the_run_plot_is_drawn_once_the_last_step_is_logged_and_redrawn_if_more_came(tmp_path):
    import time

    def log(step: int) -> None:
        with open(tmp_path / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "loss": 5.0 - step}) + "\n")

    plotter = report.RunPlotter(str(tmp_path), "run", total_steps=3)
    for step in (1, 2):
        log(step)
    time.sleep(4 * report.RunPlotter.POLL_S)
    assert not (tmp_path / "loss.png").exists()  # not before the last step
    log(3)
    deadline = time.time() + 30
    while not (tmp_path / "loss.png").exists():
        assert time.time() < deadline, "the plot was not drawn after the last step"
        time.sleep(0.05)
    drawn = (tmp_path / "loss.png").stat().st_mtime_ns
    assert plotter.finish() and (tmp_path / "loss.png").stat().st_mtime_ns == drawn  # not drawn twice

    late = report.RunPlotter(str(tmp_path), "run", total_steps=3)
    time.sleep(0.01)
    log(4)  # the metrics changed after the watcher could have drawn: finish draws the final file
    assert late.finish() and (tmp_path / "loss.png").stat().st_mtime_ns > drawn


def test_a_dpo_sweep_with_eval_returns_and_shows_held_out_accuracy(tmp_path):
    """objective=dpo with eval=on: the value a sweeper gets is the final held-out preference
    accuracy (the DPO loss scales with beta, so trials with other betas do not compare on it),
    job.json records it, and the summary gains its column; without DPO nothing changes."""
    from qwen3_trainium.parent import launcher

    run_dir = _fake_run(tmp_path / "r", num=0, status="ok", losses=[0.69, 0.4])
    with open(run_dir + "/" + report.METRICS_NAME, "a") as f:
        f.write(
            json.dumps({"step": 2, "time": 1010.0, "val_loss": 0.3, "val_rewards_accuracies": 0.75}) + "\n"
        )
    from conftest import compose_cfg

    assert launcher.objective(compose_cfg("objective=dpo", "eval=on"), run_dir) == 0.75
    assert launcher.objective(compose_cfg("objective=dpo"), run_dir) == 0.4  # no held-out pairs
    assert launcher.objective(compose_cfg("eval=on"), run_dir) == 0.3
    assert report.final_metrics(run_dir)["final_val_rewards_accuracies"] == 0.75
    row = report.run_row(run_dir, job=0)
    assert row["final_val_accuracy"] == 0.75 and "final_val_accuracy" in report.columns([row])
    plain = report.run_row(_fake_run(tmp_path / "s", num=1, status="ok", losses=[1.0]), job=1)
    assert "final_val_accuracy" not in report.columns([plain])


def test_the_dpo_beta_search_maximises_held_out_accuracy_over_dpo_trials():
    from conftest import CONF
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/sweeper=dpo_beta_search"], return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper.direction == "maximize" and sweeper.params["objective"] == "dpo"
    assert sweeper.params["eval"] == "on" and "objective.dpo.beta" in sweeper.params
