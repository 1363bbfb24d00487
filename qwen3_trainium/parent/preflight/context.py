"""Pre-flight for context parallel (``parallel.context_parallel_degree``): which paths and
attention backends can shard the sequence, and the lengths that divide, before any process starts.

Where CP runs (docs/context_parallel.md): model=native and model=nki_moe with ``sdpa`` or
``causal`` (this project's attention: ``models/context_parallel.py``, any device), or with
``flex`` on CUDA/Neuron (torchtitan's own FlexAttention CP). Not with torchtitan's ``varlen``
(its Qwen3 config refuses it: ``torchtitan/models/qwen3/model.py``), nor model=hf (see
``_hf``). Imports neither torch nor torchtitan: the quick tier runs it.
"""

from __future__ import annotations

from qwen3_trainium.config.choices import AttnBackend, ModelPath
from qwen3_trainium.config.flavors import MOE_FLAVORS
from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.models.kernels.rules import seq_multiple
from qwen3_trainium.parent.preflight.problem import Problem

KEY = "parallel.context_parallel_degree"
FLEX_BLOCK = 128  # BlockMask rows: torch's CP shards whole Q blocks (_context_parallel/_attention.py)


def check_context_parallel(run: RunConf) -> list[Problem]:
    cp = run.parallel.context_parallel_degree
    if cp <= 1:
        return []
    refused = _path(run, cp) or _whole_rows(run)
    if refused:
        return refused
    return _lengths(run, cp)


def _path(run: RunConf, cp: int) -> list[Problem]:
    """The paths and backends CP cannot run."""
    backend = run.model.attn_backend
    if run.model.path is ModelPath.hf:
        return [_hf(run, cp)]
    if backend is AttnBackend.varlen:
        what = "torchtitan refuses CP with its varlen attention (models/qwen3/model.py: 'Varlen attention is not supported with CP')"
        return [
            Problem(
                "model.attn_backend",
                backend.value,
                what,
                "model.attn_backend=sdpa (this project's CP: every device)",
            )
        ]
    return []


def _hf(run: RunConf, cp: int) -> Problem:
    """model=hf: torchtitan's transformers backend shards attention for CP only through its flex
    kernels (``experiments/transformers_modeling_backend/parallelize.py``), and this project runs
    HF's ``sdpa`` with dense document masks (``models/hf_model.py``): each rank would attend to its
    own slice of keys only, silently. The native model loads the same HF checkpoint."""
    source = run.model.hf_model or "<the HF checkpoint directory>"
    fix = (
        f"model=native (or nki_moe for a MoE) {KEY}={cp} checkpoint.enable=true checkpoint.initial_load_path={source}"
        f" checkpoint.initial_load_in_hf=true, or {KEY}=1"
    )
    what = "model=hf shards attention only through torchtitan's flex kernels; its sdpa path would attend to local keys only"
    return Problem(KEY, cp, what, fix)


def _lengths(run: RunConf, cp: int) -> list[Problem]:
    """training.seq_len against every rule CP adds: the trainer's head-tail split (each of the
    2 x cp chunks whole, sequence parallel included), MoE's token dispatcher, rope_hf's rows per
    rank, FlexAttention's BlockMask rows."""
    par, seq = run.parallel, run.training.seq_len
    tp = par.tensor_parallel_degree
    sp = tp if par.enable_sequence_parallel else 1
    rules = [
        (sp * 2 * cp, f"torchtitan's trainer splits each row into 2 x {cp} chunks (x sequence parallel {sp})")
    ]
    if run.model.flavor in MOE_FLAVORS and tp > 1:
        rules.append(
            (
                cp * tp,
                f"the MoE token dispatcher splits each rank's tokens {tp} ways (context x tensor parallel)",
            )
        )
    if run.model.path is ModelPath.nki_moe and "rope_hf" in run.model.kernels:
        lnc = run.device.lnc
        rules.append(
            (
                cp * seq_multiple(lnc),
                f"rope_hf needs each rank's {seq // cp} rows a multiple of 128 x LNC {lnc}",
            )
        )
    if run.model.attn_backend is AttnBackend.flex:
        rules.append(
            (cp * FLEX_BLOCK, f"torch's FlexAttention CP shards whole {FLEX_BLOCK}-row BlockMask blocks")
        )
    for multiple, why in rules:
        if seq % multiple:
            fix = (
                f"training.seq_len={(seq // multiple + 1) * multiple} (a multiple of {multiple}), or {KEY}=1"
            )
            return [
                Problem(
                    "training.seq_len", seq, f"must be a multiple of {multiple} with {KEY}={cp}: {why}", fix
                )
            ]
    return []


WHOLE_ROWS = (
    "runs whole prompts on every rank, and CP attention needs rows the trainer split over the CP ranks"
)


def _whole_rows(run: RunConf) -> list[Problem]:
    """The forwards outside the training and validation steps (the probe and decode of
    ``rank/probe.py``, ``rank/samples.py``, the passkey eval) feed every rank the same whole
    sequence: refused under CP, each with its switch. Held-out validation is split like training."""
    problems = []
    if run.eval.enable and run.eval.sample_tokens > 0 and run.eval.sample_prompts:
        problems.append(
            Problem(
                "eval.sample_tokens",
                run.eval.sample_tokens,
                f"greedy samples: {WHOLE_ROWS}",
                f"eval.sample_tokens=0 (validation still runs), or {KEY}=1",
            )
        )
    if run.eval.long_context:
        problems.append(
            Problem(
                "eval.long_context",
                True,
                f"the passkey eval: {WHOLE_ROWS}",
                f"eval.long_context=false, or {KEY}=1",
            )
        )
    ckpt = run.checkpoint
    if ckpt.enable and ckpt.last_save_in_hf and ckpt.export_check:
        problems.append(
            Problem(
                "checkpoint.export_check",
                True,
                f"the export check's probe: {WHOLE_ROWS}",
                f"checkpoint.export_check=false (the export is still written), or {KEY}=1",
            )
        )
    return problems
