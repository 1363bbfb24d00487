"""Hugging Face's router load-balancing loss and the router z-loss inside torchtitan's MoE
(``model.moe_balance``, docs/moe.md): a router that records what the losses need, a ledger that
pools it over the MoE layers of one forward, and a gradient carrier that adds the losses'
gradients to the router without touching the model's output or the trainer's loss.

The loss is Transformers' ``load_balancing_loss_func`` (``models/qwen3_moe/modeling_qwen3_moe.py``,
5.24): over the MoE layers ``l`` of one batch and its non-padding tokens ``t``,
``f_e = sum_{l,t} [e in topk_l(t)] / (L*n)``, ``P_e = sum_{l,t} softmax(logits_l(t))_e / (L*n)``,
``aux = E * sum_e f_e * P_e``: counts and probabilities are POOLED over layers before the
product (not a mean of per-layer losses), no division by top_k (uniform routing gives k), and
``norm_topk_prob`` does not enter (only the top-k ids of the full softmax do). Only ``P`` carries
a gradient (the counts come from top-k indices), so ``d aux / d q_l = E * f / (L*n)`` with
``q_l = sum_t softmax_l(t)``: the carrier of layer ``l`` hands ``weight * E * C / (L*n)^2`` to
``q_l`` in backward, when the forward of every layer has filled the pooled counts ``C``.

The z-loss (ST-MoE, arXiv:2202.08906 eq. 5; Transformers' Qwen3-MoE has none) is
``sum_{l,t} logsumexp(logits_l(t))^2 / (L*n)``, the mean over layers and non-padding tokens.

The carrier is DeepSeek-MoE's ``AddAuxiliaryLoss`` idea (identity forward; backward adds the
auxiliary gradient), also torchtitan's later ``LoggedAuxLoss`` (pytorch/torchtitan#3864): the
logged loss stays cross-entropy. Under activation checkpointing the router runs again in
backward; the recompute does the same autograd ops (non-reentrant checkpoint compares what it
saves) but records nothing (``torch._C._current_graph_task_id()`` is -1 outside backward).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torchtitan.config import derive
from torchtitan.models.common.moe import TokenChoiceTopKRouter


def hf_aux_loss(counts_E: torch.Tensor, probs_sum_E: torch.Tensor, rows, num_experts: int) -> torch.Tensor:
    """Transformers' pooled formula from its sums: ``rows`` = MoE layers x non-padding tokens."""
    return num_experts * torch.sum((counts_E / rows) * (probs_sum_E / rows))


class Ledger:
    """What the routers of one model record during one forward (a micro-batch), pooled."""

    def __init__(self, num_layers: int, num_experts: int, aux_weight: float, z_weight: float, group=None):
        self.num_layers, self.num_experts = num_layers, num_experts
        self.aux_weight, self.z_weight, self.group = aux_weight, z_weight, group
        self.mask: torch.Tensor | None = None  # [B*S] float, 1 = not padding; None: all tokens
        self.history: list[tuple[float, float]] = []  # (aux, z) of each finished micro-batch
        self._reset()

    def _reset(self) -> None:
        self.counts, self.probs, self.lse2, self.tokens = [], [], [], None
        self.grad_q: torch.Tensor | None = None
        self.grad_z = 0.0

    def begin(self, mask: torch.Tensor | None) -> None:
        """Before a forward: the non-padding mask of its tokens (flattened as the router's rows)."""
        self._reset()
        self.mask = None if mask is None else mask.reshape(-1).float()

    def record(self, counts_E, probs_sum_E, lse2_sum, tokens) -> None:
        self.counts.append(counts_E)
        self.probs.append(probs_sum_E.detach())
        self.lse2.append(lse2_sum.detach())
        self.tokens = tokens

    def finish(self) -> tuple[float, float] | None:
        """After a forward: pool the layers (summed over ``group``, the ranks that split the same
        sequences: context parallel), set the backward's gradients, keep (aux, z) for the log."""
        if not self.counts:
            return None
        if len(self.counts) != self.num_layers:
            raise RuntimeError(f"{len(self.counts)} MoE layers recorded, {self.num_layers} expected")
        E = self.num_experts
        sums = torch.cat(
            [sum(self.counts), sum(self.probs), torch.stack([sum(self.lse2), self.tokens.float()])]
        ).double()
        if self.group is not None:
            dist.all_reduce(sums, group=self.group)
        counts, probs, lse2, tokens = sums[:E], sums[E : 2 * E], sums[2 * E], sums[2 * E + 1]
        rows = self.num_layers * tokens.clamp(min=1)
        aux = hf_aux_loss(counts, probs, rows, E)
        z = lse2 / rows
        self.grad_q = (self.aux_weight * E * counts / rows**2).float()
        self.grad_z = float(self.z_weight / rows)
        self.counts, self.probs, self.lse2 = [], [], []
        self.history.append((float(aux), float(z)))
        return self.history[-1]


