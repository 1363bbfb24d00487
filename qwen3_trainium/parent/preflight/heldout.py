"""Pre-flight of text data's shares and eval=on's inputs: what each data-parallel rank is handed
of the training and the held-out records (counted with torchtitan's own split and tokenizer), the
sample prompts and the export probe (each fits ``training.seq_len``).
"""

from __future__ import annotations

import os

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent.preflight.problem import Problem
from qwen3_trainium.parent.preflight.shares import (
    dp_ranks,
    heldout_notes,
    no_heldout_row,
    rows_per_validation,
    unfed_ranks,
)

HELDOUT_FIX = "data.validation_path=<a file or directory of held-out records>"
CORPUS_FIX = 'data.dataset_path=<a directory of *.jsonl / *.json records with a "text" field, or *.txt>'


def check_validation_path(run: RunConf) -> list[Problem]:
    """data.validation_path, with eval=on: an existing file or directory holding data files."""
    path = run.data.validation_path
    if not (run.eval.enable and path and path.strip()):
        return []
    from qwen3_trainium.data.heldout import DATA_SUFFIXES, data_files

    if not os.path.exists(path):
        return [Problem("data.validation_path", path, "does not exist", HELDOUT_FIX)]
    if not data_files(path):
        kinds = ", ".join(sorted(DATA_SUFFIXES))
        return [Problem("data.validation_path", path, f"holds no data file ({kinds})", HELDOUT_FIX)]
    return []


PADDED_TO = 256  # checkpoint.PROBE_MULTIPLE: each sampling forward is padded to a multiple of it


