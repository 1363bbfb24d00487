"""Expert load (rank/expert_load.py) on the tiny MoE built in this process: counts per step against
the router's own choices, under activation checkpointing, the hook order against torchtitan's bias
hook, the idle-expert warning, and the figures against hand-made tables."""

from __future__ import annotations

import copy
import json
import logging

import pytest
import torch
from conftest import resolve

from qwen3_trainium.rank import expert_figures, expert_load

pytestmark = pytest.mark.slow

SEQ = 256  # the RoPE kernels' rule: a multiple of 128 x LNC
TOP_K = 2  # tiny_moe: 8 experts, top-2 (config/flavors.py)


def _build(tmp_path, *overrides):
    from torchtitan.config import apply_overrides

    from qwen3_trainium.rank.titan import to_trainer_config

    cfg = copy.deepcopy(to_trainer_config(resolve("device=cpu", *overrides), str(tmp_path)))
    cfg.model_spec.model.update_from_config(config=cfg)
    apply_overrides(cfg.override, cfg)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = cfg.model_spec.model.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_states(buffer_device=None)
    return model.train()


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("moe"), "model=native", "model.flavor=tiny_moe")


def _step(model, seed: int = 0) -> None:
    """One forward and backward of a batch of 2 x 256 random tokens."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 100, (2, SEQ), generator=gen)
    positions = torch.arange(SEQ).repeat(2, 1)
    out = model(tokens, positions=positions, attention_masks=model.get_attention_masks(positions))
    out.float().pow(2).mean().backward()


def _chosen(model) -> list[torch.Tensor]:
    """The oracle: per MoE layer, how often the router picked each expert in one ``_step``
    (torch.bincount of the router's top-k ids, captured by forward hooks; no recompute here)."""
    seen = []

    def record(module, args, output):
        seen.append(torch.bincount(output[1].reshape(-1), minlength=module.num_experts).float())

    handles = [moe.router.register_forward_hook(record) for _, _, moe in expert_load.moe_blocks([model])]
    try:
        _step(model)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _counter(model, run_dir, warn: int = 0) -> expert_load.LoadCounter:
    blocks = expert_load.moe_blocks([model])
    for _, _, moe in blocks:
        moe.tokens_per_expert_E.zero_()
    return expert_load.LoadCounter(blocks, None, idle_warn_steps=warn, run_dir=str(run_dir), writer=True)


@pytest.mark.parametrize("policy", ["none", "FullAC", "SelectiveAC"])
def test_counts_per_step_are_the_routers_choices_under_activation_checkpointing(tiny_moe, tmp_path, policy):
    from torchtitan.distributed import activation_checkpoint

    model = copy.deepcopy(tiny_moe)
    oracle = torch.stack(_chosen(model))  # before any wrapper: each router runs once
    assert oracle.sum(dim=1).tolist() == [TOP_K * 2 * SEQ] * 4  # top_k x tokens, every layer
    if policy != "none":
        cls = getattr(activation_checkpoint, policy)
        cls(cls.Config()).apply(model)
        assert all(expert_load._recomputed(block) for _, block, _ in expert_load.moe_blocks([model]))
    counter = _counter(model, tmp_path)
    _step(model)  # the same batch and weights: the same choices, counted once
    counter.read(1)
    assert torch.equal(counter.window, oracle), policy


@pytest.mark.heavy  # building the nki_moe model costs ~20 s here; the e2e tests cover it as well
def test_nki_moe_counts_like_the_router(tmp_path):
    model = _build(tmp_path, "model=nki_moe")
    assert type(expert_load.moe_blocks([model])[0][2].routed_experts).__name__ == "BlockwiseRoutedExperts"
    oracle = torch.stack(_chosen(model))
    counter = _counter(model, tmp_path)
    _step(model)
    counter.read(1)
    assert torch.equal(counter.window, oracle)


class _OneRank:
    """torchtitan's ParallelDims as its bias hook reads it on one rank: no mesh to reduce over."""

    ep_enabled, tp = False, 1

    def get_optional_mesh(self, name):
        return None


def test_read_runs_before_torchtitans_bias_hook_which_still_sees_the_counts(tiny_moe, tmp_path):
    from torchtitan.components.optimizer.optimizer import register_moe_load_balancing_hook

    blocks = expert_load.moe_blocks([tiny_moe])
    assert all(moe.load_balance_coeff is not None for _, _, moe in blocks)  # torchtitan's hook is on
    optimizer = torch.optim.SGD(tiny_moe.parameters(), lr=0.0)
    register_moe_load_balancing_hook(optimizer, [tiny_moe], _OneRank())  # registered first, as in the Trainer
    counter = _counter(tiny_moe, tmp_path)
    expert_load.run_first(optimizer, lambda: counter.read(1))
    bias_before = [moe.expert_bias_E.clone() for _, _, moe in blocks]
    oracle = torch.stack(_chosen(tiny_moe))
    optimizer.step()
    assert torch.equal(counter.window, oracle)  # read before torchtitan's hook zeroed the buffers
    for (_, _, moe), before in zip(blocks, bias_before, strict=True):
        assert not torch.equal(moe.expert_bias_E, before)  # and torchtitan's hook saw them too
        assert moe.tokens_per_expert_E.sum() == 0


@pytest.fixture
def no_bias_hook(tiny_moe):
    """``load_balance_coeff = None``, as rank/titan.py sets it for runs from an HF checkpoint: no
    torchtitan hook zeroes the buffers (the router still adds the ``expert_bias_E`` it holds)."""
    blocks = expert_load.moe_blocks([tiny_moe])
    coeffs = [moe.load_balance_coeff for _, _, moe in blocks]
    for _, _, moe in blocks:
        moe.load_balance_coeff = None
    yield tiny_moe
    for (_, _, moe), coeff in zip(blocks, coeffs, strict=True):
        moe.load_balance_coeff = coeff


def test_without_the_bias_hook_read_zeroes_the_buffers(no_bias_hook, tmp_path):
    blocks = expert_load.moe_blocks([no_bias_hook])
    counter = _counter(no_bias_hook, tmp_path)
    oracle = torch.stack(_chosen(no_bias_hook))  # the buffers now hold this step's counts
    counter.read(1)
    assert all(moe.tokens_per_expert_E.sum() == 0 for _, _, moe in blocks)
    _step(no_bias_hook)  # the same batch again: the same counts, not the sum since the start
    counter.read(1)
    assert torch.equal(counter.window, 2 * oracle)


def _idle_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("expert load:")]


