"""model.moe_balance: our router aux loss against Transformers' ``load_balancing_loss_func`` (value
and router gradient, padding and packed documents), for both MoE routes; the z-loss against a
hand computation; the configuration it resolves to."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
from conftest import resolve
from safetensors.torch import load_file

from qwen3_trainium.data import assets
from qwen3_trainium.models import moe_balance
from qwen3_trainium.rank.titan import to_trainer_config

S = 256  # model=nki_moe's rope_hf wants a multiple of 256


def _model(tmp_path, path, *overrides):
    """The tiny MoE a rank trains from the shipped HF checkpoint (train mode, float32, CPU)."""
    from torchtitan.config import apply_overrides

    source = assets.ensure_hf_moe_model()
    flavor = ["model.flavor=tiny_moe"] if path == "native" else []
    run = resolve(f"model={path}", "device=cpu", *flavor, "checkpoint=hf_finetune",
                  f"checkpoint.initial_load_path={source}", *overrides)  # fmt: skip
    cfg = copy.deepcopy(to_trainer_config(run, str(tmp_path)))
    cfg.model_spec.model.update_from_config(config=cfg)
    apply_overrides(cfg.override, cfg)
    model = cfg.model_spec.model.build()
    model.init_weights(buffer_device=None)
    adapter = cfg.model_spec.state_dict_adapter(cfg.model_spec.model, cfg.hf_assets_path)
    missing, unexpected = model.load_state_dict(
        adapter.from_hf(load_file(str(source / "model.safetensors"))), strict=False
    )
    assert unexpected == [] and all("tokens_per_expert" in k for k in missing), missing
    return model.train(), cfg


def _batch():
    """Two rows: row 0 packs two documents, row 1 ends in 40 tokens of padding."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 512, (2, S), generator=g)
    positions = torch.stack([torch.cat([torch.arange(100), torch.arange(S - 100)]), torch.arange(S)])
    mask = torch.ones(2, S)
    mask[1, -40:] = 0
    return tokens, positions, mask


def _forward(model, tokens, positions, mask, aux_weight=1.0, z_weight=0.0, oracle=False):
    """Our run with only the balance losses' gradient (the output is scaled by 0): the ledger,
    and the router logits of every layer with their gradient."""
    ledger = moe_balance.install(model, aux_weight, z_weight)
    logits = []

    def keep(module, args, out):
        out.retain_grad()
        logits.append(out)

    hooks = [layer.moe.router.gate.register_forward_hook(keep) for layer in model.layers.values()]
    ledger.begin(mask)
    kwargs = {"positions": positions, "attention_masks": model.get_attention_masks(positions)}
    out = model(tokens, **kwargs)
    for hook in hooks:
        hook.remove()
    if oracle:
        return ledger, logits, out
    _backward(out)
    return ledger, logits


def _backward(out) -> None:
    """Backward of the model output times 0: only the injected balance gradients remain."""
    (out.sum() * 0).backward()


