"""This CPU's gloo links, measured (``comm.py``'s CPU fabric was fitted from it): the four
collectives on 2 gloo ranks, timed at a few sizes, with ``latency + bytes / rate`` fitted per
kind. For benchmarks: it imports torch and spawns processes."""

from __future__ import annotations

import math

from qwen3_trainium.memory.comm import KINDS


def measure_gloo(sizes: tuple[int, ...] = (1 << 20, 16 << 20, 64 << 20), repeats: int = 3) -> dict:
    """Times the four collectives on 2 gloo ranks of this machine at ``sizes`` (bytes of float32;
    the full tensor, as ``collective_seconds`` counts it) and fits ``latency + bytes / rate`` per
    kind. Returns ``{kind: {"seconds": {size: s}, "latency_s": a, "bytes_per_second": b}}``."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(_gloo_rank, args=(2, f"{tmp}/store", sizes, repeats, queue), nprocs=2, join=True)
        timings = queue.get()
    return {kind: _fit(kind, timings[kind], 2) for kind in KINDS}


def _gloo_rank(rank: int, world: int, store_path: str, sizes, repeats: int, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    timings: dict[str, dict[int, float]] = {kind: {} for kind in KINDS}
    for size in sizes:
        for kind, seconds in _time_collectives(size, world, repeats).items():
            timings[kind][size] = seconds
    if rank == 0:
        queue.put(timings)
    dist.destroy_process_group()


def _time_collectives(size: int, world: int, repeats: int) -> dict[str, float]:
    """The best of ``repeats`` timings of each collective on a ``size``-byte float32 tensor."""
    import time

    import torch
    import torch.distributed as dist

    full, shard = torch.ones(size // 4), torch.ones(size // 4 // world)
    calls = {
        "all_gather": lambda: dist.all_gather_into_tensor(full, shard),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full),
        "all_reduce": lambda: dist.all_reduce(full),
        "all_to_all": lambda: dist.all_to_all_single(torch.empty_like(full), full),
    }
    best = dict.fromkeys(calls, math.inf)
    for kind, call in calls.items():
        call()  # warm-up
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            call()
            best[kind] = min(best[kind], time.perf_counter() - start)
    return best


def _fit(kind: str, seconds: dict[int, float], ranks: int) -> dict:
    """Least squares of ``t = steps x latency + moved / rate`` over the measured sizes."""
    twice = 2 if kind == "all_reduce" else 1
    xs = [twice * (ranks - 1) / ranks * size for size in seconds]
    ys = list(seconds.values())
    n, mx, my = len(xs), sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if n > 1 else ys[0] / xs[0]
    intercept = my - slope * mx
    if intercept < 0:  # no latency to fit: the line through the origin
        slope, intercept = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs), 0.0
    steps = twice * (ranks - 1)
    return {
        "seconds": dict(seconds),
        "latency_s": max(intercept, 0.0) / steps,
        "bytes_per_second": 1 / slope,
    }
