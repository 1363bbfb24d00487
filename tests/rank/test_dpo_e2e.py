"""objective=dpo end to end (``python launch.py objective=dpo ...``): the smoke run learns the
preferences, the precomputed reference table is computed once and then reused (by a second run
and by a resume, which without it is refused), and LoRA's reference is its own base with the
adapters off, with no copy of the model. Each run trains on the first 40 pairs of the shipped
corpus, copied to a writable folder: the table is written beside them (``.ref_logps``)."""

from __future__ import annotations

import os
import re
import statistics

import pytest
from conftest import read_metrics, run_launch

from qwen3_trainium.data import assets

DPO = ["objective=dpo", "smoke=on", "tracking=off"]
COMPUTED = re.compile(r"reference log-probs: computed (\d+) pairs in [\d.]+ s, (\S+)")
REUSED = re.compile(r"reference log-probs: reused (\S+)")


def _pairs(tmp_path, n: int = 40):
    data = tmp_path / "pairs"
    data.mkdir()
    for split, count in (("train", n), ("validation", n // 4)):
        lines = (assets.PREFERENCE_DIR / f"{split}.jsonl").read_text().splitlines(keepends=True)[:count]
        (data / f"{split}.jsonl").write_text("".join(lines))
    return data


def _run(*args: str):
    proc = run_launch(*DPO, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, proc.stdout + proc.stderr


@pytest.mark.slow  # one launch: about 40 s on 2 cores
def test_dpo_smoke_learns_the_preferences(tmp_path):
    """rewards/accuracies (TRL's: chosen reward > rejected reward, strict) over the last 3 steps
    above the first 3: step 1's reference is the policy itself (every reward 0, accuracy 0). With
    eval=on, the held-out pairs' table is computed at the same boundary and the held-out DPO loss
    is the run's val_loss."""
    data = _pairs(tmp_path)
    held_out = ["eval=on", "eval.sample_tokens=0"]
    proc, log = _run(f"data.dataset_path={data}", *held_out, f"hydra.run.dir={tmp_path / 'run'}")
    computed = COMPUTED.findall(log)
    assert [n for n, _ in computed] == ["40", "10"], log[-3000:]  # train, then held out
    assert {os.path.dirname(path) for _, path in computed} == {str(data / ".ref_logps")}
    rows = read_metrics(tmp_path / "run")
    accuracies = [r["rewards_accuracies"] for r in rows if "rewards_accuracies" in r]
    assert len(accuracies) == 10 and rows[0]["rewards_margins"] == 0.0
    first, last = statistics.mean(accuracies[:3]), statistics.mean(accuracies[-3:])
    print(f"DPO smoke: rewards/accuracies {accuracies}; first 3 {first:.3f}, last 3 {last:.3f}")
    assert last > first
    held = re.search(
        r"validation: DPO loss ([\d.]+), rewards/accuracies [\d.]+ over (\d+) held-out pairs", log
    )
    assert held and int(held.group(2)) > 0
    assert [r["val_loss"] for r in rows if "val_loss" in r] == [pytest.approx(float(held.group(1)), abs=1e-4)]


@pytest.mark.heavy  # four launches: about 3 minutes on 2 cores
def test_the_reference_table_is_reused_by_a_second_run_and_a_resume_and_its_loss_refused(tmp_path):
    data = _pairs(tmp_path)
    _, log = _run(f"data.dataset_path={data}", f"hydra.run.dir={tmp_path / 'first'}")
    path = COMPUTED.search(log).group(2)
    written = os.stat(path).st_mtime_ns

    _, log = _run(f"data.dataset_path={data}", f"hydra.run.dir={tmp_path / 'second'}")
    reused = REUSED.search(log)
    assert reused and reused.group(1) == path and not COMPUTED.search(log), log[-3000:]
    assert os.stat(path).st_mtime_ns == written

    resume = [f"data.dataset_path={data}", "checkpoint=resume", "checkpoint.interval=5"]
    where = f"hydra.run.dir={tmp_path / 'resumed'}"
    _run(*resume, "training.steps=5", where)  # computes nothing: the table exists
    _, log = _run(*resume, "training.steps=10", where)
    assert "Training starts at step 6" in log and REUSED.search(log) and not COMPUTED.search(log)
    assert [r["step"] for r in read_metrics(tmp_path / "resumed")][-1] == 10

    os.remove(path)  # the table lost: the trained weights cannot stand in for the reference
    proc = run_launch(*DPO, *resume, "training.steps=15", where)
    out = proc.stdout + proc.stderr  # refused by pre-flight (the ranks would refuse too)
    assert proc.returncode != 0 and "nothing was started" in out
    assert f"restore {path}, or start from step 0" in out


PARAMS = re.compile(r"size: ([\d,]+) total parameters")
TRAINABLE = re.compile(r"peft=lora: ([\d,]+) trainable parameters of ([\d,]+)")


@pytest.mark.heavy  # two launches: about a minute and a half on 2 cores
def test_lora_dpo_takes_its_reference_from_the_adapters_off_with_no_copy(tmp_path):
    data = _pairs(tmp_path)
    _, sft = _run("objective=sft", "data=chat", "peft=lora", f"hydra.run.dir={tmp_path / 'sft'}")
    _, dpo = _run(f"data.dataset_path={data}", "peft=lora", f"hydra.run.dir={tmp_path / 'dpo'}")
    assert PARAMS.findall(dpo) == PARAMS.findall(sft) and PARAMS.findall(dpo)  # the model alone
    assert TRAINABLE.findall(dpo) == TRAINABLE.findall(sft) and TRAINABLE.findall(dpo)  # LoRA's
    assert not COMPUTED.search(dpo) and not REUSED.search(dpo) and not (data / ".ref_logps").exists()
    rows = read_metrics(tmp_path / "dpo")
    # lora_b starts at 0: at step 1 the policy is its base, every reward 0; then the adapters
    # train and the rewards move, which they would not were the reference the policy itself
    assert rows[0]["rewards_chosen"] == rows[0]["rewards_rejected"] == 0.0
    assert all(r["rewards_margins"] != 0.0 for r in rows[1:])
