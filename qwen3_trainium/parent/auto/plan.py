"""``parallel=auto``: the layout that fits and runs fastest, chosen before launch.

1. **Enumerate** the legal layouts (``candidates.py``: TP, CP, EP, activation checkpointing, local
   batch; pre-flight's own rules).
2. **Screen** every one with the memory estimate (milliseconds each) and a predicted step time
   (FLOPs at the peak plus ``comm.py``'s exposed communication, ``score.py``). A layout whose
   estimate is over ``SCREEN`` x the limit (``score.HEADROOM``, 90% of the rank's memory) is out: the estimate has read up to 1.34x the
   trace on the docs' trn2 lines (``tests/parent/test_readme_trainium.py``), so below that a
   layout might still fit.
3. **Trace** the best few (``memory/trace.py``: the second step as rank 0 on fake tensors), in
   order of predicted step time, as many at once as there are cores, until ``parallel.auto_traces``
   of them are traced, none left untraced would be faster than the best that fits, or another
   round, as long as the last, would end past ``parallel.auto_budget`` seconds. The trace replaces the estimate and its roofline
   the FLOP count; an untraced row is scaled by what the most similar traced row measured
   (``score.calibrate``).
4. **Choose** the fastest traced layout that fits. One the trace says does not fit is never
   chosen; with none, the job is refused.

The plan is remembered with the pre-flight cache (the same key: config, code, versions, inputs;
plus the host's cores), so the same job plans in milliseconds the second time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from qwen3_trainium.config import devices
from qwen3_trainium.config.schema import MemoryMode, RunConf
from qwen3_trainium.memory import comm, estimate
from qwen3_trainium.memory.model_shape import ModelShape
from qwen3_trainium.parent import compose
from qwen3_trainium.parent.auto import candidates, score
from qwen3_trainium.parent.auto.score import Scored
from qwen3_trainium.shared import lifeline

SCREEN = 1.35  # estimate / limit above which a layout cannot fit (the estimate reads <= 1.34x the trace)
PLAN_JSON, PLAN_MD = "auto_plan.json", "auto_plan.md"


@dataclass
class Plan:
    rows: list[Scored]  # ranked: the winner first, then fitting rows by step time, then the rest
    refused: Counter
    world: candidates.World
    seconds: float = 0.0
    seq_len: int = 0
    peak_flops: float = 0.0
    flops_per_token: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def winner(self) -> Scored | None:
        return self.rows[0] if self.rows and self.rows[0].verdict == "winner" else None


def _capacity(run: RunConf, nproc: int) -> int | None:
    info = devices.device_info(
        run.device.type.value, lnc=run.device.lnc, instance=run.device.instance, nproc=nproc
    )
    return info.memory_per_rank


def _peak_flops(run: RunConf, ceilings) -> float:
    half = run.training.mixed_precision_param.value == "bfloat16" and run.device.type.value != "cpu"
    return ceilings.bf16_flops if half else ceilings.fp32_flops


def ceilings(run: RunConf, nproc: int):
    """One rank's roofline ceilings: the device table's on Trainium, measured on a CPU."""
    if run.device.type.value == "neuron":
        return devices.NEURON_INSTANCES[run.device.instance].roofline_per_rank(run.device.lnc)
    from qwen3_trainium.memory import cpu_roofline

    return cpu_roofline.measure(max((os.cpu_count() or 1) // max(nproc, 1), 1))


def make_plan(run: RunConf, run_dir: str, shape: ModelShape, flops_per_token: float) -> Plan:
    start = time.perf_counter()
    world = candidates.world_of(run, os.cpu_count() or 1)
    legal, refused = candidates.legal(run, shape, world)
    plan = Plan([], refused, world, seq_len=run.training.seq_len, flops_per_token=flops_per_token)
    limits = {size: ceilings(run, min(size, world.ranks_per_node)) for size in world.sizes}
    plan.peak_flops = _peak_flops(run, limits[max(world.sizes)])
    rows = []
    for layout, candidate in legal:
        nproc = min(layout.world, world.ranks_per_node)
        capacity = _capacity(run, nproc)
        peak = _peak_flops(run, limits[layout.world])
        row = Scored(layout, candidate, capacity, score.screen(candidate, layout, shape, capacity),
                     score.flops_seconds(layout, flops_per_token, run.training.seq_len, peak))  # fmt: skip
        row.overrides = candidates.overrides(run, layout)
        rows.append(row)
    fabrics = {size: comm.fabric_for(run.device.type.value, instance=run.device.instance, lnc=run.device.lnc,
                                     ranks_per_node=min(size, world.ranks_per_node)) for size in world.sizes}  # fmt: skip
    _predict(rows, shape, fabrics)
    tracing = run.memory.mode is not MemoryMode.estimate
    if tracing:
        _trace_best(run, run_dir, rows, shape, fabrics, limits, plan, start)
    else:
        plan.notes.append("memory=estimate: planned on the estimate alone, no layout traced")
    plan.rows = _rank(rows, tracing)
    plan.seconds = time.perf_counter() - start
    return plan


def _predict(rows: list[Scored], shape: ModelShape, fabrics) -> None:
    """Every row's compute (traced, or its FLOPs scaled by the most similar traced row's) and communication."""
    for row in rows:
        if not row.traced:
            row.compute_seconds = row.flops_seconds * score.calibrate(row, rows)
        score.price_comm(row, shape, fabrics[row.layout.world])


def _may_fit(row: Scored) -> bool:
    if row.traced:
        return row.fits
    return not row.capacity or row.estimate <= SCREEN * score.HEADROOM * row.capacity


def _next(rows: list[Scored], count: int) -> list[Scored]:
    """The untraced rows to trace next. Before any traced row fits: the fastest whose estimate
    fits (the likely winner) and the fastest that may fit at all (the screen's best, if another);
    then the fastest that may fit while they could beat the best traced row that fits."""
    best = min((r.step_seconds for r in rows if r.traced and r.fits), default=float("inf"))
    open_rows = [
        r for r in rows if not r.traced and not r.trace_error and _may_fit(r) and r.step_seconds < best
    ]
    ordered = sorted(open_rows, key=lambda r: (r.step_seconds, r.estimate))
    if best == float("inf"):
        safe = [r for r in ordered if not r.capacity or r.estimate <= score.HEADROOM * r.capacity]
        ordered = [*safe[:1], *[r for r in ordered if r not in safe[:1]]]
    return ordered[:count]


def _trace_best(run, run_dir, rows, shape, fabrics, limits, plan: Plan, start: float) -> None:
    """Trace in rounds of as many layouts as there are cores (one helper process each). After
    the first, a round starts only if, lasting as long as the last one, it ends within
    ``parallel.auto_budget`` seconds of the plan's start."""
    limit, budget = run.parallel.auto_traces, run.parallel.auto_budget
    traced, last_round = 0, 0.0
    slots = max(min(os.cpu_count() or 1, limit), 1)
    while True:
        fitting = any(r.traced and r.fits for r in rows)
        if fitting and traced >= limit:
            break
        if fitting and time.perf_counter() - start + last_round > budget:
            plan.notes.append(
                f"stopped tracing: another round (about {last_round:.0f} s, as the last) would end past parallel.auto_budget={budget} s"
            )
            break
        if traced >= 3 * limit:  # none of them fits: the plan ends without a winner
            break
        batch = _next(rows, slots if not fitting else min(slots, limit - traced))
        if not batch:
            break
        began = time.perf_counter()
        results = trace_rows(run_dir, [r.run for r in batch], limits)
        last_round = time.perf_counter() - began
        for row, (result, why) in zip(batch, results, strict=True):
            traced += 1
            if result is None:
                row.trace_error = why
                continue
            row.trace = result
            row.compute_seconds = result.step_seconds * row.layout.accum
        _predict(rows, shape, fabrics)


def trace_rows(run_dir: str, runs: list[RunConf], limits: dict) -> list[tuple[object | None, str]]:
    """[(the Trace of each run, "") or (None, why)]: each in its own helper process, all at once
    (``memory/trace.py``), with the roofline ceilings of its rank."""
    from qwen3_trainium.config import runconfig
    from qwen3_trainium.memory.trace import Trace

    folder = os.path.join(run_dir, "auto")
    os.makedirs(folder, exist_ok=True)
    procs = []
    for i, run in enumerate(runs):
        path = compose.save(run, folder, f"trace{i}.yaml")
        c = limits[runconfig.degrees(run).world]
        ceilings = ",".join(
            str(float(v)) for v in (c.bf16_flops, c.fp32_flops, c.bytes_per_second, c.op_seconds)
        )
        command = [sys.executable, "-m", "qwen3_trainium.memory.trace", folder, path, "--ceilings", ceilings]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # fake tensors compute nothing
        procs.append((path, run, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                                  env=env, preexec_fn=lifeline.preexec(os.getpid()))))  # fmt: skip
    results = []
    for path, run, proc in procs:
        try:
            out, err = proc.communicate(timeout=run.memory.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            results.append((None, f"the trace took longer than memory.timeout={run.memory.timeout} s"))
            continue
        finally:
            os.remove(path)
        lines = out.strip().splitlines()
        if proc.returncode or not lines:
            last = [line for line in err.strip().splitlines() if line.strip()][-1:] or ["no output"]
            results.append((None, f"the trace failed (exit {proc.returncode}): {last[0].strip()}"))
            continue
        results.append((Trace(**json.loads(lines[-1])), ""))
    return results


def _rank(rows: list[Scored], tracing: bool = True) -> list[Scored]:
    """The winner (the fastest traced row that fits; with memory=estimate, the fastest whose
    estimate fits), then every other row by whether it may fit and its step time, each with why
    it lost."""
    winners = [r for r in rows if r.fits and (r.traced or not tracing)]
    best = min(winners, key=lambda r: r.step_seconds) if winners else None
    order = sorted(rows, key=lambda r: (r is not best, not _may_fit(r), r.step_seconds, r.estimate))
    for row in order:
        row.verdict = _verdict(row, best)
    return order


def _verdict(row: Scored, best: Scored | None) -> str:
    gib = estimate.GiB
    if row is best:
        return "winner"
    if row.trace_error:
        return f"not traced: {row.trace_error}"
    if row.traced and not row.fits:
        return f"does not fit: traced {row.peak / gib:.2f} GiB > 90% of {row.capacity / gib:.2f} GiB"
    if not _may_fit(row):
        return f"does not fit: estimated {row.estimate / gib:.2f} GiB > {SCREEN} x 90% of {row.capacity / gib:.2f} GiB"
    if best is None:
        return "not confirmed by a trace"
    slower = 100 * (row.step_seconds / best.step_seconds - 1) if best.step_seconds else 0.0
    if slower < 0:  # only where tracing stopped early (parallel.auto_traces, auto_budget)
        return f"not traced: predicted {-slower:.1f}% faster (estimated {row.estimate / gib:.2f} GiB; beyond parallel.auto_traces / auto_budget)"
    how = "" if row.traced else " (estimated)"
    return f"slower by {slower:.1f}%{how}"


def as_json(plan: Plan, run: RunConf) -> dict:
    seq = plan.seq_len
    rows = []
    for i, row in enumerate(plan.rows, 1):
        tps = row.tokens_per_second(seq)
        rows.append({
            "rank": i, "layout": row.layout.name(), "overrides": row.overrides, **asdict(row.layout),
            "dp_shard": row.layout.dp_shard, "peak_bytes": row.peak, "estimate_bytes": row.estimate,
            "peak_source": "traced" if row.traced else "estimated",
            "fits": row.fits if row.traced else _may_fit(row), "capacity_bytes": row.capacity,
            "compute_seconds": row.compute_seconds, "comm_seconds": row.comm.exposed if row.comm else 0.0,
            "comm_parts": dict(row.comm.parts) if row.comm else {}, "step_seconds": row.step_seconds,
            "tokens_per_second": tps, "mfu": plan.flops_per_token * tps / plan.peak_flops if plan.peak_flops else 0.0,
            "verdict": row.verdict,
            "trace": asdict(row.trace) if row.traced else None,
        })  # fmt: skip
    return {
        "device": run.device.type.value, "world": max(plan.world.sizes), "nnodes": plan.world.nnodes,
        "seq_len": seq, "global_batch": rows[0]["local_batch"] * rows[0]["dp_shard"] * rows[0]["accum"] if rows else 0,
        "candidates": len(plan.rows), "refused": dict(plan.refused), "planning_seconds": plan.seconds,
        "traced": sum(1 for r in plan.rows if r.traced), "winner": 0 if plan.winner else None,
        "notes": plan.notes, "rows": rows,
    }  # fmt: skip
