"""Pre-flight checks of chat data (``data.format`` not ``text``, ``data/chat/``): the records,
the chat template, the masks they make, and attention that keeps packed samples apart.

Cheap ones (``check_chat_static``: paths, the template's presence, combinations of keys) run with
the static tier; the pass over the records (``check_chat``: every record parsed, at most
``SCAN_CAP`` rendered, masked and packed) with the full one, which is remembered.
"""

from __future__ import annotations

import os

from qwen3_trainium.config.schema import AttnBackend, ModelPath, RunConf
from qwen3_trainium.data.shares import ranks
from qwen3_trainium.parent.preflight.problem import Problem
from qwen3_trainium.parent.preflight.shares import dp_ranks, heldout_notes, rows_per_validation, unfed_ranks

__all__ = ["check_attention_masks", "check_chat", "check_chat_static", "data_source", "dp_ranks", "is_chat"]

DATA_FIX = "data.dataset_path=<a .jsonl/.json/.parquet file or directory of chat records, or a cached Hub dataset id>"
FORMAT_FIX = (
    "records need messages, conversations (ShareGPT), prompt+completion or instruction+output"
    " (Alpaca); data.format=<one of them> checks every record against it"
)


PAIRS_FIX = (
    "records need chosen and rejected (TRL's preference format), with or without prompt, each a string"
    " or a list of messages"
)


def is_chat(run: RunConf) -> bool:
    return run.data.format.value != "text"


def is_preference(run: RunConf) -> bool:
    return run.data.format.value == "preference"


def data_source(run: RunConf):
    """The module that reads the run's records, counts them and writes data.preview: chat's
    (``data/chat/source.py``), or for objective=dpo's pairs ``data/preference/source.py``."""
    if is_preference(run):
        from qwen3_trainium.data.preference import source
    else:
        from qwen3_trainium.data.chat import source
    return source


def check_attention_masks(run: RunConf) -> list[Problem]:
    """Samples packed into one row must not see each other: model.attn_backend=causal masks
    nothing but the future, so it is only for unpacked chat data."""
    if run.model.attn_backend is not AttnBackend.causal:
        return []
    if run.model.path is ModelPath.hf:
        fix = "model.attn_backend=sdpa (or auto)"
        return [Problem("model.attn_backend", "causal", "is for model=native and model=nki_moe", fix)]
    if is_chat(run) and not run.data.packing:
        return []
    what = (
        "chat samples packed into one row"
        if is_chat(run)
        else "the text documents torchtitan packs into one row"
    )
    fix = (
        "data.packing=false, or model.attn_backend=sdpa (per-sample masks)"
        if is_chat(run)
        else "model.attn_backend=sdpa"
    )
    return [Problem("model.attn_backend", "causal", f"would let {what} attend to each other", fix)]


def check_chat_static(run: RunConf) -> list[Problem]:
    if not is_chat(run):
        return []
    from qwen3_trainium.data.chat import records, template

    data = run.data
    problems = []
    if records.resolve(data.dataset_path or "") is None:
        what = "does not exist, and is no Hub dataset in the local cache"
        problems.append(Problem("data.dataset_path", data.dataset_path, what, DATA_FIX))
    elif not records.data_files(records.resolve(data.dataset_path)):
        problems.append(
            Problem(
                "data.dataset_path", data.dataset_path, "holds no .jsonl, .json or .parquet file", DATA_FIX
            )
        )
    if data.chat_template and not os.path.isfile(data.chat_template):
        problems.append(
            Problem(
                "data.chat_template",
                data.chat_template,
                "does not exist",
                "data.chat_template=<a .jinja file>",
            )
        )
    elif os.path.isfile(os.path.join(data.hf_assets_path, "tokenizer.json")):
        try:
            found = template.find_template(data.hf_assets_path, data.chat_template)
        except (ValueError, OSError) as e:
            found = None
            problems.append(
                Problem(
                    "data.chat_template", data.chat_template, str(e), "data.chat_template=<a .jinja file>"
                )
            )
        if found is None and not data.chat_template:
            problems.append(
                Problem(
                    "data.hf_assets_path",
                    data.hf_assets_path,
                    "the tokenizer has no chat template (no chat_template.jinja, no chat_template in"
                    " tokenizer_config.json): chat data cannot be rendered as the model will see it",
                    "data.chat_template=<the model's chat template, a .jinja file>",
                )
            )
    if data.history_thinking.value == "keep" and data.loss_on.value == "all":
        problems.append(
            Problem(
                "data.history_thinking",
                "keep",
                "with data.loss_on=all would train the earlier turns once per later turn",
                "data.history_thinking=as_rendered, or data.loss_on=assistant",
            )
        )
    if data.preview < 0:
        problems.append(
            Problem("data.preview", data.preview, "is negative", "data.preview=<rows to write, 0 for none>")
        )
    return problems


