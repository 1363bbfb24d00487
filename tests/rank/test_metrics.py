"""The metrics file and the Neuron driver's memory counters."""

from __future__ import annotations

import json

from qwen3_trainium.rank.metrics import JsonlLogger


def test_jsonl_logger_writes_one_row_per_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = JsonlLogger(str(path), report_mfu=False)
    log.log({"loss_metrics/global_avg_loss": 2.5, "throughput(tps)": 100.0, "mfu(%)": 1.0}, step=1)
    log.log({"loss_metrics/global_avg_loss": 2.0, "grad_norm": 1.0}, step=2)
    log.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["loss"] == 2.5 and rows[0]["tokens_per_second"] == 100.0
    assert "mfu_pct" not in rows[0]


def test_neuron_driver_memory_reads_the_ranks_physical_cores(tmp_path):
    from qwen3_trainium.rank.metrics import neuron_driver_memory

    for chip, core, total, peak in ((0, 2, 3 * 2**30, 2**30), (0, 3, 2**30, 2**30)):
        base = tmp_path / f"neuron{chip}" / f"neuron_core{core}" / "stats" / "memory_usage" / "device_mem"
        base.mkdir(parents=True)
        (base / "total").write_text(f"{total}\n")
        (base / "peak").write_text(f"{peak}\n")
    got = neuron_driver_memory(local_rank=1, lnc=2, root=str(tmp_path))  # logical core 1 = physical 2, 3
    assert got == {"memory/neuron_driver_total(GiB)": 4.0, "memory/neuron_driver_peak(GiB)": 2.0}
    assert neuron_driver_memory(local_rank=0, lnc=2, root=str(tmp_path)) is None  # not readable: skipped
