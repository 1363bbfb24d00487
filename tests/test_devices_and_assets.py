"""The CPU device module, the embedded assets and the metrics file."""

from __future__ import annotations

import json

import torch

from qwen3_trainium import devices, flavors, make_assets
from qwen3_trainium.metrics import JsonlLogger


def test_cpu_device_module_reports_peak_rss_and_resets_it():
    mod = devices.CpuDeviceModule()
    before = mod.memory_stats()["active_bytes.all.peak"]
    blob = torch.ones(64 * 1024 * 1024, dtype=torch.uint8)  # 64 MiB touched
    blob.add_(1)
    peak = mod.memory_stats()["active_bytes.all.peak"]
    assert peak >= before + 32 * 2**20
    del blob
    mod.reset_peak_memory_stats()
    assert mod.memory_stats()["active_bytes.all.peak"] < peak
    assert mod.current_device() == 0
    assert mod.get_device_properties().total_memory > 2**30
    assert mod.device_count() == 1  # falls through to torch.cpu


def test_detect_device_here_is_cpu():
    assert devices.detect_device_type() == "cpu"


def test_corpus_is_deterministic_and_shipped_tokenizer_covers_it():
    from tokenizers import Tokenizer

    docs = make_assets.make_corpus(num_docs=50)
    assert docs == make_assets.make_corpus(num_docs=50)
    shipped = [json.loads(line)["text"] for line in (make_assets.CORPUS_DIR / "train.jsonl").open()]
    assert shipped[:50] == docs
    tok = Tokenizer.from_file(str(make_assets.TOKENIZER_DIR / "tokenizer.json"))
    assert tok.get_vocab_size() <= flavors.vocab_size("tiny")
    text = shipped[0]
    assert tok.decode(tok.encode(text).ids) == text
    assert tok.token_to_id(make_assets.EOS) is not None


def test_tiny_flavor_is_a_few_million_parameters():
    from torchtitan.protocols.model_spec import ModelSpec

    spec = flavors.model_spec("tiny", "varlen")
    assert isinstance(spec, ModelSpec) and spec.name == "qwen3"
    with torch.device("meta"):
        model = spec.model.build()
    params = sum(p.numel() for p in model.parameters())
    assert 1_000_000 < params < 10_000_000


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
    from qwen3_trainium.metrics import neuron_driver_memory

    for chip, core, total, peak in ((0, 2, 3 * 2**30, 2**30), (0, 3, 2**30, 2**30)):
        base = tmp_path / f"neuron{chip}" / f"neuron_core{core}" / "stats" / "memory_usage" / "device_mem"
        base.mkdir(parents=True)
        (base / "total").write_text(f"{total}\n")
        (base / "peak").write_text(f"{peak}\n")
    got = neuron_driver_memory(local_rank=1, lnc=2, root=str(tmp_path))  # logical core 1 = physical 2, 3
    assert got == {"memory/neuron_driver_total(GiB)": 4.0, "memory/neuron_driver_peak(GiB)": 2.0}
    assert neuron_driver_memory(local_rank=0, lnc=2, root=str(tmp_path)) is None  # not readable: skipped