def check_chat(run: RunConf, notes: list[str]) -> list[Problem]:
    """Every record read and placed: a bad record is named by file and line; the counts, and what
    each data-parallel rank is handed (``preflight/shares.py``), go to the notes the dry run prints."""
    if not is_chat(run):
        return []
    from qwen3_trainium.data.chat import records

    source = data_source(run)
    try:
        tok = source.tokenizer(run)
        eot = tok.end_of_turn
    except Exception as e:  # TemplateError, or jinja's own errors: a template that does not render
        return [_template_problem(run, e)]
    problems = []
    for split in ("train", "validation") if run.eval.enable else ("train",):
        held_out = split == "validation"
        limit = rows_per_validation(run) if held_out and run.eval.steps > 0 else None  # rows a rank reads
        try:
            summary = source.summarise(run, split, world=dp_ranks(run), limit=limit)
        except records.RecordError as e:
            key = "data.validation_path" if held_out and run.data.validation_path else "data.dataset_path"
            return [Problem(key, e.where, e.what, e.fix or (PAIRS_FIX if is_preference(run) else FORMAT_FIX))]
        kind = "preference data" if is_preference(run) else "chat data"
        label = f"{kind}, held out" if held_out else kind
        notes.extend(f"{label}: {line}" for line in summary.lines())
        if not held_out:
            notes.append(f"{kind}: template {tok.template_source}; end of turn {eot}")
        problems += _split_problems(run, summary, split, label, notes)
    return problems


def _template_problem(run: RunConf, e: Exception) -> Problem:
    where = run.data.chat_template or os.path.join(run.data.hf_assets_path, "(template)")
    what = f"the chat template does not render a conversation: {type(e).__name__}: {e}"
    return Problem(
        "data.chat_template", where, what, "data.chat_template=<a .jinja file that renders messages>"
    )


def _split_problems(run: RunConf, summary, split: str, label: str, notes: list[str]) -> list[Problem]:
    counts, shares = summary.counts, summary.shares
    if counts.samples == 0:
        skipped = "; ".join(f"{n} {r}" for r, n in sorted(counts.skipped.items())) or "none"
        unit = "pair" if is_preference(run) else "sample"
        what = (
            f"no trainable {unit} in the {split} records ({counts.records} read; {counts.dropped} longer than"
            f" seq_len {run.training.seq_len}; skipped: {skipped})"
        )
        fix = "data.overflow=truncate or a larger training.seq_len" + (
            "" if is_preference(run) else ", or data.loss_on=<assistant|all>"
        )
        return [Problem("data.dataset_path", run.data.dataset_path, what, fix)]
    if split == "validation":  # eval.steps -1 (one rank): the whole split, then it stops
        notes.extend(heldout_notes(shares, run, label) if run.eval.steps > 0 else [shares.line(label)])
        return []
    notes.append(shares.line(label) + (" in the first epoch" if shares.limit is None else ""))
    idle = [r for r in shares.without(shares.rows) if shares.records[r]]
    if idle and shares.limit is None:
        notes.append(
            f"{label}: the first-epoch records of {ranks(idle)} give no sample (dropped or skipped): "
            "those ranks read on into the next epoch's"
        )
    return unfed_ranks(shares, "data.dataset_path", run.data.dataset_path, "training records")
