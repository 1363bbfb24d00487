"""Greedy samples after training (``samples.py``, ``trainer.SampleAfterTraining``): the decode
loop, the rank side's files, and an HF export whose ``generate`` must write the same ids."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import resolve, run_launch
from tokenizers import Tokenizer

from qwen3_trainium.config import schema
from qwen3_trainium.data.assets import TOKENIZER_DIR
from qwen3_trainium.parent import samples_check
from qwen3_trainium.rank import samples
from qwen3_trainium.rank.passkey import PasskeyConfig

VOCAB = 508  # the shipped tokenizer's; its EOS <|endoftext|> is id 0


def _next_is_plus_one(tokens: torch.Tensor) -> torch.Tensor:
    """Logits whose argmax after id t is t + 1, for every position."""
    return torch.nn.functional.one_hot((tokens + 1) % VOCAB, VOCAB).float()


def test_greedy_takes_the_last_positions_argmax_and_stops_at_eos():
    seen = []

    def logits(tokens):
        seen.append(tokens[0].tolist())
        return _next_is_plus_one(tokens)

    assert samples.greedy(logits, [3, 4], 5, eos=[7]) == [5, 6, 7]  # EOS kept, then no more forwards
    assert seen == [[3, 4], [3, 4, 5], [3, 4, 5, 6]]
    assert samples.greedy(logits, [3], 4, eos=[0]) == [4, 5, 6, 7]  # no EOS: exactly `steps` ids
    assert samples.greedy(logits, [3], 0, eos=[0]) == []
    assert samples.greedy(logits, [], 4, eos=[0]) == []  # no prompt ids: nothing to condition on


def test_greedy_breaks_ties_like_generate_and_continues_with_the_agreed_id():
    tie = torch.zeros(1, 1, VOCAB)
    tie[..., [9, 4]] = 1.0  # torch.argmax, as generate uses it: the first maximum
    assert samples.greedy(lambda t: tie.expand(1, t.shape[1], VOCAB), [1], 1, eos=[]) == [4]
    seen = []

    def logits(tokens):
        seen.append(tokens[0].tolist())
        return _next_is_plus_one(tokens)

    # the ids every rank continues with are rank 0's (here: always 20), EOS judged on them
    assert samples.greedy(logits, [1], 3, eos=[21], agree=lambda token: 20) == [20, 20, 20]
    assert seen == [[1], [1, 20], [1, 20, 20]]


def test_first_difference():
    assert samples.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert samples.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert samples.first_difference([1, 2], [1, 2, 0]) == 2  # one ended early


class PlusOne(torch.nn.Module):
    """A stand-in for a torchtitan model part: ``model(tokens, positions=...)`` -> logits."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, tokens, positions):
        assert tokens.shape[1] == 256 and positions.shape == tokens.shape  # model_logits pads
        return _next_is_plus_one(tokens) + self.weight


def test_rank_side_writes_samples_json_and_md(tmp_path):
    tokenizer_dir = tmp_path / "tokenizer"
    shutil.copytree(TOKENIZER_DIR, tokenizer_dir)
    prompt = "The capital of France is"
    last = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).encode(prompt).ids[-1]
    # an HF model directory's generation_config.json adds its EOS ids (generate stops at them)
    (tokenizer_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, last + 3]}))
    config = samples.SampleConfig(
        prompts=[prompt, "a | b"],
        tokens=6,
        path=str(tmp_path / "samples.json"),
        tokenizer_dir=str(tokenizer_dir),
    )
    samples.sample_on_ranks(PlusOne(), config, max_len=256, step=7, mixed_precision_param="float32")
    record = json.loads((tmp_path / "samples.json").read_text())
    assert (record["eos_ids"], record["tokens"], record["step"], record["weights_dtype"]) == (
        [0, last + 3],
        6,
        7,
        "float32",
    )
    first, second = record["samples"]
    assert first["generated_ids"] == [last + 1, last + 2, last + 3]
    assert first["margins"] == [1.0, 1.0, 1.0]  # one-hot logits: the best leads the rest by 1
    assert (record["compute_dtype"], record["rounded_to"], record["device"]) == ("float32", None, "cpu")
    assert 0 < len(second["generated_ids"]) <= 6 and samples.cut_short(record) == []
    md = (tmp_path / "samples.md").read_text()
    assert "| prompt | trained model (ranks) |\n|---|---|\n| The capital of France is |" in md
    assert "| a \\| b |" in md  # a prompt's own | does not split the row
    assert not list(tmp_path.glob("*.tmp"))
    # padded to 256, no forward fits a model whose positions end at 64 (its RoPE cache): none runs
    record = samples.sample_on_ranks(PlusOne(), config, max_len=64)
    assert [s["generated_ids"] for s in record["samples"]] == [[], []] and len(samples.cut_short(record)) == 2
    assert (
        "- `The capital of France is`: cut at 0 tokens (training.seq_len=64)"
        in (tmp_path / "samples.md").read_text()
    )


