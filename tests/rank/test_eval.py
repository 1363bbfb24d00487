"""eval=on: held-out records, val_loss / val_perplexity in every record, sweeps on val_loss."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from conftest import read_metrics, resolve, run_launch

from qwen3_trainium.data import assets, heldout
from qwen3_trainium.parent import preflight, progress, report
from qwen3_trainium.parent.preflight.heldout import check_heldout
from qwen3_trainium.rank import titan

CORPUS = str(assets.CORPUS_DIR)


def _jsonl(path: Path, texts: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def test_the_fraction_holds_out_exactly_floor_n_f_records_spread_evenly():
    for n, f in ((100, 0.05), (37, 0.1), (10, 0.5), (7, 0.2)):
        held = [i for i in range(n) if heldout.heldout(i, f)]
        assert len(held) == int(n * f)
        assert all(b - a >= int(1 / f) - 1 for a, b in zip(held, held[1:], strict=False))


def test_the_shipped_corpus_has_a_validation_split_disjoint_from_training():
    train = {json.loads(line)["text"] for line in open(os.path.join(CORPUS, "train.jsonl"))}
    held = [json.loads(line)["text"] for line in open(os.path.join(CORPUS, "validation.jsonl"))]
    assert len(held) > 1000 and not train & set(held)
    assert held == assets.make_validation(assets.make_corpus())  # regenerated, the same
    src = heldout.source(resolve("eval=on"))
    assert (src.kind, src.val_dataset, src.val_path) == ("split", heldout.VALIDATION_DATASET, CORPUS)
    assert (src.train_dataset, src.train_path) == ("c4_test", CORPUS)  # training reads split "train"


def test_each_data_source_picks_its_held_out_records(tmp_path):
    plain = tmp_path / "plain"
    _jsonl(plain / "a.jsonl", [f"record {i}" for i in range(40)])
    src = heldout.source(resolve("eval=on", "data=local", f"data.dataset_path={plain}"))
    assert src.kind == "fraction" and src.train_dataset.startswith(heldout.TRAIN_PREFIX)
    src = heldout.source(
        resolve(
            "eval=on", "data=local", f"data.dataset_path={plain}", f"data.validation_path={plain}/a.jsonl"
        )
    )
    assert (src.kind, src.val_path, src.train_dataset) == ("path", f"{plain}/a.jsonl", "c4_test")
    src = heldout.source(resolve("eval=on", "data=hf_hub"))
    assert (src.kind, src.val_dataset) == ("hub", "c4_validation")  # torchtitan's own
    src = heldout.source(resolve("eval=on", "data=hf_hub", "data.dataset_path=someone/corpus"))
    assert (src.kind, src.val_dataset, src.val_path) == (
        "hub",
        heldout.HUB_VALIDATION_DATASET,
        "someone/corpus",
    )


def test_with_a_fraction_training_never_reads_a_held_out_record(tmp_path):
    from torchtitan.hf_datasets.text_datasets import DATASETS

    corpus = tmp_path / "c"
    texts = [f"record number {i}" for i in range(60)]
    _jsonl(corpus / "part.jsonl", texts)
    run = resolve("eval=on", "data=local", f"data.dataset_path={corpus}", "data.validation_fraction=0.1")
    config = titan.to_trainer_config(run, str(tmp_path / "run"))
    train_name, val_name = config.dataloader.dataset, config.validator.dataloader.dataset
    train = [r["text"] for r in DATASETS[train_name].loader(str(corpus))]
    held = [r["text"] for r in DATASETS[val_name].loader(str(corpus))]
    assert held == [texts[i] for i in (9, 19, 29, 39, 49, 59)]
    assert not set(train) & set(held) and sorted(train + held) == sorted(texts)
    assert config.validator.enable and config.validator.last_step == run.training.steps
    off = titan.to_trainer_config(resolve("data=local", f"data.dataset_path={corpus}"), str(tmp_path / "r2"))
    assert off.dataloader.dataset == "c4_test" and not off.validator.enable  # eval=off: all of it


def test_validation_runs_every_freq_steps_and_after_the_last_not_at_step_1():
    from qwen3_trainium.rank.validator import HeldOutValidator

    config = HeldOutValidator.Config(enable=True, freq=4, steps=1, last_step=10)
    should = HeldOutValidator.should_validate
    assert [s for s in range(1, 11) if should(type("V", (), {"config": config})(), s)] == [4, 8, 10]


def test_smoke_validates_once_at_the_end_on_two_batches():
    run = resolve("smoke=on", "eval=on")
    assert (run.eval.freq, run.eval.steps, run.training.steps) == (10, 2, 10)


def _problems(*overrides: str, notes=None):
    run = resolve(*overrides)
    problems = preflight.check_static(run, "/nonexistent", launching=False)
    return run, problems or check_heldout(run, notes if notes is not None else [])  # as check() orders them


@pytest.mark.parametrize(
    ("overrides", "key", "fix"),
    [
        (("eval=on", "parallel=cpu2", "eval.steps=-1"), "eval.steps", "eval.steps=8"),
        (("eval=on", "eval.freq=0"), "eval.freq", "eval.freq=100"),
        (("eval=on", "eval.sample_tokens=-1"), "eval.sample_tokens", "eval.sample_tokens=24"),
        (
            ("eval=on", "data.validation_fraction=0.9"),
            "data.validation_fraction",
            "data.validation_fraction=0.05",
        ),
        (("eval=on", "data.validation_path=/no/such/dir"), "data.validation_path", None),
        (("eval=on", "eval.sample_tokens=300"), "eval.sample_tokens", "eval.sample_tokens=245"),
        (("eval=on", "eval.sample_tokens=245"), None, None),  # 12 + 245 - 1: one 256-token forward
        (("eval=on", "training.seq_len=64"), "eval.sample_tokens", "eval.sample_tokens=0"),
        (("checkpoint=hf_export", "training.seq_len=128"), "training.seq_len", "training.seq_len=256"),
        (("eval=on", "eval.sample_prompts=[' ']"), "eval.sample_prompts", None),
    ],
)
def test_bad_eval_settings_are_refused_with_key_and_fix(overrides, key, fix):
    _, problems = _problems(*overrides)
    assert [p.key for p in problems] == ([key] if key else []), problems
    if fix:
        assert problems[0].fix.startswith(fix), problems[0].fix


def test_minus_one_steps_is_allowed_on_one_rank():
    _, problems = _problems("eval=on", "eval.steps=-1", "launcher.nproc_per_node=1")
    assert problems == []


def _small_split(tmp_path, held_out: list[str]) -> tuple[str, ...]:
    corpus = tmp_path / "c"
    _jsonl(corpus / "train.jsonl", ["some training text here"] * 50)
    _jsonl(corpus / "validation.jsonl", held_out)
    return (
        "eval=on",
        "data=local",
        f"data.dataset_path={corpus}",
        "training.seq_len=64",
        "training.local_batch_size=1",
        "eval.sample_tokens=0",
    )


def test_a_held_out_split_smaller_than_eval_steps_is_read_once_then_padded_with_a_note(tmp_path):
    """8 lines of 17 tokens (with EOS, less the shift): 136 tokens, 2 rows of 64 on one rank. The
    Validator's 8 batches read those 2 rows once and then padding, which the loss ignores."""
    notes: list[str] = []
    _, problems = _problems(
        *_small_split(tmp_path, ["a short held out line"] * 8), "eval.steps=8", notes=notes
    )
    assert problems == [] and any("the corpus's validation split" in n for n in notes)
    assert "eval: held-out text: 8 records over 1 data-parallel rank: 8 records, 2 rows per rank" in notes
    assert any("rank 0 holds fewer" in n and "over 2 rows, each scored once" in n for n in notes), notes
    assert any(n.startswith("WARNING") and "eval.steps=2 scores the same rows" in n for n in notes), notes


