"""This CPU's roofline ceilings for one rank, measured in a fraction of a second.

The roofline (``roofline.py``) prices each aten op of a traced step at
``max(FLOPs / peak, bytes / bandwidth)`` and sums them. On a trn2 the ceilings are AWS's published
figures (``devices.TRN2``); a CPU has no datasheet the project could trust (the same code runs on
laptops, CI machines and cloud VMs of every kind), so ``measure`` times this one:

- ``fp32_flops``: a square float32 matmul (``FP32_N``), big enough to be compute bound (its
  arithmetic intensity is N / 6 FLOP per byte), best of a few after one warm-up;
- ``bf16_flops``: the same in bfloat16, smaller (``BF16_N``): without AVX512-BF16 or AMX a CPU
  emulates it, about 40x slower than float32 (1.3 against 49 GFLOP/s on a 2-core AMD EPYC VM with
  AVX2, this project's CPU machine, 2026-12-07), and a 512 matmul would then take 0.2 s;
- ``bytes_per_second``: ``torch.add(a, b, out=c)`` over ``COPY_BYTES`` per tensor, more than a
  server's last-level cache (32 MiB on that EPYC), counted as the roofline counts bytes: both
  inputs and the output;
- ``op_seconds``: the fixed cost of one aten op (Python and dispatcher overhead, the kernel's
  launch): the median time of adding two 1-element tensors.

Why the roofline needs ``op_seconds`` on a CPU: a small model's step is a few thousand aten ops on
tensors of kilobytes, so FLOPs and bytes price it at a few milliseconds while the step takes
hundreds: the per-op overhead (about 3 us each here) is what the step time is made of. The
roofline adds ``devices.Roofline.op_seconds`` once per op it prices (``roofline.py``).

Each ceiling is for one rank running ``threads`` intra-op threads (a CPU rank gets
``cpu_count // nproc`` of them: ``devices.rank_env``): torch's thread count is set for the
measurement and restored after it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from qwen3_trainium.config.devices import MB, Roofline

FP32_N = 512  # 2 x 512^3 = 0.27 GFLOP: 5.5 ms at 49 GFLOP/s (1 thread, the EPYC above)
BF16_N = 256  # 34 MFLOP: 27 ms where bfloat16 is emulated (1.3 GFLOP/s), well under 1 ms with AMX
MATMUL_REPEATS = 3  # best of, after one warm-up call
COPY_BYTES = 64 * MB  # per tensor: twice the EPYC's 32 MiB L3, so the add streams from memory
COPY_REPEATS = 3
TINY_OPS_PER_SAMPLE = 50  # one perf_counter pair per 50 tiny adds, so the clock's own cost is spread
TINY_SAMPLES = 40  # median of


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` calls of fn, after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_flops(dtype, n: int, repeats: int = MATMUL_REPEATS) -> float:
    """FLOP/s of an n x n by n x n matmul in dtype (2 n^3 FLOPs: torch's ``mm_flop``)."""
    import torch

    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n**3 / best_seconds(lambda: torch.mm(a, b), repeats)


def add_bytes_per_second(nbytes: int = COPY_BYTES, repeats: int = COPY_REPEATS) -> float:
    """Bytes read and written per second by a float32 add of nbytes-sized tensors into a third."""
    import torch

    n = nbytes // 4
    a, b, c = torch.ones(n), torch.ones(n), torch.empty(n)
    return 3 * n * 4 / best_seconds(lambda: torch.add(a, b, out=c), repeats)


def tiny_op_seconds(per_sample: int = TINY_OPS_PER_SAMPLE, samples: int = TINY_SAMPLES) -> float:
    """Median seconds of one add of two 1-element tensors: the cost every aten op pays."""
    import torch

    x, y = torch.ones(1), torch.ones(1)
    x + y
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        for _ in range(per_sample):
            x + y
        times.append((time.perf_counter() - start) / per_sample)
    return statistics.median(times)


def measure(threads: int) -> Roofline:
    """This CPU's ceilings for one rank with ``threads`` intra-op threads (0.4 s on the EPYC above,
    most of it the emulated bfloat16 matmul)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(threads, 1))
    try:
        return Roofline(
            bf16_flops=matmul_flops(torch.bfloat16, BF16_N),
            fp32_flops=matmul_flops(torch.float32, FP32_N),
            bytes_per_second=add_bytes_per_second(),
            op_seconds=tiny_op_seconds(),
        )
    finally:
        torch.set_num_threads(before)
