"""Pre-flight of eval=on's inputs: the held-out split (enough tokens for every validation
step), the sample prompts and the export probe (each fits ``training.seq_len``).
"""

from __future__ import annotations

import os

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent.preflight.problem import Problem

HELDOUT_FIX = "data.validation_path=<a file or directory of held-out records>"


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


def validation_tokens_needed(run: RunConf) -> int:
    """Tokens one validation reads: eval.steps batches of local_batch_size x seq_len on every
    data-parallel rank (torchtitan's Validator builds the dataloader with dp_world_size)."""
    from qwen3_trainium.config import runconfig

    deg = runconfig.degrees(run)
    dp = run.parallel.data_parallel_replicate_degree * deg.shard
    return run.eval.steps * run.training.local_batch_size * max(dp, 1) * run.training.seq_len


def check_heldout(run: RunConf, notes: list[str]) -> list[Problem]:
    """eval=on: the held-out records exist and hold enough tokens for one validation without
    starting over (torchtitan's Validator loops a split that runs out: the same batches twice)."""
    if not run.eval.enable:
        return []
    from qwen3_trainium.data import heldout

    src = heldout.source(run)
    notes.append(f"eval: held-out records: {src.describe(run.data.validation_fraction)}")
    if src.kind == "hub":
        notes.append("eval: a Hub dataset's validation split is not counted before launch")
        return []
    if run.eval.steps == -1:
        return []
    needed = validation_tokens_needed(run)
    key, value = (
        ("data.validation_path", run.data.validation_path)
        if src.kind == "path"
        else ("data.dataset_path", run.data.dataset_path)
    )
    try:
        records = heldout.load_validation(run)
    except Exception as err:  # datasets' own errors: unreadable files, no such split
        return [
            Problem(
                key, value, f"the held-out records cannot be read: {type(err).__name__}: {err}", HELDOUT_FIX
            )
        ]
    tokens = count_tokens(records, run.data.hf_assets_path, needed)
    if tokens >= needed:
        return []
    per_batch = needed // run.eval.steps
    fits = tokens // per_batch
    fix = f"eval.steps={fits}" if fits >= 1 else "more held-out text"
    if src.kind == "fraction":
        fix += ", or a larger data.validation_fraction"
    fix += f", or {HELDOUT_FIX}"
    message = (
        f"the held-out records ({src.describe(run.data.validation_fraction)}) hold {tokens} tokens; "
        f"one validation reads {needed} (eval.steps {run.eval.steps} x local_batch_size "
        f"{run.training.local_batch_size} x data-parallel ranks x seq_len {run.training.seq_len})"
    )
    return [Problem(key, value, message, fix)]


def count_tokens(records, tokenizer_dir: str, enough: int) -> int:
    """Tokens the training loader would make of these records (each document with its EOS,
    less one for the shift), counted until ``enough``."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    total = 0
    for record in records:
        total += len(tok.encode(record["text"]).ids)  # + EOS - the shift
        if total >= enough:
            break
    return total