def test_held_out_text_that_makes_no_row_on_any_rank_is_refused_naming_the_fix(tmp_path):
    overrides = _small_split(tmp_path, ["a short held out line"] * 3)  # 51 tokens: no row of 64
    _, problems = _problems(*overrides, "eval.steps=2", "launcher.nproc_per_node=1")
    assert [p.key for p in problems] == ["data.dataset_path"], problems
    assert "make no row of training.seq_len 64 on any rank" in problems[0].message
    assert problems[0].fix.startswith("more held-out text, or a smaller training.seq_len")


def test_the_shipped_split_holds_the_default_eval_on_two_ranks():
    _, problems = _problems("eval=on", "parallel=cpu2")
    assert problems == []


def test_metrics_rows_of_a_step_merge_and_the_summary_reads_val_loss(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    report.update_job(
        str(run_dir), job_num=0, overrides=["eval=on"], total_steps=2, objective="val_loss", status="ok"
    )
    rows = [
        {"step": 1, "time": 1.0, "loss": 6.0},
        {"step": 2, "time": 2.0, "loss": 5.0},
        {"step": 2, "time": 3.0, "val_loss": 5.5, "val_perplexity": 244.7},
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    merged = report.read_metrics(str(run_dir))
    assert merged[-1] == {"step": 2, "time": 3.0, "loss": 5.0, "val_loss": 5.5, "val_perplexity": 244.7}
    assert report.final_loss(str(run_dir)) == 5.0 and report.final_loss(str(run_dir), "val_loss") == 5.5
    row = report.run_row(str(run_dir))
    assert (row["final_loss"], row["final_val_loss"], row["objective"]) == (5.0, 5.5, "val_loss")
    assert report.final_metrics(str(run_dir))["final_val_perplexity"] == 244.7
    assert "val_loss 5.5000" in progress.render(merged, 2, 10.0)
    assert report.plot_run(str(run_dir), "r") and (run_dir / "loss.png").stat().st_size > 0


def _memorized_run(tmp_path: Path, name: str, validation: list[str], train: list[str]) -> dict:
    corpus = tmp_path / name / "corpus"
    _jsonl(corpus / "train.jsonl", train)
    _jsonl(corpus / "validation.jsonl", validation)
    run_dir = tmp_path / name / "run"
    data = ["data=local", f"data.dataset_path={corpus}", "eval.sample_tokens=0", "eval.steps=1"]
    training = ["training.steps=60", "optimizer.lr=3e-3"]
    run = ["model=native", "smoke=on", "eval=on", "tracking=off", f"hydra.run.dir={run_dir}"]
    proc = run_launch(*run, *data, *training, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((run_dir / "job.json").read_text())


def _random_texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 7)))
        for _ in range(400)
    ]
    return [" ".join(rng.choice(words) for _ in range(40)) for _ in range(count)]