class _Carrier(torch.autograd.Function):
    """Identity on the routing scores; backward also feeds the ledger's gradients to this layer's
    probability sum ``q`` and logsumexp-squared sum ``z``."""

    @staticmethod
    def forward(ctx, scores, q_E, z, ledger):
        ctx.ledger = ledger
        return scores.view_as(scores)

    @staticmethod
    def backward(ctx, grad_scores):
        ledger = ctx.ledger
        grad_q = ledger.grad_q.to(grad_scores.device) if ledger.grad_q is not None else None
        grad_z = torch.tensor(ledger.grad_z, device=grad_scores.device) if ledger.z_weight else None
        return grad_scores, grad_q, grad_z, None


def recomputing() -> bool:
    """Inside a backward pass: an activation checkpoint's recompute of this forward."""
    return torch._C._current_graph_task_id() != -1


class BalancedRouter(TokenChoiceTopKRouter):
    """torchtitan's softmax top-k router (``models/common/moe.py``, forward copied: the logits
    are not returned there) that records the balance losses' sums in ``ledger``."""

    @dataclass(kw_only=True, slots=True)
    class Config(TokenChoiceTopKRouter.Config):
        pass

    ledger: Ledger | None = None

    def forward(self, x_BLD, expert_bias_E=None):
        if self.score_func != "softmax" or self.num_expert_groups is not None:
            raise NotImplementedError("the balance losses are Qwen3's: softmax, no expert groups")
        with torch.autocast(device_type=x_BLD.device.type, dtype=torch.float32):
            logits_BLE = self.gate(x_BLD)
        scores_BLE = F.softmax(logits_BLE, dim=-1)
        choice = scores_BLE if expert_bias_E is None else scores_BLE + expert_bias_E
        _, topk_expert_ids_BLK = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)
        topk_scores_BLK = scores_BLE.gather(dim=-1, index=topk_expert_ids_BLK)
        if self._debug_force_load_balance:  # torchtitan's round robin (debug.moe_force_load_balance)
            topk_expert_ids_BLK, topk_scores_BLK = self._debug_force_load_balance_routing(scores_BLE)
        if self.route_norm:
            topk_scores_BLK = topk_scores_BLK / (topk_scores_BLK.sum(dim=-1, keepdim=True) + 1e-20)
        topk_scores_BLK = topk_scores_BLK * self.route_scale
        if self.ledger is not None and self.training and torch.is_grad_enabled():
            topk_scores_BLK = self._carry(topk_scores_BLK, topk_expert_ids_BLK, scores_BLE, logits_BLE)
        return topk_scores_BLK, topk_expert_ids_BLK, scores_BLE

    def _carry(self, topk_scores_BLK, topk_expert_ids_BLK, scores_BLE, logits_BLE):
        ledger, E = self.ledger, self.num_experts
        probs_NE = scores_BLE.reshape(-1, E)
        ids_NK = topk_expert_ids_BLK.reshape(-1, self.top_k)
        mask = ledger.mask
        if mask is None:
            mask = torch.ones(probs_NE.shape[0], device=probs_NE.device)
        mask = mask.to(probs_NE.device)
        if mask.shape[0] != probs_NE.shape[0]:
            raise RuntimeError(f"balance mask has {mask.shape[0]} tokens, the router {probs_NE.shape[0]}")
        q_E = (probs_NE * mask[:, None]).sum(0)
        z = (mask * torch.logsumexp(logits_BLE.reshape(-1, E), dim=-1) ** 2).sum()
        if not recomputing():
            with torch.no_grad():
                weights = mask.repeat_interleave(self.top_k)
                counts_E = torch.zeros(E, device=mask.device).scatter_add_(0, ids_NK.reshape(-1), weights)
            ledger.record(counts_E, q_E, z, mask.sum())
        return _Carrier.apply(topk_scores_BLK, q_E, z, ledger)


def balanced_router_config(cfg: TokenChoiceTopKRouter.Config) -> BalancedRouter.Config:
    return derive(cfg, BalancedRouter.Config)


def use_balanced_routers(model_config) -> int:
    """Swap every MoE layer's router config for ``BalancedRouter``; returns how many."""
    swapped = 0
    for layer in getattr(model_config, "layers", None) or []:
        moe = getattr(layer, "moe", None)
        if moe is not None:
            moe.router = balanced_router_config(moe.router)
            swapped += 1
    return swapped


def install(model: torch.nn.Module, aux_weight: float, z_weight: float, group=None) -> Ledger | None:
    """One ledger for the built ``model``'s balanced routers, pooled after each forward (a
    forward hook on the model, so a block's recompute does not pool twice); None without any."""
    routers = [m for m in model.modules() if isinstance(m, BalancedRouter)]
    if not routers:
        return None
    ledger = Ledger(len(routers), routers[0].num_experts, aux_weight, z_weight, group)
    for router in routers:
        router.ledger = ledger

    def pool(module, args, output) -> None:  # returns None: the output stays the model's
        ledger.finish()

    model.register_forward_hook(pool)
    return ledger
