"""CPU stand-ins for NKI and the NKI Library that enforce the documented calling convention.

- An ``@nki.jit`` kernel is launched on a grid, ``kernel[lnc](...)`` (the ``nki.jit`` docstring);
  a stand-in called without ``[lnc]``, or with an LNC other than 1 or 2, fails.
- Results come from return values. The stand-ins take the real signatures (``rope_hf`` has
  ``q_out``/``k_out`` parameters) but fill every buffer passed in with NaN and return fresh
  tensors, so call code that reads a preallocated buffer gets NaN and its parity test fails.
- No dataclass crosses a traced kernel's boundary: ``moe_cte``'s ``MoECTESpec`` must be built
  inside the function ``nki.jit(mode="trace")`` wraps (how vllm-neuron calls it).
- Every keyword passed is checked against ``neuron.SIGNATURES`` (what we claim the installed
  nkilib takes), and the numbers come from the pure-PyTorch references.
"""

from __future__ import annotations

import dataclasses
import enum
from types import SimpleNamespace

import torch

from qwen3_trainium.models.kernels import moe, moe_nki, neuron, rope


class GridKernel:
    """A stand-in ``@nki.jit`` kernel: ``kernel[lnc](...)`` only."""

    def __init__(self, fn, name: str):
        self.fn, self.name, self.launches = fn, name, []

    def __call__(self, *args, **kwargs):
        raise AssertionError(
            f"{self.name} called without a launch grid: NKI kernels are called as kernel[lnc](...)"
        )

    def __getitem__(self, lnc):
        assert lnc in (1, 2), f"{self.name}[{lnc!r}]: the LNC degree is 1 or 2"

        def launch(*args, **kwargs):
            for value in (*args, *kwargs.values()):
                assert not (dataclasses.is_dataclass(value) and not isinstance(value, type)), (
                    f"{self.name}: a {type(value).__name__} crossed the kernel boundary; pass primitives "
                    "and build it inside the traced function"
                )
            self.launches.append(lnc)
            return self.fn(lnc, *args, **kwargs)

        return launch


def _poison(*buffers: torch.Tensor) -> None:
    for buffer in buffers:
        buffer.fill_(float("nan"))


def _check_keywords(target: str, passed) -> None:
    expected = set(neuron.SIGNATURES[target])
    assert set(passed) == expected, (
        f"{target}: passed {sorted(set(passed) ^ expected)} beyond/short of SIGNATURES"
    )


# rope_hf ----------------------------------------------------------------------------------------


def _rope_hf(lnc, q, k, q_out, k_out, cos=None, sin=None, rope_cache=None, backward=False):
    _check_keywords(
        "nkilib.core.embeddings.rope_hf:rope_hf",
        ["q", "k", "q_out", "k_out", *(["rope_cache"] if rope_cache is not None else []), "backward"],
    )
    b, hq, s, d = q.shape
    assert k.dim() == 4 and k.shape[0] == b and k.shape[2] == s and k.shape[3] == d, "k must be [B, Hk, S, D]"
    assert q_out.shape == q.shape and k_out.shape == k.shape, "q_out/k_out are shaped like q/k"
    assert (cos is None) == (sin is None) and (rope_cache is None) != (cos is None), "cos+sin or rope_cache"
    assert rope_cache.shape[-1] == 2 * d and rope_cache.shape[-2] >= s, "rope_cache [B|-, S, 2D]"
    assert rope_cache.dim() == 2 or rope_cache.shape[0] == b, "rope_cache 2-D or [B, S, 2D]"
    assert rope_cache.dtype == q.dtype, "cos/sin tiles live in q's dtype"
    assert s % (128 * lnc) == 0, f"seq len must be multiple of 128 * LNC={lnc}"
    assert q.is_contiguous() and k.is_contiguous()
    cache = rope_cache if rope_cache.dim() == 3 else rope_cache.unsqueeze(0)
    qo, ko = rope.rope_reference(q.transpose(1, 2), k.transpose(1, 2), cache, backward)
    _poison(q_out, k_out)
    return qo.transpose(1, 2).contiguous(), ko.transpose(1, 2).contiguous()


def rope_hf() -> GridKernel:
    return GridKernel(_rope_hf, "rope_hf")


# moe_cte and blockwise_mm_bwd -------------------------------------------------------------------


class MoECTEImplementation(enum.Enum):
    shard_on_block = 0
    shard_on_i = 1


@dataclasses.dataclass
class ShardOnIConfig:
    checkpoint_activation: bool = False
    expert_affinity_multiply_on_I: bool = False


