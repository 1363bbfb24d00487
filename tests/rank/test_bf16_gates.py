"""The regime users run, on CPU: bfloat16 training (training.mixed_precision_param=bfloat16) over
two FSDP ranks. The export check and the samples check pass or fail there as in float32: an
honest export passes with its figure, a deliberately broken one fails the run (exit 3), and the
loss falls on all three model paths.

The breakages (``tests/support/broken_export.py``) are what a wrong key map or q/k/v split
writes: one layer's experts swapped in pairs, two query heads swapped. Measured on these models, each
moves the logits by 2e-2 to 5e-2, about what a bfloat16 forward's own error is (1.5e-2), which is
why both sides are compared in float32.
"""

from __future__ import annotations

import json

import pytest
from conftest import read_metrics, resolve, run_launch

from qwen3_trainium.parent import export_check, export_facts
from tests.support.broken_export import rewrite

BF16 = [
    "smoke=on",
    "parallel=cpu2",
    "training.mixed_precision_param=bfloat16",
    "checkpoint=hf_export",
    "tracking=off",
]
PATHS = {  # name -> its model overrides
    "native": ["model=native"],
    # AWS's SDK 2.34 MoE route: torchtitan's experts on torch._grouped_mm in bfloat16, as on Neuron
    "grouped_mm": ["model=native", "model.flavor=tiny_moe"],
    "nki_moe": ["model=nki_moe"],
    "hf": ["model=hf", "checkpoint.export_dtype=bfloat16"],  # the Hub's dtype: weights rounded on both sides
}
CHANGE = {
    "native": "swapped_query_heads",
    "hf": "swapped_query_heads",
    "nki_moe": "swapped_experts",
    "grouped_mm": "swapped_experts",
}


def _export_line(stdout: str) -> str:
    lines = [line for line in stdout.splitlines() if "] export round trip (" in line]
    assert len(lines) == 1, stdout[-3000:]
    return lines[0]


@pytest.mark.slow
def test_a_broken_export_fails_a_bfloat16_run_and_the_same_export_mended_passes(tmp_path):
    """nki_moe, layer 1's experts swapped in pairs in the written export: exit 3 with the figure.
    Oracle: the same swap again restores the export, and the same check on the same probe passes."""
    change = "tests.support.broken_export.swapped_experts"
    overrides = ["model=nki_moe", *BF16, f"override.imports=[{change}]", f"hydra.run.dir={tmp_path}"]
    proc = run_launch(*overrides)
    line = _export_line(proc.stdout)
    report = json.loads((tmp_path / "export_check.json").read_text())
    diff, tolerance = report["max_abs_logit_diff"], report["tolerance"]
    print(f"bfloat16 run, export with two experts swapped: {line.split('] ')[1]}")
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"max abs logit diff {diff:.3e} (float32 both sides, cpu) > {tolerance}: FAILED" in line
    assert tolerance == 1e-5 and diff > 100 * tolerance
    rewrite(report["export_dir"], "swapped_experts")  # swapped back
    passed, mended = export_check.verify(resolve(*overrides[:-1]), str(tmp_path))
    print(f"the same export mended: {mended}")
    assert passed and "<= 1e-05: OK" in mended


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    runs = {}

    def run(path):
        if path not in runs:
            run_dir = tmp_path_factory.mktemp(f"bf16-{path}") / "run"
            overrides = [*PATHS[path], *BF16, "eval=on"]
            runs[path] = (run_launch(*overrides, f"hydra.run.dir={run_dir}"), run_dir, overrides)
        return runs[path]

    return run


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("path", list(PATHS))
def test_bfloat16_smoke_learns_and_its_checks_gate(path, smoke):
    proc, run_dir, overrides = smoke(path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = _export_line(proc.stdout)
    report = json.loads((run_dir / "export_check.json").read_text())
    print(f"{path}, bfloat16: {line.split('] ')[1]}")
    assert (
        f"max abs logit diff {report['max_abs_logit_diff']:.3e} (float32 both sides, cpu) <= 1e-05: OK"
        in line
    )
    assert "identical to AutoModelForCausalLM.generate on the export" in proc.stdout
    record = json.loads((run_dir / "samples.json").read_text())
    assert (record["mixed_precision_param"], record["compute_dtype"]) == ("bfloat16", "float32")
    assert record["export"]["exact"] and all(s["generated_ids"] for s in record["samples"])
    losses = [row["loss"] for row in read_metrics(run_dir, merge=True)]
    print(f"{path}, bfloat16 losses: {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert len(losses) == 10 and losses[-1] < losses[0] - 1.0


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("path", list(PATHS))
def test_the_same_bfloat16_export_broken_after_the_run_fails_its_check(path, smoke, tmp_path):
    """Each path's honest bfloat16 export, broken after the run (``CHANGE``), fails the check on
    the same probe; broken back, it passes again."""
    proc, run_dir, overrides = smoke(path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = resolve(*overrides)
    export = json.loads((run_dir / "export_check.json").read_text())["export_dir"]
    rewrite(export, CHANGE[path])
    passed, line = export_check.verify(run, str(run_dir))
    print(f"{path}, bfloat16, {CHANGE[path]}: {line}")
    assert not passed and "FAILED" in line
    rewrite(export, CHANGE[path])
    assert export_check.verify(run, str(run_dir))[0]


@pytest.mark.slow
@pytest.mark.heavy
def test_under_tensor_parallel_the_probe_and_the_samples_are_the_whole_models(tmp_path):
    """Tensor parallel 2 (AWS's Qwen3-30B-A3B layout is TP 4 x FSDP 16), bfloat16. torchtitan's
    lm_head is vocab-parallel (each rank's logits are its slice of the vocabulary) and its
    embedding is reduced only inside the trainer's SPMD context: before, the check compared a
    slice with the whole (512 vs 256 columns), and outside that context the logits were 3.9 off."""
    tp2 = ["parallel.tensor_parallel_degree=2", "parallel.data_parallel_shard_degree=1"]
    proc = run_launch("model=native", *BF16, *tp2, "eval=on", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = _export_line(proc.stdout)
    print(f"native, bfloat16, tensor parallel 2: {line.split('] ')[1]}")
    assert "(float32 both sides, cpu) <= 1e-05: OK" in line
    assert "identical to AutoModelForCausalLM.generate on the export" in proc.stdout


def test_on_neuron_the_check_needs_the_compiler_to_keep_float32_matmuls():
    """neuronx-cc casts float32 matmuls to bfloat16 unless --auto-cast none (AWS's mixed precision
    guide): a probe computed so carries a bfloat16 error, and the check says so and fails."""
    assert export_facts.cast_matmuls("cpu", "") is None and export_facts.cast_matmuls("cuda", "") is None
    for flags in ("--auto-cast=none", "--model-type transformer --auto-cast none --verbose=info"):
        assert export_facts.cast_matmuls("neuron", flags) is None, flags
    for flags in ("", "--auto-cast=matmult", "--auto-cast-type=fp8_e4m3"):
        why = export_facts.cast_matmuls("neuron", flags)
        assert f"NEURON_CC_FLAGS={flags!r}" in why and "NEURON_CC_FLAGS='--auto-cast=none'" in why