def test_an_expert_the_router_never_picks_is_warned_about_once_per_streak(no_bias_hook, tmp_path, caplog):
    tiny_moe = no_bias_hook
    blocks = expert_load.moe_blocks([tiny_moe])
    bias = blocks[1][2].expert_bias_E
    saved = bias.clone()
    counter = _counter(tiny_moe, tmp_path, warn=3)
    caplog.set_level(logging.WARNING)
    try:
        with torch.no_grad():
            bias[5] = -1e9  # the biased score of expert 5 of layer 1 never reaches the top 2

        def steps(n: int, first: int) -> None:
            for step in range(first, first + n):
                _step(tiny_moe, seed=step)
                counter.read(step)
                counter.log(step)

        steps(2, 1)
        assert _idle_warnings(caplog) == []  # 2 idle steps: not yet
        steps(3, 3)
        assert _idle_warnings(caplog) == [
            "expert load: layer 1 expert 5 received no tokens in the last 3 steps"
            " (tracking.expert_idle_warn_steps=3)"
        ]  # once, though the streak went on to 5 steps
        with torch.no_grad():
            bias[5] = 1e9  # now every token picks it: the streak ends
        steps(1, 6)
        with torch.no_grad():
            bias[5] = -1e9
        steps(3, 7)
        assert len(_idle_warnings(caplog)) == 2  # a new streak, a new warning
    finally:
        with torch.no_grad():
            bias.copy_(saved)


def test_the_record_covers_every_step_read_from_a_resumed_runs_first(no_bias_hook, tmp_path):
    counter = _counter(no_bias_hook, tmp_path)
    for step in (101, 102, 103):  # resumed at step 100, logging every 10 steps: first log at 110
        _step(no_bias_hook, seed=step)
        counter.read(step)
    counter.finish(103)  # the last step, before any log step
    data = json.loads((tmp_path / "expert_load.json").read_text())
    assert (data["first_step"], data["step"]) == (101, 103)
    assert [sum(layer) for layer in data["tokens_per_expert"]] == [3 * TOP_K * 2 * SEQ] * 4


def test_idle_warn_steps_zero_never_warns(no_bias_hook, tmp_path, caplog):
    tiny_moe = no_bias_hook
    blocks = expert_load.moe_blocks([tiny_moe])
    bias = blocks[0][2].expert_bias_E
    saved = bias.clone()
    counter = _counter(tiny_moe, tmp_path, warn=0)
    caplog.set_level(logging.WARNING)
    try:
        with torch.no_grad():
            bias[0] = -1e9
        for step in range(1, 4):
            _step(tiny_moe, seed=step)
            counter.read(step)
            figures = counter.log(step)
            assert figures[expert_figures.ZERO_TOKENS] >= 1  # seen in the figures, not warned
    finally:
        with torch.no_grad():
            bias.copy_(saved)
    assert _idle_warnings(caplog) == []


def test_a_dense_model_has_no_moe_block(tmp_path):
    assert expert_load.moe_blocks([_build(tmp_path, "model=native", "model.flavor=tiny")]) == []


def test_config_reads_tracking_expert_idle_warn_steps(tmp_path):
    """From the run config to the function and to the trainer's config (``rank/titan.py``)."""
    from qwen3_trainium.rank.titan import to_trainer_config

    run = resolve("device=cpu", "tracking.expert_idle_warn_steps=7")
    assert expert_load.config(run) == expert_load.ExpertLoadConfig(idle_warn_steps=7)
    assert to_trainer_config(run, str(tmp_path)).expert_load.idle_warn_steps == 7
