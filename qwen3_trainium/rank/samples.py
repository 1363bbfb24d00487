"""Greedy samples after training (eval=on), and whether an HF export writes the same.

Three sides, one file (``samples.json`` in the run directory) between them:
- ranks (``trainer.SampleAfterTraining`` calls ``sample_on_ranks``): after the last step every
  rank decodes ``eval.sample_tokens`` greedy tokens for each of ``eval.sample_prompts`` from the
  trained weights, one full forward per token (``probe.model_logits``: the same forwards on
  every rank, as FSDP and TP need), in float32 whatever the run trains in
  (``float32_forward.py``) and, when the run makes an HF export, on the weights rounded to its
  dtype (what the export holds); each token's margin (its logit minus the runner-up's) is kept;
  rank 0 writes ``samples.json`` and ``samples.md``.
- a fresh process (``python -m qwen3_trainium.parent.samples_check EXPORT_DIR SAMPLES_JSON``,
  fresh for the reason ``export_check.py`` gives): ``AutoModelForCausalLM.generate`` on the HF
  export in float32, greedy, with the ranks' prompt ids, EOS ids and token counts; it prints the
  new ids.
- the launcher (``parent/samples_check.py``): runs that process when the run made an HF export,
  rewrites ``samples.md`` with both texts side by side, and fails the run (exit 3) when they
  differ: anywhere on CPU, elsewhere except at a near tie of the ranks' logits (the margin).

Greedy here is what ``generate(do_sample=False)`` does (``transformers/generation/utils.py``,
``_sample``): the first maximal logit of the last position in float32, appended to the input;
a generated EOS id is kept and ends the sample.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field

SAMPLES_JSON = "samples.json"
SAMPLES_MD = "samples.md"


@dataclass(kw_only=True, slots=True)
class SampleConfig:
    prompts: list[str] = field(default_factory=list)
    tokens: int = 0
    """Greedy tokens per prompt."""
    path: str = ""
    """Where rank 0 writes samples.json (samples.md beside it)."""
    tokenizer_dir: str = ""
    """tokenizer.json of the run (the same ids an HF export's generate is given)."""
    chat_template: str = ""
    """data=chat: the template file; each prompt is a user message with a generation prompt."""
    chat_template_kwargs: dict = field(default_factory=dict)


def eos_ids(tokenizer_dir: str, tokenizer) -> list[int]:
    """tokenizer_config.json's ``eos_token``, then the ``eos_token_id`` of a generation_config.json
    beside it (an HF model directory's: what its ``generate`` stops at), each id once."""
    ids: list[int] = []

    def read(name: str) -> dict:
        path = os.path.join(tokenizer_dir, name)
        return _read_json(path) if os.path.isfile(path) else {}

    token = read("tokenizer_config.json").get("eos_token")
    token = token.get("content") if isinstance(token, dict) else token  # an AddedToken's form
    if token and tokenizer.token_to_id(token) is not None:
        ids.append(tokenizer.token_to_id(token))
    generation = read("generation_config.json").get("eos_token_id")
    for i in generation if isinstance(generation, list) else [generation]:
        if isinstance(i, int) and i not in ids:
            ids.append(i)
    return ids


def greedy(
    logits: Callable,
    prompt_ids: list[int],
    steps: int,
    eos: list[int],
    agree: Callable | None = None,
    margins: list[float] | None = None,
    stop: Callable | None = None,
) -> list[int]:
    """Up to ``steps`` greedy ids after ``prompt_ids``; ``logits([1, L] ids) -> [1, L, vocab]``.
    ``agree`` makes every rank continue with the same id (rank 0's); ``margins`` receives each
    step's best logit minus the second best (how near a tie the choice was); ``stop(ids)`` ends
    the sample early once true of the ids so far (judged on the agreed ids: every rank stops)."""
    import torch

    out: list[int] = []
    for _ in range(steps if prompt_ids else 0):  # nothing to condition on: no sample
        last = logits(torch.tensor([prompt_ids + out]))[0, -1].float()
        token = int(last.argmax())
        if margins is not None:
            top = last.topk(2).values if last.numel() > 1 else last.repeat(2)
            margins.append(float(top[0] - top[1]))
        out.append(agree(token) if agree is not None else token)
        if out[-1] in eos or (stop is not None and stop(out)):
            break
    return out


def _rank0_id(group, token: int) -> int:
    import torch
    import torch.distributed as dist

    flag = torch.tensor([token], dtype=torch.long)
    dist.broadcast(flag, src=0, group=group)  # gloo, CPU: the accelerator's stream is not touched
    return int(flag.item())


def sample_on_ranks(
    model, config: SampleConfig, group=None, max_len: int | None = None, round_to: str = "", **facts
) -> dict:
    """Every rank: the samples of ``model`` (one torchtitan model part), computed in float32;
    rank 0 writes them. ``group``: a gloo group of every rank (None: one process); ``max_len``:
    the model's positions (training.seq_len); ``round_to``: a dtype the weights are rounded to
    meanwhile (an HF export's; empty: none); ``facts`` go into samples.json."""
    import contextlib

    import torch
    import torch.distributed as dist

    from qwen3_trainium.rank.float32_forward import float32_forward
    from qwen3_trainium.rank.probe import rounded_weights

    with float32_forward(model):  # resharded: the parameters are the float32 masters
        weights = next(model.parameters())
        with rounded_weights(model, getattr(torch, round_to)) if round_to else contextlib.nullcontext():
            samples, eos = _decode(model, config, group, max_len)
    record = {
        "tokens": config.tokens,
        "eos_ids": eos,
        "tokenizer_dir": config.tokenizer_dir,
        "chat_template": config.chat_template,
        "max_len": max_len,
        "weights_dtype": str(weights.dtype).removeprefix("torch."),
        "rounded_to": round_to or None,
        "compute_dtype": "float32",
        "device": weights.device.type,
        "neuron_cc_flags": os.environ.get("NEURON_CC_FLAGS", ""),
        **facts,
        "samples": samples,
    }
    if not dist.is_initialized() or dist.get_rank() == 0:
        write(config.path, record)
    return record


def _decode(model, config: SampleConfig, group, max_len: int | None) -> tuple[list[dict], list[int]]:
    """Each prompt's sample, and the EOS ids they end at."""
    import functools

    from tokenizers import Tokenizer

    from qwen3_trainium.rank.probe import PROBE_MULTIPLE, model_logits

    tokenizer = Tokenizer.from_file(os.path.join(config.tokenizer_dir, "tokenizer.json"))
    eos = eos_ids(config.tokenizer_dir, tokenizer)
    agree = functools.partial(_rank0_id, group) if group is not None else None
    # the k-th id is read off a forward of prompt + k - 1 ids, which model_logits pads to a multiple
    # of 256; torchtitan's Decoder sizes its RoPE cache to training.seq_len and fails past it
    # (torchtitan/models/common/decoder.py: update_from_config)
    limit = max_len // PROBE_MULTIPLE * PROBE_MULTIPLE if max_len else None
    samples = []
    chat = None
    if config.chat_template:
        from qwen3_trainium.data.chat.template import ChatTokenizer

        chat = ChatTokenizer.load(config.tokenizer_dir, config.chat_template)
        eos = eos + [chat.end_of_turn_id] if chat.end_of_turn_id not in eos else eos
    for prompt in config.prompts:
        ids = chat.prompt_ids(prompt, **config.chat_template_kwargs) if chat else tokenizer.encode(prompt).ids
        steps = config.tokens if limit is None else max(0, min(config.tokens, limit - len(ids) + 1))
        margins: list[float] = []
        out = greedy(functools.partial(model_logits, model), ids, steps, eos, agree, margins)
        text = tokenizer.decode(out, skip_special_tokens=False)
        samples.append(
            {"prompt": prompt, "prompt_ids": ids, "max_new_tokens": steps, "generated_ids": out, "text": text}
            | {"margins": margins}
        )
    return samples, eos


def cut_short(record: dict) -> list[dict]:
    """The samples whose prompt left no room for every token (``max_len``)."""
    return [s for s in record["samples"] if s.get("max_new_tokens", record["tokens"]) < record["tokens"]]


def _read_json(path: str):
    with open(path) as f:
        return json.load(f)


def _atomic(path: str, text: str) -> None:
    with open(f"{path}.tmp", "w") as f:
        f.write(text)
    os.replace(f"{path}.tmp", path)


def write(path: str, record: dict) -> None:
    """samples.json at ``path`` and samples.md beside it."""
    _atomic(path, json.dumps(record, indent=2) + "\n")
    _atomic(os.path.join(os.path.dirname(path), SAMPLES_MD), render(record))


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first token index where the two differ (one ending early included); None: equal."""
    if a == b:
        return None
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _cell(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace("|", "\\|").replace("\n", "<br>")


def render(record: dict) -> str:
    """samples.md: prompt and the trained model's continuation, and the export's beside it."""
    export = record.get("export")
    facts = f"weights {record['weights_dtype']}"
    if record.get("rounded_to") not in (None, record["weights_dtype"]):
        facts += f" rounded to {record['rounded_to']} (what the HF export holds)"
    facts += f", computed in {record.get('compute_dtype', record.get('mixed_precision_param'))}"
    if record.get("mixed_precision_param"):
        facts += f"; trained in {record['mixed_precision_param']} (training.mixed_precision_param)"
    lines = [
        f"# Greedy samples after step {record.get('step', '?')}",
        "",
        f"Up to {record['tokens']} new tokens per prompt, ending at an EOS id {record['eos_ids']}; {facts}.",
    ]
    head = "| prompt | trained model (ranks) |"
    if export:
        lines += ["", f"HF export `{export['dir']}`: `AutoModelForCausalLM.generate(do_sample=False)`."]
        head += " HF export (generate) |"
    lines += ["", head, "|---" * head.count(" |") + "|"]
    for i, sample in enumerate(record["samples"]):
        row = f"| {_cell(sample['prompt'])} | {_cell(sample['text'])} |"
        lines.append(row + (f" {_cell(export['texts'][i])} |" if export else ""))
    lines.append("")
    for i, sample in enumerate(record["samples"]):
        notes = []
        if export:
            k, margin = export["first_difference"][i], export.get("margin_at_difference", [None] * (i + 1))[i]
            notes.append("identical" if k is None else f"differs at token {k}")
            if margin is not None:
                notes.append(
                    f"the ranks' margin there {margin:.2e} (near tie: at most {export['tie_margin']:.0e})"
                )
        if sample in cut_short(record):
            notes.append(f"cut at {sample['max_new_tokens']} tokens (training.seq_len={record['max_len']})")
        if notes:
            lines.append(f"- `{sample['prompt']}`: {'; '.join(notes)}")
    return "\n".join(lines) + "\n"