class Scaled(torch.nn.Module):
    """``PlusOne`` scaled by a weight bfloat16 cannot hold (1 + 2**-10 rounds to 1.0): records the
    weight and the dtype each forward computes in."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([1 + 2**-10]))
        self.seen = []

    def forward(self, tokens, positions):
        self.seen.append((self.weight.item(), self.weight.dtype))
        return _next_is_plus_one(tokens) * self.weight


def test_rank_side_decodes_on_the_weights_the_export_holds_then_restores_them(tmp_path):
    config = samples.SampleConfig(
        prompts=["a"], tokens=2, path=str(tmp_path / "samples.json"), tokenizer_dir=str(TOKENIZER_DIR)
    )
    model = Scaled()
    record = samples.sample_on_ranks(model, config, max_len=256, round_to="bfloat16")
    assert model.seen == [(1.0, torch.float32)] * 2  # rounded as a bfloat16 export holds it, in float32
    assert model.weight.item() == 1 + 2**-10  # the trained value is back
    assert record["rounded_to"] == "bfloat16" and record["samples"][0]["margins"] == [1.0, 1.0]
    md = (tmp_path / "samples.md").read_text()
    assert "weights float32 rounded to bfloat16 (what the HF export holds), computed in float32" in md
    samples.sample_on_ranks(model, config, max_len=256)  # no export: the trained weights
    assert model.seen[-1] == (1 + 2**-10, torch.float32)


def test_trainer_skips_samples_after_a_stop_and_for_pipeline_stages(monkeypatch):
    from qwen3_trainium.rank import trainer

    calls = []

    inside = []

    def sample_on_ranks(*args, **kwargs):
        calls.append((args, kwargs))
        assert inside == [True], "samples decode outside the trainer's train_context"
        return {"tokens": 2, "samples": []}

    monkeypatch.setattr(samples, "sample_on_ranks", sample_on_ranks)

    class Base:
        def train(self):
            calls.append("train")

        @contextlib.contextmanager
        def train_context(self):  # torchtitan's: the SPMD mesh every forward runs under
            inside.append(True)
            yield
            inside.pop()

    class Trainer(trainer.SampleAfterTraining, trainer.StopAtSignal, Base):
        pass

    t = Trainer()
    t.config = SimpleNamespace(
        samples=samples.SampleConfig(prompts=["x"], tokens=2, path="unused", tokenizer_dir="unused"),
        passkey=PasskeyConfig(),
        training=SimpleNamespace(mixed_precision_param="bfloat16", seq_len=256),
        checkpoint=SimpleNamespace(enable=True, last_save_in_hf=True, export_dtype="bfloat16"),
    )
    t.model_parts, t.step, t._first_step = [torch.nn.Linear(1, 1)], 3, 0
    t.stopped_at = 3
    t.train()
    t.stopped_at, t.model_parts = None, [torch.nn.Linear(1, 1)] * 2
    t.train()
    assert calls == ["train", "train"]
    t.model_parts = t.model_parts[:1]
    t.train()
    assert calls[-2] == "train"
    (model, config, group), kwargs = calls[-1]
    assert model is t.model_parts[0] and config is t.config.samples and group is None
    assert kwargs == {"max_len": 256, "round_to": "bfloat16", "step": 3, "mixed_precision_param": "bfloat16"}
    t.config.checkpoint.last_save_in_hf = False  # no HF export: the weights as trained
    t.train()
    assert calls[-1][1]["round_to"] == ""


def test_launcher_side_without_samples_json_or_without_an_export(tmp_path):
    run = resolve("eval=on")
    passed, line = samples_check.after_run(run, str(tmp_path))
    assert not passed and "rank 0 wrote no" in line and "samples.json" in line
    assert samples_check.after_run(resolve("eval=on", "eval.sample_tokens=0"), str(tmp_path)) == (True, "")
    assert samples_check.after_run(resolve("eval=on", "eval.sample_prompts=[]"), str(tmp_path)) == (True, "")
    record = {"tokens": 24, "max_len": 64, "samples": [{"max_new_tokens": 24}, {"max_new_tokens": 3}]}
    (tmp_path / "samples.json").write_text(json.dumps(record))
    assert samples_check.after_run(run, str(tmp_path)) == (
        True,
        f"samples (1 cut short by training.seq_len=64): {tmp_path / 'samples.md'}",
    )


# Two ranks (FSDP: every forward of the decode is a collective) training in bfloat16 on CPU, a
# bfloat16 export (the regime users run): the ranks decode in float32 on the weights the export
# holds, so the ids must be equal. A low learning rate keeps the 3-step model near its random
# start, whose greedy ids vary; at the default rate 3 steps already collapse into one repeated id,
# a weaker check.
RUN = [
    "model=native",
    "smoke=on",
    "eval=on",
    "eval.steps=1",
    "eval.sample_tokens=24",  # smoke=on's is 8
    "checkpoint=hf_export",
    "parallel=cpu2",
    "training.mixed_precision_param=bfloat16",
    "checkpoint.export_dtype=bfloat16",
    "training.steps=3",
    "optimizer.lr=1e-5",
    "tracking=off",
]

# transformers alone, in a process of its own, on the export: the done-means reference
GENERATE = textwrap.dedent(
    """
    import json, sys, torch
    from transformers import AutoModelForCausalLM
    record = json.load(open(sys.argv[2]))
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
    out = []
    for s in record["samples"]:
        ids = torch.tensor([s["prompt_ids"]])
        seq = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24,
                             do_sample=False, eos_token_id=[0], pad_token_id=0)
        out.append(seq[0, ids.shape[1]:].tolist())
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("samples") / "run"
    proc = run_launch(*RUN, f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir, proc


def _export_dir(run_dir: Path) -> Path:
    return next((run_dir / "checkpoint").glob("step-*"))


@pytest.mark.slow
def test_export_generate_writes_what_the_ranks_wrote(sampled_run):
    run_dir, proc = sampled_run
    md = run_dir / "samples.md"
    assert (
        f"[qwen3-trainium] samples (2 prompts, 24 tokens): identical to AutoModelForCausalLM.generate"
        f" on the export: {md}" in proc.stdout
    )
    record = json.loads((run_dir / "samples.json").read_text())
    tokenizer = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    assert [s["prompt"] for s in record["samples"]] == list(schema.DEFAULT_SAMPLE_PROMPTS)
    assert [s["prompt_ids"] for s in record["samples"]] == [
        tokenizer.encode(p).ids for p in schema.DEFAULT_SAMPLE_PROMPTS
    ]
    ranks = [s["generated_ids"] for s in record["samples"]]
    assert all(ranks) and (record["eos_ids"], record["mixed_precision_param"]) == ([0], "bfloat16")
    reference = subprocess.run(
        [sys.executable, "-c", GENERATE, str(_export_dir(run_dir)), str(run_dir / "samples.json")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(reference.stdout.strip().splitlines()[-1]) == ranks
    assert record["export"]["generated_ids"] == ranks and record["export"]["exact"] is True
    text = md.read_text()
    assert "| prompt | trained model (ranks) | HF export (generate) |" in text
    assert text.count(": identical") == 2


@pytest.mark.slow
def test_a_changed_id_fails_a_bfloat16_run_on_cpu_and_elsewhere_unless_at_a_near_tie(sampled_run, tmp_path):
    run_dir, _ = sampled_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    record = json.loads((copy / "samples.json").read_text())
    record.pop("export")
    changed = record["samples"][1]["generated_ids"]
    assert len(changed) > 2
    changed[2] = (changed[2] + 1) % VOCAB or 1  # never EOS
    (copy / "samples.json").write_text(json.dumps(record))
    passed, line = samples_check.after_run(resolve(*RUN), str(copy))  # bfloat16 training, CPU
    assert not passed, line
    assert "1 of 2 differ" in line and "'Once upon a time' at token 2" in line and "FAILED" in line
    assert "- `Once upon a time`: differs at token 2" in (copy / "samples.md").read_text()
    # on a device (float32 sums in another order): accepted only where the ranks' two best logits
    # were within twice the export check's tolerance, 2e-4 on cuda
    directory = str(_export_dir(copy))
    generated = json.loads((copy / "samples.json").read_text())["export"]["generated_ids"]
    for margin, verdict in ((1.5e-4, True), (3e-4, False)):
        record["samples"][1]["margins"][2] = margin
        passed, line = samples_check.compare(
            record, generated, directory, "cuda", str(copy / "samples.json"), ""
        )
        assert passed is verdict, line
        assert f"{margin:.2e}" in line and "allowed 2e-04 on cuda" in line
    passed, line = samples_check.compare(record, generated, directory, "cpu", str(copy / "samples.json"), "")
    assert not passed and "on cpu the ids must be equal" in line  # no margin excuses it on CPU
