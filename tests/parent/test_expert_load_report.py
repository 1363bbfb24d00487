"""The expert-load heatmap of a run (``expert_load.png`` beside ``loss.png``) and of a sweep
(summary.md's section, the ``max_load`` / ``zero_experts`` columns), from hand-made
``expert_load.json`` records; a dense run gets neither."""

from __future__ import annotations

import csv
import json

from PIL import Image

from qwen3_trainium.parent import expert_plot, report, sweep

# layer 0: even (max/mean 1); layer 2: expert 0 takes 6 of 8, experts 2 and 3 none (max/mean 3)
LOAD = {
    "layers": [0, 2],
    "num_experts": 4,
    "top_k": 2,
    "first_step": 1,
    "step": 2,
    "tokens_per_expert": [[4, 4, 4, 4], [6, 2, 0, 0]],
}


def _run(run_dir, num: int, load: dict | None):
    run_dir.mkdir(parents=True)
    report.update_job(str(run_dir), job_num=num, overrides=[f"job={num}"], total_steps=2, status="ok")
    with open(run_dir / report.METRICS_NAME, "w") as f:
        for step in (1, 2):
            f.write(json.dumps({"step": step, "time": 1.0 + step, "loss": 6.0 - step}) + "\n")
    if load is not None:
        (run_dir / "expert_load.json").write_text(json.dumps(load))
    return str(run_dir)


def test_plot_run_draws_the_heatmap_beside_the_loss_plot(tmp_path):
    run_dir = _run(tmp_path / "moe", 0, LOAD)
    assert report.plot_run(run_dir, "moe")
    with Image.open(tmp_path / "moe" / "expert_load.png") as image:
        image.verify()
        assert image.format == "PNG"
    assert (tmp_path / "moe" / "loss.png").is_file()


def test_a_dense_run_has_no_heatmap_and_no_columns(tmp_path):
    run_dir = _run(tmp_path / "dense", 0, None)
    assert report.plot_run(run_dir, "dense")
    assert not (tmp_path / "dense" / "expert_load.png").exists()
    row = report.run_row(run_dir)
    assert report.columns([row]) == report.COLUMNS
    assert "max_load" not in report.markdown_table([row])


def test_run_row_reads_max_load_and_zero_experts(tmp_path):
    row = report.run_row(_run(tmp_path / "moe", 0, LOAD))
    assert (row["max_load"], row["zero_experts"]) == (3.0, 2)  # 6 against a mean of 2; two zeros


def test_sweep_summary_embeds_each_moe_jobs_heatmap_and_its_columns(tmp_path):
    sweep_dir = tmp_path / "sweep"
    _run(sweep_dir / "0", 0, LOAD)
    _run(sweep_dir / "1", 1, None)  # a dense job in the same sweep: "-" cells, no heatmap
    rows, table = sweep.summarize(str(sweep_dir))
    assert "| max_load | zero_experts |" in table
    assert "| 3.0 | 2 |" in table and table.rstrip().endswith("| - | - |")
    md = (sweep_dir / "summary.md").read_text()
    assert "![expert load of job 0](0/expert_load.png)" in md and "1/expert_load.png" not in md
    assert (sweep_dir / "0" / "expert_load.png").is_file()  # drawn for the summary when missing
    with open(sweep_dir / "summary.csv") as f:
        first = next(csv.DictReader(f))
    assert (first["max_load"], first["zero_experts"]) == ("3.0", "2")
    assert expert_plot.MOE_COLUMNS == ("max_load", "zero_experts")
