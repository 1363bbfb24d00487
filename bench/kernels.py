"""Kernel references vs torchtitan's defaults on CPU: same shapes, forward + backward, side by side.

- rope: torchtitan ``CosSinRoPE`` vs ``NkiRoPE`` (the ``qwen3_trainium::rope_hf`` op, reference path)
- MoE:  torchtitan ``MoE`` (grouped_mm experts) vs the same layer with the ``moe_experts``
  override (``qwen3_trainium::moe_blockwise``, reference path: blocks of 256 tokens)
Interleaved repetitions; prints median milliseconds and the ratio (ours / torchtitan). On CPU
this measures the cost of the block packing and the custom-op plumbing; on Trainium the NKI
kernels replace the reference compute.

    python bench/kernels.py [--reps 15] [--tokens 2048]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from qwen3_trainium.config import flavors  # noqa: E402


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def side_by_side(name: str, baseline, ours, reps: int) -> None:
    baseline(), ours()  # warm-up
    times = {"torchtitan": [], "ours": []}
    for r in range(reps):
        pair = [("torchtitan", baseline), ("ours", ours)]
        for kind, fn in pair if r % 2 == 0 else reversed(pair):
            times[kind].append(_time(fn))
    t, o = statistics.median(times["torchtitan"]), statistics.median(times["ours"])
    print(
        f"{name:34s} torchtitan {t:8.2f} ms   ours {o:8.2f} ms   ratio ours/torchtitan {o / t:6.3f}",
        flush=True,
    )


def rope_pair(batch: int, seq: int, heads: int, kv_heads: int, dim: int):
    from torchtitan.models.common.rope import CosSinRoPE

    from qwen3_trainium.models.overrides.nki import NkiRoPE

    titan = CosSinRoPE(CosSinRoPE.Config(dim=dim, max_seq_len=max(4096, seq), theta=1e6))
    ours = NkiRoPE(NkiRoPE.Config(dim=dim, max_seq_len=max(4096, seq), theta=1e6))
    q = torch.randn(batch, seq, heads, dim, requires_grad=True)
    k = torch.randn(batch, seq, kv_heads, dim, requires_grad=True)
    positions = torch.arange(seq).repeat(batch, 1)

    def step(module):
        def run():
            qo, ko = module(q, k, positions)
            (qo.sum() + ko.sum()).backward()

        return run

    return step(titan), step(ours)


def moe_pair(tokens: int):
    from torchtitan.config import OverrideConfig, apply_overrides
    from torchtitan.models.common.moe import MoE

    spec = flavors.model_spec("tiny_moe", "varlen")
    spec.model.layers = spec.model.layers[:1]
    titan_cfg = copy.deepcopy(spec.model.layers[0].moe)
    apply_overrides(
        OverrideConfig(imports=[("qwen3_trainium.models.overrides.nki.moe_experts", {"block_size": 256})]),
        spec,
    )
    torch.manual_seed(0)
    titan, ours = MoE(titan_cfg), MoE(spec.model.layers[0].moe)
    with torch.no_grad():
        for p in titan.parameters():
            p.normal_(std=0.02)
        titan.expert_bias_E.zero_()
    ours.load_state_dict(titan.state_dict())
    x = torch.randn(1, tokens, titan_cfg.routed_experts.inner_experts.dim, requires_grad=True)

    def step(module):
        def run():
            module(x).sum().backward()

        return run

    return step(titan), step(ours)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=2048)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.reps} (forward + backward)"
    )
    side_by_side("rope  B2 S1024 Hq16 Hk4 D128", *rope_pair(2, 1024, 16, 4, 128), args.reps)
    side_by_side("rope  B1 S4096 Hq32 Hk4 D128", *rope_pair(1, 4096, 32, 4, 128), args.reps)
    side_by_side(f"MoE   tiny_moe E8 top2 T{args.tokens}", *moe_pair(args.tokens), args.reps)
    side_by_side(
        f"MoE   tiny_moe E8 top2 T{4 * args.tokens}", *moe_pair(4 * args.tokens), max(args.reps // 3, 3)
    )


if __name__ == "__main__":
    main()
