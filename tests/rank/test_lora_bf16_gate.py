"""peft=lora in bfloat16 (training.mixed_precision_param=bfloat16) over two FSDP ranks: the export
check on the PEFT adapter (the base from ``base_model_name_or_path`` with each adapter folded in,
``parent/export_check.py``) gates as on a full export. An honest adapter passes (exit 0) with its
figure; one whose layer-1 k_proj and v_proj adapters trade places after it is written, as a
wrong key map would write them (``tests/support/broken_adapter.py``), fails the run (exit 3).
"""

from __future__ import annotations

import json

import pytest
from conftest import resolve, run_launch

from qwen3_trainium.data import assets
from qwen3_trainium.parent import export_check
from tests.rank.test_bf16_gates import _export_line
from tests.support.broken_adapter import rewrite

BROKEN = "tests.support.broken_adapter.swapped_kv_adapters"


def _lora_bf16(tmp_path, *extra: str) -> list[str]:
    return [
        "model=native",
        "smoke=on",
        "parallel=cpu2",
        "tracking=off",
        "peft=lora",
        "training.mixed_precision_param=bfloat16",
        "checkpoint=[hf_finetune,hf_export]",
        f"checkpoint.initial_load_path={assets.ensure_hf_model()}",
        *extra,
        f"hydra.run.dir={tmp_path}",
    ]


def _launch(overrides: list[str], tmp_path, label: str) -> tuple:
    proc = run_launch(*overrides)
    line = _export_line(proc.stdout)
    report = json.loads((tmp_path / "export_check.json").read_text())
    print(f"lora, bfloat16, {label}: {line.split('] ')[1]}")
    assert report["export_dir"] == str(tmp_path / "checkpoint" / "step-10-adapter")
    assert "the base + this PEFT adapter" in line and report["tolerance"] == 1e-5
    return proc, line, report


@pytest.mark.slow
@pytest.mark.heavy
def test_an_honest_bfloat16_lora_adapter_passes_its_check(tmp_path):
    proc, line, report = _launch(_lora_bf16(tmp_path), tmp_path, "honest adapter")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (
        f"max abs logit diff {report['max_abs_logit_diff']:.3e} (float32 both sides, cpu) <= 1e-05: OK"
        in line
    )


@pytest.mark.slow
@pytest.mark.heavy
def test_a_bfloat16_lora_adapter_with_k_and_v_swapped_fails_the_run_and_mended_passes(tmp_path):
    """Oracle for the break: the same swap again restores the adapter the ranks wrote, and the
    same check on the same probe then passes."""
    overrides = _lora_bf16(tmp_path, f"override.imports=[{BROKEN}]")
    proc, line, report = _launch(overrides, tmp_path, "k_proj/v_proj adapters of layer 1 swapped")
    diff, tolerance = report["max_abs_logit_diff"], report["tolerance"]
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"max abs logit diff {diff:.3e} (float32 both sides, cpu) > {tolerance}: FAILED" in line
    assert diff > 100 * tolerance
    rewrite(report["export_dir"], "swapped_kv_adapters")  # swapped back
    passed, mended = export_check.verify(resolve(*overrides[:-1]), str(tmp_path))
    print(f"lora, bfloat16, the same adapter mended: {mended}")
    assert passed and "<= 1e-05: OK" in mended
