"""The export check's probe: the trained model's logits on a fixed probe batch, computed in
float32 on the weights as the HF export holds them (``export_probe.pt``, compared by
``parent/export_check.py`` with ``AutoModelForCausalLM.from_pretrained(dtype=float32)`` of the
export); and the one-document forward the samples decode with (``samples.py``).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from qwen3_trainium.rank.float32_forward import float32_forward

PROBE_TEXT = (
    "Alice has 3 apples. Bob gives Alice 2 more apples. Now Alice has 5 apples. The capital of Peru is Lima."
)


def probe_tokens(tokenizer_dir: str) -> torch.Tensor:
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json")).encode(PROBE_TEXT).ids
    return torch.tensor([ids], dtype=torch.long)


PROBE_MULTIPLE = 256  # rope_hf's rule at LNC=2 (128 x LNC); causal, so the padding changes nothing before it


@torch.no_grad()
def model_logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of a torchtitan model (native Decoder or HF backend) on one document. The document
    is padded to a multiple of 256 tokens (model=nki_moe's rope_hf needs it) and the logits of
    the padding dropped: attention is causal, so the rest are those of the document alone."""
    device = next(model.parameters()).device
    length = tokens.shape[1]
    padded = torch.nn.functional.pad(tokens, (0, -length % PROBE_MULTIPLE)).to(device)
    positions = torch.arange(padded.shape[1], device=device).unsqueeze(0)
    kwargs = {"positions": positions}
    if hasattr(model, "get_attention_masks") and not hasattr(model, "model"):  # native Decoder
        kwargs["attention_masks"] = model.get_attention_masks(positions)
    was_training, skip_lm_head = model.training, getattr(model, "_skip_lm_head", False)
    model.eval()
    model._skip_lm_head = False  # the chunked loss applies lm_head itself during training
    try:
        out = model(padded, **kwargs)
    finally:
        model.train(was_training)
        model._skip_lm_head = skip_lm_head
    return _whole_vocab(model, out)[:, :length].float().cpu()


def _whole_vocab(model: torch.nn.Module, out: torch.Tensor) -> torch.Tensor:
    """Logits over the whole vocabulary on every rank. Under tensor parallel torchtitan's lm_head is
    vocab-parallel: its weight is ``Shard(0)`` on the ``tp`` mesh dim and each rank's output holds
    its slice of the vocabulary, a plain local tensor with the default ``spmd_types`` backend
    (``models/common/decoder_sharding.py``: ``lm_head`` ``out_dst_shardings`` ``tp=S(-1)``)."""
    from torch.distributed.tensor import DTensor, Shard

    if isinstance(out, DTensor):
        return out.full_tensor()
    weight = getattr(getattr(model, "lm_head", None), "weight", None)
    mesh = getattr(weight, "device_mesh", None)
    names = (mesh.mesh_dim_names or ()) if mesh is not None else ()
    if "tp" not in names or not weight.placements[names.index("tp")].is_shard(0):
        return out
    whole = (*out.shape[:-1], weight.shape[0])  # the global vocabulary (uneven slices included)
    sliced = DTensor.from_local(
        out,
        mesh["tp"],
        [Shard(out.dim() - 1)],
        run_check=False,
        shape=whole,
        stride=torch.empty(whole, device="meta").stride(),
    )
    return sliced.full_tensor()


class rounded_weights:
    """Within: every floating parameter holds its value rounded to ``dtype`` (what an export in that
    dtype carries), computed in its own dtype; the exact values come back on exit."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        self.params = [p for p in model.parameters() if p.is_floating_point() and p.dtype != dtype]
        self.dtype, self.saved = dtype, []

    @staticmethod
    def _local(p):
        return p.to_local() if hasattr(p, "to_local") else p.data

    def __enter__(self):
        with torch.no_grad():
            for p in self.params:
                local = self._local(p)
                self.saved.append(local.clone())
                local.copy_(local.to(self.dtype).to(local.dtype))
        return self

    def __exit__(self, *exc):
        with torch.no_grad():
            for p, value in zip(self.params, self.saved, strict=True):
                self._local(p).copy_(value)
        self.saved.clear()


def save_probe(model: torch.nn.Module, tokenizer_dir: str, path: str, export_dtype: str = "float32") -> None:
    """Every rank runs the forward (FSDP gathers) in float32 with the weights as the export holds
    them (rounded to ``export_dtype``); rank 0 writes tokens, logits, the device they were computed
    on and the Neuron compiler's flags (whether its float32 matmuls stayed float32)."""
    tokens = probe_tokens(tokenizer_dir)
    # rounded_weights is built inside float32_forward, which reshards first: it rounds the
    # sharded float32 masters, not a gathered copy a module may still hold
    with float32_forward(model), rounded_weights(model, getattr(torch, export_dtype)):
        logits = model_logits(model, tokens)
    if not dist.is_initialized() or dist.get_rank() == 0:
        device = next(model.parameters()).device.type
        flags = os.environ.get("NEURON_CC_FLAGS", "")
        torch.save({"tokens": tokens, "logits": logits, "device": device, "neuron_cc_flags": flags}, path)
