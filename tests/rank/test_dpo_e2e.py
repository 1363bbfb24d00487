"""objective=dpo end to end (``python launch.py objective=dpo ...``): the smoke run learns the
preferences, the precomputed reference table is computed once and then reused (by a second run
and by a resume, which without it is refused, and ends where an uninterrupted run ends), and LoRA's reference is its own base with the
adapters off, with no copy of the model. Each run trains on the first 40 pairs of the shipped
corpus, copied to a writable folder: the table is written beside them (``.ref_logps``)."""

from __future__ import annotations

import os
import re
import statistics

import pytest
import torch
from conftest import launch_killed_after, read_metrics, run_launch

from qwen3_trainium.data import assets

DPO = ["objective=dpo", "smoke=on", "tracking=off"]
COMPUTED = re.compile(r"reference log-probs: computed (\d+) pairs in [\d.]+ s, (\S+)")
REUSED = re.compile(r"reference log-probs: reused (\S+)")


def _pairs(tmp_path, n: int = 40):
    data = tmp_path / "pairs"
    data.mkdir(parents=True)
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


@pytest.mark.heavy  # five launches: about 3 minutes on 2 cores
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
    # killed just after step 5's save (computing nothing: the table exists), then resumed
    launch_killed_after(tmp_path / "resumed" / "checkpoint" / "step-5", *DPO, *resume, where)
    _, log = _run(*resume, where)
    assert "Training starts at step 6" in log and REUSED.search(log) and not COMPUTED.search(log)
    assert [r["step"] for r in read_metrics(tmp_path / "resumed")][-1] == 10
    # the resume is exact: step 10 as the uninterrupted second run logged it (DPO loss, TRL's figures)
    final = {name: read_metrics(tmp_path / name)[-1] for name in ("second", "resumed")}
    for key in ("loss", "rewards_chosen", "rewards_rejected", "rewards_margins", "logps_chosen"):
        assert final["resumed"][key] == pytest.approx(final["second"][key], rel=1e-5, abs=1e-5), key

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


def _perturbed(tiny, folder):
    """The tiny checkpoint + 0.02 N(0, 1) (seed 0) on every weight, with the tiny's tokenizer
    files (the same data identity): a policy that is not its reference."""
    import shutil

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny / name, folder / name)
    return folder


@pytest.mark.heavy  # three launches: about a minute and a half on 2 cores
def test_a_reference_path_gives_the_reference_and_the_policy_keeps_its_weights(tmp_path):
    """objective.dpo.reference_path: the pre-pass runs that checkpoint's weights (its table equals
    the one a run starting from it computes) and training then runs the policy's own (its step-1
    log-probs equal those of a run that starts from the policy with no reference_path)."""
    from qwen3_trainium.rank.dpo_reference import ReferenceTable

    tiny = assets.ensure_hf_model()
    policy = _perturbed(tiny, tmp_path / "policy")
    one = ["training.steps=1", "lr_scheduler.warmup_steps=1", "checkpoint=hf_finetune"]
    starts = {
        "tiny": [f"checkpoint.initial_load_path={tiny}"],
        "policy_vs_tiny": [f"checkpoint.initial_load_path={policy}", f"objective.dpo.reference_path={tiny}"],
        "policy": [f"checkpoint.initial_load_path={policy}"],
    }
    tables, step1 = {}, {}
    for name, start in starts.items():
        data = _pairs(tmp_path / name)  # a data folder each: every run computes its table
        _, log = _run(*one, *start, f"data.dataset_path={data}", f"hydra.run.dir={tmp_path / name / 'run'}")
        tables[name] = COMPUTED.search(log).group(2)
        step1[name] = read_metrics(tmp_path / name / "run")[0]
    # keyed by the reference's weights, whoever names them
    assert os.path.basename(tables["tiny"]) == os.path.basename(tables["policy_vs_tiny"])
    assert os.path.basename(tables["policy"]) != os.path.basename(tables["tiny"])
    ref, got = ReferenceTable.load(tables["tiny"]), ReferenceTable.load(tables["policy_vs_tiny"])
    assert torch.allclose(got.chosen, ref.chosen, rtol=0, atol=1e-4) and got.present.all()
    assert torch.allclose(got.rejected, ref.rejected, rtol=0, atol=1e-4)
    assert step1["policy_vs_tiny"]["logps_chosen"] == pytest.approx(step1["policy"]["logps_chosen"], rel=1e-6)
    assert step1["policy"]["rewards_margins"] == 0.0 and step1["policy_vs_tiny"]["rewards_margins"] != 0.0


@pytest.mark.heavy  # one launch: about 15 s on 2 cores
def test_the_pre_pass_leaves_the_expert_load_counts_alone(tmp_path):
    """A MoE model counts its tokens per expert in training mode (torchtitan's MoE.forward): the
    pre-pass, in eval mode, adds none. Over 2 steps of one row of 256 positions and top-2 routing
    each layer counts 2 x 256 x 2 = 1024 assignments (padding included), not the pre-pass's
    rows as well."""
    import json

    data = _pairs(tmp_path)
    _, log = _run(
        "model=nki_moe", "training.steps=2", f"data.dataset_path={data}", f"hydra.run.dir={tmp_path / 'run'}"
    )
    assert COMPUTED.search(log)
    load = json.loads((tmp_path / "run" / "expert_load.json").read_text())
    assert (load["first_step"], load["step"], load["top_k"]) == (1, 2, 2)
    assert [sum(layer) for layer in load["tokens_per_expert"]] == [2 * 256 * 2] * len(load["layers"])