@dataclasses.dataclass
class MoECTESpec:
    implementation: MoECTEImplementation
    shard_on_I: ShardOnIConfig | None = None


ActFnType = enum.Enum("ActFnType", "SiLU GELU")
ExpertAffinityScaleMode = enum.Enum("ExpertAffinityScaleMode", "NO_SCALE POST_SCALE PRE_SCALE")
NL = SimpleNamespace(bfloat16="nl.bfloat16", float32="nl.float32")
NL_TO_TORCH = {"nl.bfloat16": torch.bfloat16, "nl.float32": torch.float32}


def _moe_tensors(kw):
    names = ("hidden_states", "expert_affinities_masked", "gate_up_proj_weight", "down_proj_weight")
    return [kw[n] for n in names]


def moe_cte(**kw):
    """Called inside the traced function: spec and enums are objects here, not across the boundary."""
    _check_keywords("nkilib.core.moe.moe_cte.moe_cte:moe_cte", kw)
    spec = kw["spec"]
    assert isinstance(spec, MoECTESpec) and spec.implementation is MoECTEImplementation.shard_on_i
    assert spec.shard_on_I.checkpoint_activation and not spec.shard_on_I.expert_affinity_multiply_on_I, (
        "the backward kernel needs shard_on_I checkpoints [N, 2, I, B] and [N, B, H]"
    )
    assert kw["activation_function"] is ActFnType.SiLU
    assert kw["expert_affinities_scaling_mode"] is ExpertAffinityScaleMode.POST_SCALE
    tensors = _moe_tensors(kw)
    compute = NL_TO_TORCH[kw["compute_dtype"]]  # an NKI dtype, not a string or a torch dtype
    assert all(t.dtype == compute for t in tensors), "inputs arrive in the compute dtype"
    tpid, b2e, block = kw["token_position_to_id"], kw["block_to_expert"], kw["block_size"]
    moe_nki.check_contract(*tensors, tpid, b2e, block, moe_cte.lnc)
    t_pad = tensors[0].shape[0] - 1
    assert torch.all(tensors[0][t_pad] == 0), "padding row T must be zero"
    assert torch.all(tensors[1].view(t_pad + 1, -1)[t_pad] == 0)
    assert int(tpid.max()) <= t_pad, "empty slots point at the padding row"
    return moe.moe_reference(*tensors, tpid, b2e, block, compute)


def _blockwise_mm_bwd(lnc, **kw):
    _check_keywords("nkilib.experimental.moe.bwd.blockwise_mm_backward:blockwise_mm_bwd", kw)
    hidden, aff, gate_up, down = _moe_tensors(kw)
    gu_act, down_act = kw["gate_up_proj_act_checkpoint_T"], kw["down_proj_act_checkpoint"]
    tpid, b2e, block = kw["token_position_to_id"], kw["block_to_expert"], kw["block_size"]
    moe_nki.check_contract(hidden, aff, gate_up, down, tpid, b2e, block, lnc)
    assert NL_TO_TORCH[kw["compute_dtype"]] == gu_act.dtype, "backward computes in the forward's dtype"
    assert gu_act.shape == (b2e.numel(), 2, gate_up.shape[-1], block), "gate_up checkpoint [N, 2, I, B]"
    assert down_act.shape == (b2e.numel(), block, hidden.shape[1]), "down checkpoint [N, B, H]"
    grad_out = kw["output_hidden_states_grad"]
    assert grad_out.shape == hidden.shape
    return moe.moe_reference_backward(
        grad_out, hidden, aff, gate_up, down, tpid, b2e, gu_act, down_act, block
    )


def moe_api() -> SimpleNamespace:
    """Stands in for ``moe_nki.nki_api()``."""

    def traced_jit(fn=None, *, mode="auto"):
        assert mode == "trace", "moe_cte is a trace-mode kernel; its wrapper is traced too"

        def wrap(f):
            def run(lnc, *args, **kwargs):
                moe_cte.lnc = lnc
                return f(*args, **kwargs)

            return GridKernel(run, f.__name__)

        return wrap(fn) if fn is not None else wrap

    return SimpleNamespace(
        jit=traced_jit, nl=NL, moe_cte=moe_cte, blockwise_mm_bwd=GridKernel(_blockwise_mm_bwd, "blockwise_mm_bwd"),
        MoECTESpec=MoECTESpec, MoECTEImplementation=MoECTEImplementation, ShardOnIConfig=ShardOnIConfig,
        ActFnType=ActFnType, ExpertAffinityScaleMode=ExpertAffinityScaleMode,
    )  # fmt: skip
