"""Pre-flight of what each data-parallel rank is handed (``data/shares.py``), chat and text,
training and held out: every rank's share counted with the function the ranks call.

Training: a rank handed no record (chat: fewer records than ranks; text: a block of
``split_dataset_by_node`` that is empty) would stop the run at its first step (torchtitan's text
loader would loop for ever, the others waiting for it): refused, with the numbers and the fix.
A chat rank whose first-epoch records are all dropped reads on into the next epoch (a note).

Held out: every rank runs the Validator's ``eval.steps`` batches of ``local_batch_size`` rows; a
rank whose share is smaller reads it once, then padding without labels (``data/chat/stream.py``,
``data/text.py``), so the loss is over every held-out row read, each once, and no rank waits for
another. Refused only when no rank makes a single row (there would be no loss to report); fewer
rows than asked, or a share so small that some ranks validate padding only, are notes with figures.
"""

from __future__ import annotations

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.data.shares import Shares, ranks
from qwen3_trainium.parent.preflight.problem import Problem


def dp_ranks(run: RunConf) -> int:
    from qwen3_trainium.config import runconfig

    deg = runconfig.degrees(run)
    return max(run.parallel.data_parallel_replicate_degree * deg.shard, 1)


def rows_per_validation(run: RunConf) -> int:
    """Rows one validation reads on each data-parallel rank: eval.steps batches of local_batch_size."""
    return run.eval.steps * run.training.local_batch_size


def unfed_ranks(shares: Shares, key: str, value, what: str) -> list[Problem]:
    """Training ranks handed no record, or (text) records that make no token."""
    n, w = sum(shares.records), shares.world
    empty = shares.without(shares.records)
    if empty:
        message = f"{n} {what} over {w} data-parallel ranks: {ranks(empty)} would be handed none"
        fix = (
            f"at least {w} {what} (one per data-parallel rank), or at most {n} data-parallel ranks "
            "(launcher.nproc_per_node, or parallel degrees that leave fewer ranks to data parallelism)"
        )
        return [Problem(key, value, message + " and stop the run at its first step", fix)]
    silent = shares.without(shares.tokens) if shares.tokens is not None else []
    if silent:
        message = f"the records {ranks(silent)} are handed make no token (every text is empty)"
        return [Problem(key, value, message, "drop the empty records, or fewer data-parallel ranks")]
    return []


def _verb(who: list[int], verb: str) -> str:
    return verb + "s" if len(who) == 1 else verb


def heldout_notes(shares: Shares, run: RunConf, label: str) -> list[str]:
    """The per-rank figures of the held-out split, and what a rank with fewer rows does."""
    needed = rows_per_validation(run)
    notes = [shares.line(label)]
    empty = shares.without(shares.rows)
    short = [r for r in shares.without(shares.rows, needed) if r not in empty]
    if empty or short:
        who = "; ".join(
            part
            for part in (
                f"{ranks(empty)} {_verb(empty, 'hold')} none and validate padding only" if empty else "",
                f"{ranks(short)} {_verb(short, 'hold')} fewer" if short else "",
            )
            if part
        )
        notes.append(
            f"{label}: one validation reads {needed} rows a rank (eval.steps {run.eval.steps} x local_batch_size "
            f"{run.training.local_batch_size}); {who}: each rank reads its share once, then padding without "
            f"labels, so the held-out loss is over {sum(shares.rows)} rows, each scored once"
        )
    widest = -(-max(shares.rows) // run.training.local_batch_size)
    if widest < run.eval.steps:
        notes.append(
            f"WARNING {label}: no rank has more than {widest} batch{'es' if widest != 1 else ''} of held-out rows: "
            f"eval.steps={max(widest, 1)} scores the same rows in less time"
        )
    return notes


def no_heldout_row(shares: Shares, key: str, value, fix: str, run: RunConf) -> list[Problem]:
    if sum(shares.rows):
        return []
    message = (
        f"the held-out records ({sum(shares.records)} over {shares.world} data-parallel ranks) make no row of "
        f"training.seq_len {run.training.seq_len} on any rank: a validation would score nothing"
    )
    return [Problem(key, value, message, fix)]
