"""``parallel=auto``: the launcher plans the layout before anything starts (``plan.py``), prints
the ranked table, writes ``auto_plan.md`` / ``auto_plan.json`` to the run directory, and goes on
with the winner as if the user had typed its overrides: pre-flight checks it (with the winner's
trace, not a second one) and the run launches it. A sweep plans each of its jobs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

from qwen3_trainium.config.schema import MemoryMode, RunConf
from qwen3_trainium.parent.preflight.problem import Problem

FIX = "parallel=<a layout> to choose one by hand, or fewer training.seq_len / local_batch_size, or more nodes"


def choose(run: RunConf, run_dir: str) -> tuple[RunConf | None, list[Problem]]:
    """(the run on the chosen layout, []) or (None, the problems that stop the plan)."""
    from qwen3_trainium.parent.auto import plan, table, winner

    remembered = _load(run, run_dir)
    if remembered is None:
        built = _shape(run, run_dir)
        if isinstance(built, list):
            return None, built
        shape, flops_per_token = built
        made = plan.make_plan(run, run_dir, shape, flops_per_token)
        data = plan.as_json(made, run)
        _store(run, run_dir, data)
    else:
        data = remembered
        data["notes"] = [
            *data["notes"],
            "the plan was remembered (pre-flight cache): planned again with preflight_cache=false",
        ]
    print(f"[qwen3-trainium] {table.text(data, run.parallel.auto_top)}", flush=True)
    json_path, md_path = table.write(data, run_dir, run.parallel.auto_top)
    print(f"[qwen3-trainium] the plan: {md_path} and {json_path}", flush=True)
    if data["winner"] is None:
        why = "; ".join(
            f"{r['layout']} {r['ac']} batch {r['local_batch']}: {r['verdict']}" for r in data["rows"][:3]
        )
        neuron = run.device.type.value == "neuron"
        where = f"device=neuron ({run.device.instance})" if neuron else f"device={run.device.type.value}"
        fix = FIX if neuron else f"{FIX}, or device=neuron to plan for a trn2"
        return None, [
            Problem(
                "parallel",
                "auto",
                f"no layout on {where} fits a rank's memory ({why or 'no legal layout'})",
                fix,
            )
        ]
    best = data["rows"][0]
    chosen = _apply(run, best)
    chosen.memory.mode = MemoryMode.estimate
    if best["trace"] is not None:  # pre-flight reads this trace instead of tracing the winner again
        chosen.memory.mode = MemoryMode.trace
        winner.keep(chosen, run_dir, best["trace"])
    return chosen, []


def _apply(run: RunConf, row: dict) -> RunConf:
    from qwen3_trainium.memory.layout import Layout
    from qwen3_trainium.parent.auto import candidates

    fields = {f.name for f in dataclasses.fields(Layout)}
    return candidates.apply(run, Layout(**{k: v for k, v in row.items() if k in fields}))


def _shape(run: RunConf, run_dir: str):
    """(the model's shape, torchtitan's FLOPs per token) as pre-flight builds them, or problems."""
    import torch

    from qwen3_trainium.memory import estimate
    from qwen3_trainium.parent.preflight.titan import check_titan

    problems, trial = check_titan(run, run_dir)
    if trial is None:
        return problems
    with torch.device("meta"):
        model = trial.model_spec.model.build()
    _, flops = trial.model_spec.model.get_nparams_and_flops(model, run.training.seq_len)
    return estimate.model_shape(trial.model_spec.model, model), float(flops)


def _digest(run: RunConf, run_dir: str) -> str:
    from qwen3_trainium.parent.preflight import cache, installed_versions

    key = cache.key(run, run_dir, launching=False, versions=installed_versions(run))
    return hashlib.sha256(f"auto {key} {os.cpu_count()}".encode()).hexdigest()


def _load(run: RunConf, run_dir: str) -> dict | None:
    if not run.preflight_cache:
        return None
    from qwen3_trainium.parent.preflight import cache

    try:
        with open(cache.cache_dir() / f"auto-{_digest(run, run_dir)}.json") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _store(run: RunConf, run_dir: str, data: dict) -> None:
    if not run.preflight_cache or data["winner"] is None:
        return
    from qwen3_trainium.parent.preflight import cache

    try:
        directory = cache.cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"auto-{_digest(run, run_dir)}.json"
        with open(f"{path}.tmp", "w") as f:
            json.dump(data, f)
        os.replace(f"{path}.tmp", path)
    except OSError:
        pass  # a plan not remembered is only planned again