def _padded(length: int) -> int:
    return -(-length // PADDED_TO) * PADDED_TO


def check_samples(run: RunConf) -> list[Problem]:
    """eval=on's greedy samples: one model part (no pipeline stages), and the last forward of
    each prompt, padded to a multiple of 256 (``checkpoint.model_logits``), within
    training.seq_len: torchtitan sizes the rotary table to it (``update_from_config``)."""
    ev = run.eval
    if not (ev.enable and ev.sample_tokens > 0 and ev.sample_prompts):
        return []
    if run.parallel.pipeline_parallel_degree > 1:
        return [
            Problem(
                "eval.sample_tokens",
                ev.sample_tokens,
                "samples decode on the whole model, and pipeline stages split it "
                f"(parallel.pipeline_parallel_degree={run.parallel.pipeline_parallel_degree})",
                "eval.sample_tokens=0 (validation still runs)",
            )
        ]
    tokenizer = os.path.join(run.data.hf_assets_path, "tokenizer.json")
    if not os.path.isfile(tokenizer):
        return []  # check_data names it
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    lengths = {p: len(tok.encode(p).ids) for p in ev.sample_prompts}
    longest = max(lengths, key=lengths.__getitem__)
    seq_len, length = run.training.seq_len, lengths[longest]
    if _padded(length + ev.sample_tokens - 1) <= seq_len:
        return []
    room = seq_len // PADDED_TO * PADDED_TO - length + 1
    fix = (
        f"eval.sample_tokens={room}, or a shorter prompt"
        if room >= 1
        else "eval.sample_tokens=0, or training.seq_len=256"
    )
    return [
        Problem(
            "eval.sample_tokens",
            ev.sample_tokens,
            f"the prompt {longest!r} ({length} tokens) plus {ev.sample_tokens} tokens, padded to a multiple "
            f"of {PADDED_TO} as each sampling forward is, is past training.seq_len ({seq_len}: the rotary table)",
            fix,
        )
    ]


def check_probe_length(run: RunConf) -> list[Problem]:
    """The export check's probe forward is padded to 256 tokens (``checkpoint.model_logits``)."""
    ck = run.checkpoint
    if not (ck.enable and ck.last_save_in_hf and ck.export_check) or run.training.seq_len >= PADDED_TO:
        return []
    return [
        Problem(
            "training.seq_len",
            run.training.seq_len,
            f"the HF export check runs the trained model on {PADDED_TO} tokens, past the rotary table "
            "torchtitan sizes to training.seq_len",
            f"training.seq_len={PADDED_TO}, or checkpoint.export_check=false",
        )
    ]


def check_probe_precision(run: RunConf, environ=os.environ) -> list[Problem]:
    """On Neuron the launcher adds ``--auto-cast=none`` to the ranks' ``NEURON_CC_FLAGS`` when a check
    compares float32 forwards (``export_facts.neuron_cc_flags``); a user's own ``--auto-cast`` of
    another kind would make neuronx-cc cast the probe's float32 matmuls to bfloat16, and both checks
    fail after the last step. Refused now."""
    from qwen3_trainium.parent.export_facts import AUTO_CAST, cast_matmuls, probe_compared

    flags = environ.get("NEURON_CC_FLAGS", "")
    if run.device.type.value != "neuron" or not probe_compared(run) or not AUTO_CAST.search(flags):
        return []
    if cast_matmuls("neuron", flags) is None:
        return []
    check = run.checkpoint.export_check
    key, value = (
        ("checkpoint.export_check", True) if check else ("eval.sample_tokens", run.eval.sample_tokens)
    )
    message = (
        f"the HF export is checked against the ranks' float32 logits, and NEURON_CC_FLAGS={flags!r} has"
        " neuronx-cc cast float32 matmuls to lower precision: the check would fail after the last step"
    )
    off = "checkpoint.export_check=false" if check else "eval.sample_tokens=0"
    fix = f"drop --auto-cast from NEURON_CC_FLAGS (the launcher then adds --auto-cast=none), or {off}"
    return [Problem(key, value, message, fix)]


def _encoder(run: RunConf, dataset: str):
    """A sample's tokens as a rank makes them: the dataset's text processor, then torchtitan's
    tokenizer with BOS and EOS (``HuggingFaceTextDataset.__iter__``)."""
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.hf_datasets.text_datasets import DATASETS

    tok = HuggingFaceTokenizer.Config().build(tokenizer_path=run.data.hf_assets_path)
    processor = DATASETS[dataset].sample_processor
    return lambda sample: tok.encode(processor(sample), add_bos=True, add_eos=True)


def _unreadable(key: str, value, err: Exception, what: str, fix: str) -> list[Problem]:
    return [Problem(key, value, f"{what} cannot be read: {type(err).__name__}: {err}", fix)]


def check_text_train(run: RunConf, notes: list[str]) -> list[Problem]:
    """Local text: every data-parallel rank's block of the training records holds text."""
    from torchtitan.hf_datasets.text_datasets import DATASETS

    from qwen3_trainium.data import heldout, text
    from qwen3_trainium.data import shares as data_shares

    name, path, _ = text.train_dataset(run)
    if heldout.local_dir(run) is None:
        notes.append("text data: a Hub dataset's shares per data-parallel rank are not counted before launch")
        return []
    try:
        ds = DATASETS[name].loader(path)
    except Exception as err:  # datasets' own errors: unreadable files
        return _unreadable("data.dataset_path", path, err, "the training records", CORPUS_FIX)
    world = dp_ranks(run)
    found = data_shares.text(ds, _encoder(run, name), seq_len=run.training.seq_len, world=world, limit=1)
    notes.append(found.line("text data", rows=False) + " (datasets.split_dataset_by_node: contiguous blocks)")
    return unfed_ranks(found, "data.dataset_path", path, "training records")


def check_heldout(run: RunConf, notes: list[str]) -> list[Problem]:
    """Text data: what each data-parallel rank is handed for training (``check_text_train``) and,
    with eval=on, of the held-out records (``preflight/shares.py``: each rank's share read once,
    then padding; refused when no rank makes a row)."""
    problems = check_text_train(run, notes)
    if not run.eval.enable:
        return problems
    from qwen3_trainium.data import heldout

    src = heldout.source(run)
    notes.append(f"eval: held-out records: {src.describe(run.data.validation_fraction)}")
    if src.kind == "hub":
        notes.append("eval: a Hub dataset's validation split is not counted before launch")
        return problems
    return problems + _heldout_text(run, src, notes)


def _heldout_text(run: RunConf, src, notes: list[str]) -> list[Problem]:
    from qwen3_trainium.data import heldout
    from qwen3_trainium.data import shares as data_shares

    if src.kind == "path":
        key, value = "data.validation_path", run.data.validation_path
    else:
        key, value = "data.dataset_path", run.data.dataset_path
    fix = "more held-out text, or a smaller training.seq_len"
    if src.kind == "fraction":
        fix += ", or a larger data.validation_fraction"
    fix += f", or {HELDOUT_FIX}"
    try:
        records = heldout.load_validation(run)
    except Exception as err:  # datasets' own errors: unreadable files, no such split
        return _unreadable(key, value, err, "the held-out records", HELDOUT_FIX)
    whole = run.eval.steps == -1  # one rank reads the whole split, then stops: one row is enough here
    limit = 1 if whole else rows_per_validation(run)
    encode = _encoder(run, src.val_dataset)
    found = data_shares.text(records, encode, seq_len=run.training.seq_len, world=dp_ranks(run), limit=limit)
    if not whole:
        notes.extend(heldout_notes(found, run, "eval: held-out text"))
    return no_heldout_row(found, key, value, fix, run)