@pytest.mark.parametrize("path", ["native", "nki_moe"])
def test_aux_loss_and_its_gradient_equal_transformers_on_the_same_router_logits(tmp_path, path):
    """Transformers' function on our model's own router logits (padding, packed documents): the
    value, and the gradient it gives every parameter through our graph (later routers see what
    earlier ones routed) against the gradient our routers inject."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    model, _ = _model(tmp_path, path)
    assert all(isinstance(m.moe.router, moe_balance.BalancedRouter) for m in model.layers.values())
    tokens, positions, mask = _batch()
    params = [p for p in model.parameters() if p.requires_grad]
    ledger, logits, out = _forward(model, tokens, positions, mask, oracle=True)
    theirs = load_balancing_loss_func(tuple(x.reshape(-1, 8) for x in logits), 8, 2, mask)
    injected, ledger.grad_q = ledger.grad_q, None  # the oracle's backward: nothing injected
    expected = torch.autograd.grad(theirs, params, allow_unused=True, retain_graph=True)
    ledger.grad_q = injected
    _backward(out)
    ours, _ = ledger.history[-1]
    pairs = [(e, p.grad) for e, p in zip(expected, params, strict=True) if e is not None]
    grad = max((e - g).abs().max().item() for e, g in pairs)
    scale = max(e.abs().max().item() for e, _ in pairs)
    print(f"{path}: aux ours {ours:.7f} HF {theirs.item():.7f} diff {abs(ours - theirs.item()):.1e};"
          f" {len(pairs)} parameter grads, max diff {grad:.1e} (largest {scale:.1e})")  # fmt: skip
    assert abs(ours - theirs.item()) <= 1e-6 and grad <= 1e-6 * scale
    per_layer = sum(load_balancing_loss_func((x.reshape(-1, 8),), 8, 2, mask) for x in logits) / len(logits)
    assert abs(per_layer.item() - ours) > 1e-4  # the pooled formula, not a mean of layers' losses


HF_SIDE = """
import sys, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).train()
tokens, mask = torch.load(sys.argv[2])
out = m(tokens, attention_mask=mask, output_router_logits=True)
out.aux_loss.backward()
grads = [layer.mlp.gate.weight.grad for layer in m.model.layers]
torch.save((out.aux_loss.detach(), grads), sys.argv[3])
"""


@pytest.mark.heavy
def test_whole_model_aux_loss_and_gate_gradient_equal_transformers_outputs_aux_loss(tmp_path):
    """Transformers' own model on the same weights, padded batch: ``outputs.aux_loss`` and the
    gradient it gives every ``mlp.gate.weight`` (an absolute oracle for the gradient's scale)."""
    model, _ = _model(tmp_path, "native")
    tokens, _, mask = _batch()
    positions = torch.arange(S).expand(2, S)  # no packing: Transformers' attention is per row
    ledger, _ = _forward(model, tokens, positions, mask)
    torch.save((tokens, mask.long()), tmp_path / "in.pt")
    proc = subprocess.run([sys.executable, "-c", HF_SIDE, str(assets.ensure_hf_moe_model()), str(tmp_path / "in.pt"),
                           str(tmp_path / "out.pt")], capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs, grads = torch.load(tmp_path / "out.pt")
    ours = [layer.moe.router.gate.weight.grad for layer in model.layers.values()]
    value = abs(ledger.history[-1][0] - theirs.item())
    grad = max((a - b).abs().max().item() for a, b in zip(ours, grads, strict=True))
    print(f"Qwen3MoeForCausalLM aux {theirs.item():.7f}: diff {value:.1e}, gate grad diff {grad:.1e}")
    assert value <= 1e-6 and grad <= 1e-6


def test_z_loss_is_the_mean_over_layers_and_real_tokens_of_logsumexp_squared(tmp_path):
    model, _ = _model(tmp_path, "native", "model.moe_z_loss_coef=0.01")
    tokens, positions, mask = _batch()
    ledger, logits = _forward(model, tokens, positions, mask, aux_weight=0.0, z_weight=0.5)
    keep = mask.reshape(-1).bool()
    hand = [torch.logsumexp(x.detach().reshape(-1, 8)[keep].double(), -1) ** 2 for x in logits]
    expected = torch.cat(hand).mean().item()
    n = keep.sum().item() * len(logits)
    # the last layer's logits reach the z-loss only directly: d(w * lse^2 / n) = w * 2 lse softmax / n
    last = logits[-1].detach().reshape(-1, 8)
    hand_grad = (
        0.5 * 2 * torch.logsumexp(last, -1, keepdim=True) * torch.softmax(last, -1) * keep[:, None] / n
    )
    grad = (hand_grad - logits[-1].grad.reshape(-1, 8)).abs().max().item()
    print(
        f"z-loss ours {ledger.history[-1][1]:.7f} hand {expected:.7f}; last layer's logit grad diff {grad:.1e}"
    )
    assert abs(ledger.history[-1][1] - expected) <= 1e-6 * expected and grad <= 1e-6 * hand_grad.abs().max()


@pytest.mark.slow
def test_full_activation_checkpointing_gives_the_same_router_gradient(tmp_path):
    """The recompute runs the router again: nothing counted twice, the same gradient."""
    from torch.utils.checkpoint import checkpoint

    model, _ = _model(tmp_path, "native")
    tokens, positions, mask = _batch()
    _, plain = _forward(model, tokens, positions, mask)
    plain_grads = [x.grad.clone() for x in plain]
    model.zero_grad()
    for block in list(model.layers.values()):
        forward = block.forward
        block.forward = lambda *a, _f=forward, **k: checkpoint(_f, *a, use_reentrant=False, **k)
    ledger, again = _forward(model, tokens, positions, mask)
    assert len(ledger.history) == 1
    assert max((a - b.grad).abs().max().item() for a, b in zip(plain_grads, again, strict=True)) <= 1e-7


@pytest.mark.parametrize(
    "overrides, coefs",
    [
        ([], (0.001, 0.0)),  # the checkpoint's router_aux_loss_coef
        (["model.moe_aux_loss_coef=0.02", "model.moe_z_loss_coef=0.001"], (0.02, 0.001)),
        (["model.moe_balance=none"], (0.0, 0.0)),
    ],
)
def test_hf_fine_tunes_default_to_the_checkpoints_aux_loss_without_expert_bias(tmp_path, overrides, coefs):
    source = assets.ensure_hf_moe_model()
    run = resolve("model=native", "model.flavor=tiny_moe", "device=cpu", "checkpoint=hf_finetune",
                  f"checkpoint.initial_load_path={source}", *overrides)  # fmt: skip
    cfg = to_trainer_config(run, str(tmp_path))
    assert (cfg.moe_balance.aux_loss_coef, cfg.moe_balance.z_loss_coef) == coefs
    moe = [layer.moe for layer in cfg.model_spec.model.layers]
    assert all(m.load_balance_coeff is None for m in moe)
    assert all(isinstance(m.router, moe_balance.BalancedRouter.Config) == any(coefs) for m in moe)


def test_from_scratch_keeps_torchtitans_expert_bias(tmp_path):
    cfg = to_trainer_config(resolve("model=native", "model.flavor=tiny_moe", "device=cpu"), str(tmp_path))
    assert (cfg.moe_balance.aux_loss_coef, cfg.moe_balance.z_loss_coef) == (0.0, 0.0)
    assert all(layer.moe.load_balance_coeff == 1e-3 for layer in cfg.model_spec.model.layers)


MOE_HF = ("model=native", "model.flavor=tiny_moe", "device=cpu", "checkpoint=hf_finetune")


@pytest.mark.parametrize(
    "overrides, key",
    [
        (("model.moe_balance=bias",), "model.moe_balance"),  # expert bias with HF weights
        (("model.moe_aux_loss_coef=-0.1",), "model.moe_aux_loss_coef"),
        (("model.moe_z_loss_coef=-1",), "model.moe_z_loss_coef"),
        (("model.moe_balance=none", "model.moe_aux_loss_coef=0.01"), "model.moe_aux_loss_coef"),
        (("compile.enable=true",), "compile.enable"),
        (
            ("parallel.pipeline_parallel_degree=2", "launcher.nproc_per_node=2"),
            "parallel.pipeline_parallel_degree",
        ),
        (
            ("parallel.expert_parallel_degree=2", "launcher.nproc_per_node=2"),
            "parallel.expert_parallel_degree",
        ),
        # tensor parallel works (tests/rank/test_moe_balance_e2e.py): the headline layout's HF fine-tune
        (("parallel.tensor_parallel_degree=2", "launcher.nproc_per_node=2"), None),
    ],
)
def test_balance_problems_are_refused_before_launch_naming_the_key(overrides, key):
    from qwen3_trainium.parent.preflight import moe

    run = resolve(*MOE_HF, f"checkpoint.initial_load_path={assets.ensure_hf_moe_model()}", *overrides)
    problems = moe.check_balance(run)
    assert [p.key for p in problems] == ([key] if key else []), problems
    assert not problems or problems[0].fix


@pytest.mark.parametrize(
    "overrides, keys",
    [
        (("model.flavor=tiny", "model.moe_z_loss_coef=0.01"), ["model.moe_z_loss_coef"]),
        (("model.flavor=tiny", "model.moe_balance=aux_loss"), ["model.moe_balance"]),
        (("model=hf", "model.moe_balance=aux_loss"), ["model.moe_balance"]),
        (("model.flavor=tiny",), []),  # auto on a dense model: nothing to say
        (("model.flavor=tiny_moe", "compile.enable=true"), []),  # from scratch: bias, no loss
    ],
)
def test_knobs_a_run_would_ignore_are_refused(overrides, keys):
    from qwen3_trainium.parent.preflight import moe

    path = [] if overrides[0].startswith("model=") else ["model=native"]
    extra = [f"model.hf_model={assets.ensure_hf_model()}"] if overrides[0] == "model=hf" else []
    run = resolve(*path, "device=cpu", *extra, *overrides)
    assert [p.key for p in moe.check_balance(run)] == keys


@pytest.mark.parametrize("bias, force", [(False, False), (True, False), (False, True)])
def test_the_router_routes_exactly_as_torchtitans(bias, force):
    """The copied forward: the same scores and experts as ``TokenChoiceTopKRouter`` (with the
    expert bias of ``bias`` mode, and with torchtitan's debug round robin), ledger attached."""
    from torchtitan.models.common.decoder import Linear
    from torchtitan.models.common.moe import TokenChoiceTopKRouter

    cfg = TokenChoiceTopKRouter.Config(num_experts=8, gate=Linear.Config(in_features=16, out_features=8, bias=False),
                                       top_k=2, score_func="softmax", route_norm=True, _debug_force_load_balance=force)  # fmt: skip
    theirs, ours = cfg.build(), moe_balance.balanced_router_config(cfg).build()
    ours.load_state_dict(theirs.state_dict())
    ours.ledger = moe_balance.Ledger(1, 8, 1.0, 0.0)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    expert_bias = torch.linspace(-0.1, 0.1, 8) if bias else None
    for a, b in zip(ours.train()(x, expert_bias), theirs.train()(x, expert_bias), strict=True):
        assert torch.equal(a, b)
