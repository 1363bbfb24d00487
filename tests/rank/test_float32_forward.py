"""``rank/float32_forward.py`` on real FSDP2 (two gloo processes, bfloat16 all-gathers as
training.mixed_precision_param=bfloat16 makes them): within, the forward equals a plain float32
copy of the model; after, training goes on bit-identical to a twin that never entered it."""

from __future__ import annotations

import copy
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2


def _model() -> nn.Module:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)) for _ in range(3)]
    return nn.Sequential(nn.Embedding(64, 32), *blocks, nn.LayerNorm(32), nn.Linear(32, 64))


def _sharded(model: nn.Module) -> nn.Module:
    """As torchtitan shards a decoder: each block, the head without reshard after forward
    (torchtitan/distributed/fsdp.py), then the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False
    )
    for block in model[1:4]:
        fully_shard(block, mp_policy=policy)
    fully_shard([model[4], model[5]], mp_policy=policy, reshard_after_forward=False)
    fully_shard(model, mp_policy=policy)
    for module in model.modules():
        if hasattr(module, "set_force_sum_reduction_for_comms"):
            module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM (STACK.md)
    return model


def _step(model, optimizer, tokens) -> float:
    loss = model(tokens).float().logsumexp(-1).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def _full(model) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor() for k, v in model.state_dict().items()}


def _worker(rank: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from qwen3_trainium.rank.float32_forward import float32_forward

    plain = _model()
    probed, twin, first = (_sharded(copy.deepcopy(plain)) for _ in range(3))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (probed, twin, first)]
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(rank))
    probe = torch.arange(16).unsqueeze(0)
    with torch.no_grad(), float32_forward(first):  # this process's first forward of `first`
        first(probe)
    losses = {"probed": [], "twin": [], "first": []}
    for step in range(4):
        for name, model, opt in zip(losses, (probed, twin, first), opts, strict=True):
            losses[name].append(_step(model, opt, tokens))
        if step == 1:
            with torch.no_grad():
                bf16 = probed(probe)
                with float32_forward(probed):
                    fp32 = probed(probe)
                plain.load_state_dict(_full(probed))
                expected = plain(probe)
    weights = [_full(m) for m in (probed, twin, first)]
    if rank == 0:
        out.update(
            dtypes=(bf16.dtype, fp32.dtype),
            probe_vs_plain=(fp32 - expected).abs().max().item(),
            bf16_vs_plain=(bf16.float() - expected).abs().max().item(),
            losses=losses,
            same_weights=[all(torch.equal(w[k], weights[1][k]) for k in w) for w in weights],
        )
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def result():
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_worker, args=(_free_port(), out), nprocs=WORLD, start_method="spawn")
        return dict(out)


@pytest.mark.slow  # two spawned processes importing torch: half a minute on 2 cores
def test_within_the_forward_is_the_plain_float32_models(result):
    assert result["dtypes"] == (torch.bfloat16, torch.float32)
    print(
        f"float32_forward vs plain float32: {result['probe_vs_plain']:.2e};"
        f" bf16 FSDP: {result['bf16_vs_plain']:.2e}"
    )
    assert result["probe_vs_plain"] <= 1e-6
    assert result["bf16_vs_plain"] > 1e-3  # without it the same weights compute in bfloat16


@pytest.mark.slow
def test_training_after_it_is_bit_identical_to_a_twin_that_never_entered_it(result):
    losses = result["losses"]
    assert losses["probed"] == losses["twin"] == losses["first"]
    assert result["same_weights"] == [True, True, True]


def test_a_torch_without_the_fsdp2_state_it_sets_aside_fails_pre_flight(monkeypatch):
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    from qwen3_trainium.config import seams

    fsdp2 = [s for s in seams.SEAMS if s.target.startswith(seams.FSDP2)]
    assert all(s.is_private for s in fsdp2) and seams.missing(fsdp2) == []
    for path in ("native", "hf", "nki_moe"):  # pre-flight probes them for every run
        assert set(fsdp2) <= set(seams.needed(path, "neuron"))
    monkeypatch.delattr(FSDPState, "_lazy_init")
    assert [(s.name, error) for s, error in seams.missing(fsdp2)] == [
        (
            f"{seams.FSDP2}._fsdp_state.FSDPState._lazy_init",
            "torch.distributed.fsdp._fully_shard._fsdp_state has no FSDPState._lazy_init",
        )
    ]