@pytest.mark.heavy
def test_val_loss_comes_from_the_held_out_records(tmp_path):
    """A model that memorised its few training documents: on copies of them val_loss is close to
    the training loss; on documents it never saw (same words, other order) it is far above."""
    train = _random_texts(0, 2)
    copies = _memorized_run(tmp_path, "copies", train * 12, train)
    fresh = _memorized_run(tmp_path, "fresh", _random_texts(1, 24), train)
    assert copies["objective"] == fresh["objective"] == "val_loss"
    for job in (copies, fresh):
        assert job["final_val_perplexity"] == pytest.approx(2.718281828 ** job["final_val_loss"], rel=1e-6)
    assert abs(copies["final_val_loss"] - copies["final_loss"]) < 0.5, copies
    assert fresh["final_val_loss"] > fresh["final_loss"] + 1.5, fresh  # measured: 4.56 vs 2.17


@pytest.mark.slow
def test_smoke_with_eval_logs_val_loss_once_at_the_end(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_launch(
        "model=native", "smoke=on", "eval=on", "tracking=off", f"hydra.run.dir={run_dir}", timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_metrics(run_dir)
    val = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in val] == [10] and val[0]["val_loss"] > 0
    assert "eval: held-out records: the corpus's validation split" in proc.stdout
    job = json.loads((run_dir / "job.json").read_text())
    assert job["final_val_loss"] == val[0]["val_loss"] and job["objective"] == "val_loss"


@pytest.mark.slow
@pytest.mark.parametrize("data", ["chat", pytest.param("text", marks=pytest.mark.heavy)])
def test_one_held_out_record_on_two_ranks_validates_instead_of_crashing(tmp_path, data):
    """The 64-rank crash at this machine's scale: one held-out record, two data-parallel ranks.
    Rank 1 is handed none: it runs the Validator's batches on padding while rank 0 scores the
    record, and the run ends with its val_loss (the old streams stopped the run at the first
    validation: a RuntimeError for chat, datasets' IndexError for text)."""
    held = tmp_path / "held.jsonl"
    if data == "chat":
        held.write_text((assets.CHAT_DIR / "validation.jsonl").read_text().splitlines()[0] + "\n")
        extra = ["data=chat"]
    else:
        _jsonl(held, [" ".join(_random_texts(2, 1)[0].split() * 12)])  # one record, a few rows long
        extra = []
    run_dir = tmp_path / "run"
    common = ["model=native", "smoke=on", "training.steps=2", "eval=on", "parallel=cpu2", "tracking=off"]
    proc = run_launch(
        *common,
        "eval.sample_tokens=0",
        f"data.validation_path={held}",
        *extra,
        f"hydra.run.dir={run_dir}",
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    val = [r["val_loss"] for r in read_metrics(run_dir) if "val_loss" in r]
    assert len(val) == 1 and 0 < val[0] < 20
