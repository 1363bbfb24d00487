"""On-device checks: `make test-neuron` (pytest -m neuron) on a trn2, `make test-gpu` (pytest -m gpu)
on CUDA. Each is collected everywhere and skipped, with a reason naming the device, where that
device is absent (conftest.py). Every figure lands in trn2_report.md / gpu_report.md.

What they prove on a trn2.48xlarge: the installed nkilib takes the parameters this code passes;
rope_hf on the device equals torchtitan's CosSinRoPE exactly in float32 (outputs and gradients:
the guide's rule); the blockwise MoE kernels match the reference within stated tolerances; a
10-step batch-1 smoke of each path on 64 ranks; the HBM estimate against the driver's peak
(what the device used beyond the estimate within the 10% of a rank pre-flight passes silently);
the HBM watch's peak (torch.accelerator's on SDK 2.34, else the driver's) against the traced step
peak of the same job, by the same rule.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import read_metrics, run_launch

from qwen3_trainium.models.kernels import moe, neuron
from tests.support import hbm_against_driver as hbm

PATHS = ["native", "hf", "nki_moe"]
SMOKE_TIMEOUT = 3 * 3600  # the first run on a trn2 compiles every graph (cached afterwards)
MOE_TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}  # max abs diff / max abs reference
WATCHED_SOURCE = {(1.0,): "accelerator peak reserved", (0.0,): "driver peak"}  # watched_from_accelerator


def _smoke(tmp_path_factory, cache: dict, key: str, path: str, *overrides: str) -> dict:
    """One 10-step batch-1 smoke run per key and session: its output and metrics."""
    if key in cache:
        return cache[key]
    run_dir = tmp_path_factory.mktemp(f"smoke-{key}")
    proc = run_launch(
        f"model={path}",
        "smoke=on",
        "tracking=off",
        *overrides,
        f"hydra.run.dir={run_dir}",
        timeout=SMOKE_TIMEOUT,
    )
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    cache[key] = {"proc": proc, "rows": rows}
    return cache[key]


def _traced_step_peak(tmp_path_factory, path: str, *overrides: str) -> tuple[float, float]:
    """(step peak, capacity) in GiB that a ``memory=trace`` dry run of the smoke job prints."""
    run_dir = tmp_path_factory.mktemp(f"trace-{path}")
    args = (f"model={path}", "smoke=on", "tracking=off", *overrides, "dry_run=true", "memory=trace")
    proc = run_launch(*args, f"hydra.run.dir={run_dir}", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return hbm.trace_from_dry_run(proc.stdout)


def _check_smoke(result: dict) -> dict:
    proc, rows = result["proc"], result["rows"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [r["step"] for r in rows] == list(range(1, 11))
    assert all(math.isfinite(float(r["loss"])) for r in rows)
    return rows[-1]


def _smoke_figure(last: dict) -> str:
    tokens, mfu = last.get("tokens_per_second", 0), last.get("mfu_pct", "n/a")
    return f"final loss {last['loss']:.4f}, {tokens:.0f} tok/s, MFU {mfu}"


@pytest.fixture(scope="session")
def smoke_runs():
    return {}


# Trainium ---------------------------------------------------------------------------------------


@pytest.mark.neuron
def test_installed_nkilib_takes_the_parameters_we_pass(device_report):
    mismatches = neuron.signature_mismatches()
    import nkilib

    version = getattr(getattr(nkilib, "version", None), "__version__", "unknown")
    figure = f"nkilib {version}; checked against {neuron.NKI_LIBRARY_CHECKED}"
    device_report.add("neuron", "nkilib signatures", figure, "; ".join(mismatches) or "pass")
    assert mismatches == []


@pytest.mark.neuron
@pytest.mark.parametrize("shape", [(1, 256, 8, 4, 128), (2, 512, 16, 8, 128)])
def test_rope_hf_on_the_device_equals_cossinrope_exactly(shape, device_report):
    """float32, the same cache on both sides: max abs diff 0 for outputs and gradients."""
    from torchtitan.models.common.rope import CosSinRoPE

    from qwen3_trainium.models.overrides.nki import NkiRoPE

    b, s, hq, hk, d = shape
    config = {"dim": d, "max_seq_len": 4096, "theta": 1e6}
    titan, ours = CosSinRoPE(CosSinRoPE.Config(**config)), NkiRoPE(NkiRoPE.Config(**config))
    ours.cache = titan.cache.clone()
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(b, s, hq, d, generator=gen), torch.randn(b, s, hk, d, generator=gen)
    positions = torch.stack([torch.cat([torch.arange(37 + i), torch.arange(s - 37 - i)]) for i in range(b)])
    grads = [torch.randn(b, s, hq, d, generator=gen), torch.randn(b, s, hk, d, generator=gen)]
    q1, k1 = q.clone().requires_grad_(), k.clone().requires_grad_()
    want = titan(q1, k1, positions)
    want_grads = torch.autograd.grad(want, (q1, k1), grads)
    dev = torch.device("neuron")
    ours = ours.to(dev)
    q2, k2 = q.to(dev).requires_grad_(), k.to(dev).requires_grad_()
    got = ours(q2, k2, positions.to(dev))
    got_grads = torch.autograd.grad(got, (q2, k2), [g.to(dev) for g in grads])
    diffs = [
        (a.cpu() - b).abs().max().item()
        for a, b in zip((*got, *got_grads), (*want, *want_grads), strict=True)
    ]
    device_report.add("neuron", f"rope_hf vs CosSinRoPE, float32 {shape}", f"max abs diff {max(diffs):.3e}")
    assert max(diffs) == 0


@pytest.mark.neuron
@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_blockwise_moe_kernels_on_the_device_match_the_reference(compute_dtype, device_report):
    """Qwen3-30B-A3B's expert width (I=768) at H=2048, 8 experts top-2, 512 tokens."""
    tokens, top_k, experts, dim, inter, block = 512, 2, 8, 2048, 768, 256
    gen = torch.Generator().manual_seed(0)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    scores = torch.rand(tokens, top_k, generator=gen)
    hidden = torch.cat([torch.randn(tokens, dim, generator=gen), torch.zeros(1, dim)])
    gate_up = torch.randn(experts, dim, 2, inter, generator=gen) * dim**-0.5
    down = torch.randn(experts, inter, dim, generator=gen) * inter**-0.5
    args = [hidden, moe.dense_affinities(scores, ids, experts), gate_up, down]
    tpid, b2e = moe.pack_blocks(ids, experts, block)
    leaves = [t.clone().requires_grad_() for t in args]
    want = moe.moe_blockwise(*leaves, tpid, b2e, block, compute_dtype)[0]
    grad_out = torch.randn(want.shape, generator=gen)
    want_grads = torch.autograd.grad(want, leaves, grad_out)
    dev = torch.device("neuron")
    dev_leaves = [t.to(dev).requires_grad_() for t in args]
    got = moe.moe_blockwise(*dev_leaves, tpid.to(dev), b2e.to(dev), block, compute_dtype)[0]
    got_grads = torch.autograd.grad(got, dev_leaves, grad_out.to(dev))
    names = ["out", "d_hidden", "d_affinities", "d_gate_up", "d_down"]
    relative = {
        n: ((a.cpu() - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()
        for n, a, b in zip(names, (got, *got_grads), (want, *want_grads), strict=True)
    }
    worst = max(relative.values())
    limit = MOE_TOLERANCE[compute_dtype]
    figure = ", ".join(f"{n} {v:.2e}" for n, v in relative.items())
    check = f"MoE kernels vs reference, {compute_dtype} (max diff / max |ref|)"
    device_report.add("neuron", check, figure, "pass" if worst <= limit else f"FAIL (> {limit})")
    assert worst <= limit


@pytest.mark.neuron
@pytest.mark.parametrize("path", PATHS)
def test_smoke_on_64_ranks(path, smoke_runs, tmp_path_factory, device_report):
    overrides = ["device=neuron", "parallel=trn2_dp64"] + (
        ["model.flavor=30B-A3B"] if path == "nki_moe" else []
    )
    last = _check_smoke(_smoke(tmp_path_factory, smoke_runs, path, path, *overrides))
    device_report.add("neuron", f"smoke model={path}, 10 steps batch 1, 64 ranks", _smoke_figure(last))


@pytest.mark.neuron
def test_smoke_of_the_grouped_mm_route_on_the_headline_layout(smoke_runs, tmp_path_factory, device_report):
    """AWS's SDK 2.34 MoE route: model=native Qwen3-30B-A3B on torch._grouped_mm, TP4 x FSDP16,
    torchtitan's varlen attention (the headline experiment, 10 steps)."""
    result = _smoke(tmp_path_factory, smoke_runs, "grouped_mm", "native", "experiment=qwen3_30b_a3b_trn2")
    last = _check_smoke(result)
    check = "smoke grouped_mm route (experiment=qwen3_30b_a3b_trn2), 10 steps batch 1, 64 ranks"
    device_report.add("neuron", check, _smoke_figure(last))


@pytest.mark.neuron
def test_hbm_estimate_against_the_drivers_per_core_peak(smoke_runs, tmp_path_factory, device_report):
    """Rank 0's driver peak (its physical cores summed) against pre-flight's estimate: what the
    device used beyond the estimate must fit in the 10% of a rank pre-flight passes silently
    (``tests/support/hbm_against_driver.py``, exercised on CPU by ``test_hbm_against_driver.py``)."""
    result = _smoke(tmp_path_factory, smoke_runs, "native", "native", "device=neuron", "parallel=trn2_dp64")
    _check_smoke(result)
    estimate, capacity = hbm.estimate_from_dry_run(result["proc"].stdout)
    peak = max(float(r.get("neuron_driver_peak_gib", 0)) for r in result["rows"])
    verdict = hbm.compare(estimate, peak, capacity)
    check = "HBM per rank, estimate vs driver peak (model=native smoke)"
    device_report.add("neuron", check, verdict.figure, "pass" if verdict.ok else "FAIL")
    assert verdict.ok, verdict.figure


@pytest.mark.neuron
def test_watched_hbm_peak_against_the_traced_step_peak(smoke_runs, tmp_path_factory, device_report):
    """The native smoke's watched peak (``watched_peak_gib``: torch.accelerator's peak reserved
    where SDK 2.34 provides it, else the driver's; ``rank/hbm_watch.py``) against the step peak a
    ``memory=trace`` dry run of the same job traces for rank 0. The rule is the estimate's
    (``hbm.compare_with_trace``): pre-flight passes a traced peak up to 90% of a rank silently, as
    it does an estimate, so what the device holds beyond the trace must fit in the other 10%."""
    job = ["device=neuron", "parallel=trn2_dp64"]
    result = _smoke(tmp_path_factory, smoke_runs, "native", "native", *job)
    _check_smoke(result)
    traced, capacity = _traced_step_peak(tmp_path_factory, "native", *job)
    rows = result["rows"]
    sources = {r.get("watched_from_accelerator") for r in rows}  # one source per run: a set of one
    name = WATCHED_SOURCE.get(tuple(sources), f"watched peak (sources {sorted(map(str, sources))})")
    peak = max(float(r.get("watched_peak_gib", 0)) for r in rows)
    verdict = hbm.compare_with_trace(traced, (name, peak), capacity)
    allocated = max(float(r.get("accelerator_peak_allocated_gib", 0)) for r in rows)
    figure = verdict.figure + (f"; accelerator peak allocated {allocated:.3f} GiB" if allocated else "")
    check = "HBM per rank, traced step peak vs watched peak (model=native smoke)"
    device_report.add("neuron", check, figure, "pass" if verdict.ok else "FAIL")
    assert verdict.ok, figure


# CUDA -------------------------------------------------------------------------------------------

CUDA = [
    "device=cuda",
    "parallel=cuda_single",
    "model.attn_backend=flex",
    "training.mixed_precision_param=bfloat16",
]


@pytest.mark.gpu
@pytest.mark.parametrize("path", PATHS)
def test_smoke_on_cuda_with_flex_attention_in_bf16(path, smoke_runs, tmp_path_factory, device_report):
    overrides = [o for o in CUDA if not (path == "hf" and o.startswith("model.attn"))]
    last = _check_smoke(_smoke(tmp_path_factory, smoke_runs, f"cuda-{path}", path, *overrides))
    device_report.add("gpu", f"smoke model={path}, flex, bf16, 10 steps", _smoke_figure(last))


@pytest.mark.gpu
def test_hf_and_native_step_one_losses_match_on_cuda(tmp_path, device_report):
    from qwen3_trainium.data import assets

    tiny = str(assets.ensure_hf_model())
    init = [
        f"checkpoint.initial_load_path={tiny}",
        "checkpoint.enable=true",
        "checkpoint.initial_load_in_hf=true",
        "checkpoint.load_only=true",
    ]
    common = [
        "smoke=on",
        "tracking=off",
        "device=cuda",
        "parallel=cuda_single",
        "training.mixed_precision_param=float32",
    ]
    losses = {}
    for path, extra in (("hf", []), ("native", init)):
        run_dir = tmp_path / path
        proc = run_launch(f"model={path}", *common, *extra, f"hydra.run.dir={run_dir}", timeout=1800)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        losses[path] = read_metrics(run_dir)[0]["loss"]
    diff = abs(losses["hf"] - losses["native"])
    device_report.add("gpu", "step-1 loss hf vs native (same weights, float32)", f"{losses} diff {diff:.2e}")
    assert diff <= 1e-4
