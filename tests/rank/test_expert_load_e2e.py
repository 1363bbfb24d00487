"""Expert load end to end (launch.py -> torchrun -> torchtitan on CPU): a tiny MoE run writes its
``moe_*`` figures to metrics.jsonl, ``expert_load.json`` and ``expert_load.png`` to the run
directory, with counts that match the hand oracle: every token goes to top_k experts of every
MoE layer, so a layer's assignments per step are top_k x seq_len x local batch x data-parallel
ranks, whatever activation checkpointing recomputes."""

from __future__ import annotations

import json

import pytest
from conftest import read_metrics, run_launch
from PIL import Image

pytestmark = pytest.mark.heavy

TOP_K, EXPERTS, LAYERS, SEQ = 2, 8, 4, 256  # tiny_moe (config/flavors.py), smoke=on's seq_len
STEPS = 2
KEYS = {"moe_load_max_over_mean", "moe_load_entropy", "moe_experts_zero_tokens", "moe_assignments_per_layer"}


def _check(run_dir, ranks: int) -> None:
    per_step = TOP_K * SEQ * 1 * ranks  # local_batch_size 1, ranks: data-parallel shards
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for row in rows:
        assert KEYS <= row.keys()
        assert row["moe_assignments_per_layer"] == per_step
        assert 1.0 <= row["moe_load_max_over_mean"] <= EXPERTS and 0.0 < row["moe_load_entropy"] <= 1.0
    data = json.loads((run_dir / "expert_load.json").read_text())
    assert (data["layers"], data["num_experts"], data["top_k"]) == (list(range(LAYERS)), EXPERTS, TOP_K)
    assert (data["first_step"], data["step"]) == (1, STEPS)
    assert [sum(layer) for layer in data["tokens_per_expert"]] == [per_step * STEPS] * LAYERS
    zero = sum(c == 0 for layer in data["tokens_per_expert"] for c in layer)
    assert rows[-1]["moe_experts_zero_tokens"] >= 0 and zero <= min(
        r["moe_experts_zero_tokens"] for r in rows
    )
    with Image.open(run_dir / "expert_load.png") as image:
        image.verify()  # a whole PNG
        assert image.format == "PNG"


# overrides -> data-parallel shards (context and tensor parallel ranks share one shard's tokens:
# CP splits its sequence, TP with sequence parallel splits its tokens, each counted once)
CASES = {
    "native_full_ac_one_rank": (
        ["model=native", "model.flavor=tiny_moe", "activation_checkpoint.mode=full"],
        1,
    ),
    "nki_moe_selective_ac_dp2": (
        ["model=nki_moe", "parallel=cpu2", "activation_checkpoint.mode=selective"],
        2,
    ),
    "native_cp2": (["model=native", "model.flavor=tiny_moe", "parallel=cpu2_cp2"], 1),
    "native_tp2_sequence_parallel": (
        [
            "model=native",
            "model.flavor=tiny_moe",
            "parallel=cpu2",
            "parallel.tensor_parallel_degree=2",
            "parallel.data_parallel_shard_degree=1",
        ],
        1,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_moe_run_writes_counts_that_match_top_k_times_tokens(tmp_path, case):
    overrides, shards = CASES[case]
    run_dir = tmp_path / "run"
    proc = run_launch(
        *overrides, "smoke=on", "tracking=off", f"training.steps={STEPS}", f"hydra.run.dir={run_dir}"
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _check(run_dir, ranks=shards)
