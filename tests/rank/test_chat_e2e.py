"""data=chat end to end: the smoke run trains and previews, packed and unpacked rows give the same
step-1 loss, bad chat input is refused before anything starts, held-out chat loss, resume."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from conftest import ROOT, launch_killed_after, read_metrics, resolve, run_launch

from qwen3_trainium.data import assets
from qwen3_trainium.data.chat import source

CHAT = ["data=chat", "smoke=on", "tracking=off"]


def test_chat_smoke_trains_and_writes_the_preview(tmp_path):
    proc = run_launch("model=native", *CHAT, "data.preview=4", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = [r["loss"] for r in read_metrics(tmp_path)]
    assert len(losses) == 10 and losses[-1] < losses[0] - 1.0, losses
    rows = [json.loads(line) for line in open(tmp_path / "data_preview.jsonl")]
    assert len(rows) == 4
    for row in rows:
        assert set(row) == {"input_ids", "labels", "positions"}
        assert len(row["input_ids"]) == len(row["labels"]) == len(row["positions"]) == 256
        assert -100 in row["labels"] and any(label >= 0 for label in row["labels"])
    md = (tmp_path / "data_preview.md").read_text()
    assert md.count("## Row") == 4 and "⟦" in md
    assert "chat data: 600 records: 600 samples" in proc.stdout


@pytest.mark.heavy  # 45 s: make test stays near 20 minutes; CI runs it with make test-heavy
def test_packed_and_unpacked_training_give_the_same_step_1_loss(tmp_path):
    """Step 1 packed: one row of k samples; unpacked: the same k samples one per row, as a batch
    of k rows or as k micro-batches of one (gradient accumulation). The loss is the summed loss over
    every supervised token divided by their global count (torchtitan's global_valid_tokens), not a
    mean of per-row or per-micro-batch means, so all three must agree."""
    k = source.preview_rows(resolve("data=chat", "smoke=on"), 1)[0].documents
    assert k >= 2
    common = ["model=native", *CHAT, "training.steps=1", "lr_scheduler.warmup_steps=1", "debug.seed=0"]
    runs = {
        "packed": [],
        "unpacked": ["data.packing=false", f"training.local_batch_size={k}"],
        "accumulated": [
            "data.packing=false",
            "training.local_batch_size=1",
            f"training.global_batch_size={k}",
        ],
    }
    losses = {}
    for name, extra in runs.items():
        proc = run_launch(*common, *extra, f"hydra.run.dir={tmp_path / name}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        losses[name] = read_metrics(tmp_path / name)[0]["loss"]
    spread = max(losses.values()) - min(losses.values())
    print(
        f"step-1 loss ({k} samples): "
        + ", ".join(f"{n} {v:.8f}" for n, v in losses.items())
        + f"; spread {spread:.2e}"
    )
    assert spread <= 1e-5


def test_dry_run_prints_the_chat_counts(dry_run, tmp_path):
    (status, code), out, err = dry_run(ROOT, tmp_path, *CHAT, "eval=on")
    assert (status, code) == ("dry_run", 0), err
    assert "chat data: 600 records: 600 samples" in out and "supervised (" in out
    assert "longer than seq_len: 0 dropped, 0 truncated" in out and "% of positions are tokens" in out
    assert "chat data, held out: 60 records" in out


def _no_template_tokenizer(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(assets.TOKENIZER_DIR / name, tok / name)
    return tok


@pytest.mark.parametrize(
    "overrides, key, words",
    [
        (["data.hf_assets_path={tok}"], "data.hf_assets_path", "data.chat_template=<"),
        (["data.dataset_path={tmp}/none.jsonl"], "data.dataset_path", "does not exist"),
        (["data.dataset_path={tmp}/bad.jsonl"], "data.dataset_path", "no known chat format"),
        (["model.attn_backend=causal"], "model.attn_backend", "data.packing=false"),
        (
            ["data.history_thinking=keep", "data.loss_on=all"],
            "data.history_thinking",
            "data.loss_on=assistant",
        ),
    ],
)
def test_bad_chat_input_is_refused_before_anything_starts(overrides, key, words, tmp_path, dry_run):
    tok = _no_template_tokenizer(tmp_path)
    (tmp_path / "bad.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n{"question": "x"}\n'
    )
    args = [o.format(tok=tok, tmp=tmp_path) for o in overrides]
    (status, code), out, err = dry_run(ROOT, tmp_path / "run", "model=native", *CHAT, *args)
    assert (status, code) == ("failed", 2)
    assert f"- {key} = " in err and words in err, err
    assert "Traceback" not in err + out
    if "bad.jsonl" in args[0]:
        assert "bad.jsonl:2" in err and "keys found: ['question']" in err


def test_eval_on_scores_held_out_chat_and_samples_through_the_template(tmp_path):
    proc = run_launch("model=native", *CHAT, "eval=on", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = read_metrics(tmp_path, merge=True)[-1]
    assert "val_loss" in last and last["val_loss"] < 6.5
    record = json.loads((tmp_path / "samples.json").read_text())
    assert record["chat_template"].endswith("chat_template.jinja")
    tok = source.tokenizer(resolve("data=chat"))
    assert record["samples"][0]["prompt_ids"] == tok.prompt_ids("What is the capital of France?")
    assert tok.end_of_turn_id in record["eos_ids"]


@pytest.mark.slow
@pytest.mark.heavy
def test_kill_and_resume_mid_epoch_is_exact_on_chat_data(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    resume = ["model=native", *CHAT, "checkpoint=resume", "checkpoint.interval=10", "training.steps=30"]
    proc = run_launch(*resume, f"hydra.run.dir={straight}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    launch_killed_after(killed / "checkpoint" / "step-10", *resume, f"hydra.run.dir={killed}")
    again = run_launch(*resume, f"hydra.run.dir={killed}")
    assert again.returncode == 0, again.stderr[-3000:]
    losses = {d.name: {r["step"]: r["loss"] for r in read_metrics(d)} for d in (straight, killed)}
    diffs = [abs(losses["straight"][s] - losses["killed"][s]) for s in range(11, 31)]
    print(f"chat resume: steps 11-30 max |loss diff| {max(diffs):.2e}; final {losses['killed'][30]:.6f}")
    assert max(diffs) <= 1e-5


GENERATE = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
export, record = sys.argv[1], json.load(open(sys.argv[2]))
tok = AutoTokenizer.from_pretrained(export)
model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
out = []
eos = record["eos_ids"]
for sample in record["samples"]:
    chat = [{"role": "user", "content": sample["prompt"]}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = ids["input_ids"]
    seq = model.generate(ids, max_new_tokens=sample["max_new_tokens"], do_sample=False, eos_token_id=eos,
                         pad_token_id=eos[0])
    out.append({"prompt_ids": ids[0].tolist(), "generated_ids": seq[0, ids.shape[1]:].tolist()})
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize("model", ["hf", "native", "nki_moe"])
def test_each_path_fine_tunes_an_hf_directory_on_chat_and_its_export_answers_through_the_template(
    model, tmp_path
):
    """The README's recipe: chat fine-tune from an HF directory, HF export, then Transformers'
    generate on the export with the export's own chat template gives the ranks' greedy answer,
    every id of it, for every prompt (same token budget, same EOS ids)."""
    source_dir = {
        "hf": assets.ensure_hf_model(),
        "native": assets.ensure_hf_model(),
        "nki_moe": assets.ensure_hf_moe_model(),
    }[model]
    if model == "hf":
        start = ["checkpoint=hf_export", f"model.hf_model={source_dir}"]
    else:
        start = ["checkpoint=[hf_finetune,hf_export]", f"checkpoint.initial_load_path={source_dir}"]
    proc = run_launch(f"model={model}", *CHAT, "eval=on", *start, f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "samples: " in proc.stdout
    export = tmp_path / "checkpoint" / "step-10"
    assert (export / "chat_template.jinja").is_file()
    record = json.loads((tmp_path / "samples.json").read_text())
    out = subprocess.run(
        [os.sys.executable, "-c", GENERATE, str(export), str(tmp_path / "samples.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    hf = json.loads(out.stdout.strip().splitlines()[-1])
    for ours, theirs in zip(record["samples"], hf, strict=True):
        assert theirs["prompt_ids"] == ours["prompt_ids"], (
            "the export's template renders the prompt as training did"
        )
        assert ours["generated_ids"] and theirs["generated_ids"] == ours["generated_ids"], ours["prompt"]
