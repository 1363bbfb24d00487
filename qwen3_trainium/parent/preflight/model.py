"""Pre-flight checks of the model group: flavor, the hf directory, the nki_moe kernels."""

from __future__ import annotations

import os

from qwen3_trainium.config import flavors
from qwen3_trainium.config.schema import AttnBackend, ModelPath, RunConf
from qwen3_trainium.parent.preflight.problem import Problem


def check_model(run: RunConf) -> list[Problem]:
    if run.model.path is ModelPath.hf:
        return _hf_model(run)
    known = flavors.all_flavors()
    if run.model.flavor not in known:
        return [
            Problem("model.flavor", run.model.flavor, "not a Qwen3 flavor", f"one of: {', '.join(known)}")
        ]
    return _kernels(run)


def check_model_static(run: RunConf) -> list[Problem]:
    """The model checks that need neither torch, transformers nor the model's dims: the HF
    directory on disk, the kernels' names and shape rules. Run before any process starts."""
    if run.model.path is ModelPath.hf:
        return _hf_model(run, layout=False)
    return _kernels(run, dims=False)


def _kernels(run: RunConf, *, dims: bool = True) -> list[Problem]:
    from qwen3_trainium.models.kernels import KERNEL_OVERRIDES

    kernels, model = run.model.kernels, run.model
    if kernels and model.path is not ModelPath.nki_moe:
        message = f"kernels are swapped in by model=nki_moe, not model={model.path.value}"
        return [Problem("model.kernels", kernels, message, "model=nki_moe (or model.kernels=[])")]
    unknown = [k for k in kernels if k not in KERNEL_OVERRIDES]
    if unknown:
        return [
            Problem("model.kernels", unknown, "unknown kernel", f"a list of: {', '.join(KERNEL_OVERRIDES)}")
        ]
    problems = []
    if model.path is ModelPath.nki_moe and model.flavor not in flavors.MOE_FLAVORS:
        fix = f"one of: {', '.join(flavors.MOE_FLAVORS)}"
        problems.append(Problem("model.flavor", model.flavor, "model=nki_moe trains a Qwen3-MoE flavor", fix))
    if "rope_hf" in kernels:
        problems += _rope_seq_len(run)
    if "moe_experts" in kernels:
        problems += _moe_kernel(run, dims=dims)
    return problems


def _rope_seq_len(run: RunConf) -> list[Problem]:
    """rope_hf's rule, on every device: a config validated here must be valid on trn2."""
    from qwen3_trainium.models.kernels.rules import check_seq_len, seq_multiple

    if run.device.lnc not in (1, 2):
        return []  # check_device names device.lnc
    try:
        check_seq_len(run.training.seq_len, run.device.lnc)
    except ValueError as err:
        fix = f"training.seq_len=<a multiple of {seq_multiple(run.device.lnc)}>, or model.kernels without rope_hf"
        return [Problem("training.seq_len", run.training.seq_len, f"ValueError: {err}", fix)]
    return []


def _moe_kernel(run: RunConf, *, dims: bool) -> list[Problem]:
    from qwen3_trainium.models.kernels.rules import BLOCK_SIZES

    model, par = run.model, run.parallel
    problems = []
    if model.moe_block_size not in BLOCK_SIZES:
        message = "the NKI MoE kernels take blocks of 256, 512 or 1024 tokens"
        problems.append(
            Problem("model.moe_block_size", model.moe_block_size, message, "model.moe_block_size=256")
        )
    if par.expert_parallel_degree != 1:  # tensor parallel splits each expert's width instead
        message = (
            "the blockwise MoE kernel replaces torchtitan's token dispatch: every rank holds every expert"
        )
        fix = "parallel.expert_parallel_degree=1 (parallel.tensor_parallel_degree splits the experts), or model.kernels without moe_experts"
        problems.append(Problem("parallel.expert_parallel_degree", par.expert_parallel_degree, message, fix))
    if dims and run.device.type.value == "neuron":
        problems += _moe_dims_on_neuron(run)
    return problems


def _expert_dims(flavor: str) -> tuple[int, int]:
    """(hidden size H, expert width I) of a MoE flavor."""
    spec = flavors.model_spec(flavor, "flex")
    layer = next(layer for layer in spec.model.layers if getattr(layer, "moe", None) is not None)
    experts = layer.moe.routed_experts.inner_experts
    return experts.dim, experts.hidden_dim


def _moe_dims_on_neuron(run: RunConf) -> list[Problem]:
    """moe_cte / blockwise_mm_bwd shape rules (Neuron only: elsewhere the reference runs)."""
    from qwen3_trainium.models.kernels.moe_nki import MIN_EXPERT_WIDTH

    dim, inter = _expert_dims(run.model.flavor)
    lnc = run.device.lnc
    fits_h = dim % 512 == 0 and 512 <= dim <= 8192 and (dim // lnc) % 32 == 0
    if fits_h and inter >= MIN_EXPERT_WIDTH and inter % 16 == 0 and (inter // lnc) % 32 == 0:
        return []
    message = (
        f"hidden size {dim} / expert size {inter} do not fit the NKI MoE kernels "
        f"(H a multiple of 512 in [512, 8192], I >= {MIN_EXPERT_WIDTH} and a multiple of 32 per core)"
    )
    fix = "a larger flavor (30B-A3B, 235B-A22B), or model.kernels without moe_experts"
    return [Problem("model.flavor", run.model.flavor, message, fix)]


DOCUMENTED_EXPERT_WIDTH = (2048, 16384)  # moe_cte API page: "Intermediate dimension I_TP: 2048-16384"


def kernel_notes(run: RunConf) -> list[str]:
    """The MoE op's blocks (every device), and what the NKI MoE kernel's documentation leaves open
    for this flavor (Neuron only)."""
    if "moe_experts" not in run.model.kernels or run.model.flavor not in flavors.MOE_FLAVORS:
        return []
    notes = [note for note in [block_note(run)] if note]
    if run.device.type.value != "neuron":
        return notes
    _, inter = _expert_dims(run.model.flavor)
    low, high = DOCUMENTED_EXPERT_WIDTH
    if low <= inter <= high:
        return notes
    return notes + [
        f"NOTE expert width I={inter} is outside the {low}-{high} that AWS's moe_cte page documents for "
        "shard-on-I; the kernel source asserts only I % 16 == 0 (nki-library 2.29). "
        "make test-neuron checks it against the reference on the device"
    ]


def _hf_model(run: RunConf, *, layout: bool = True) -> list[Problem]:
    from qwen3_trainium.models import hf

    if hf.transformers_major() < hf.MIN_TRANSFORMERS_MAJOR:
        from qwen3_trainium.parent.preflight.stack import installed

        message = f"transformers {installed('transformers') or '(none)'} is installed; model=hf needs Transformers v5"
        return [
            Problem(
                "model",
                "hf",
                message,
                "pip install 'transformers>=5,<6' (make setup installs the pinned 5.x)",
            )
        ]
    model = run.model.hf_model
    if not os.path.isdir(model):
        message = "not on this machine: no such directory, and not in the local Hugging Face cache"
        return [Problem("model.hf_model", model, message, hf.download_hint(model))]
    problems = []
    if run.model.flavor != "auto":
        message = "model=hf takes its architecture from model.hf_model's config.json"
        problems.append(
            Problem("model.flavor", run.model.flavor, message, "leave model.flavor=auto with model=hf")
        )
    if not os.path.isfile(os.path.join(model, "config.json")):
        problems.append(
            Problem(
                "model.hf_model",
                model,
                "no config.json in this directory",
                "point model.hf_model at a complete HF model directory",
            )
        )
    elif layout and run.model.load_weights and _moe_hub_layout(model):
        problems.append(_moe_hf_problem(model))
    elif run.model.load_weights and not any(f.endswith(".safetensors") for f in os.listdir(model)):
        message = "no *.safetensors weights in this directory"
        problems.append(
            Problem(
                "model.hf_model",
                model,
                message,
                "download the weights, or model.load_weights=false to start from random init",
            )
        )
    if run.model.attn_backend is AttnBackend.varlen:
        problems.append(
            Problem(
                "model.attn_backend",
                "varlen",
                "model=hf runs HF attention: sdpa or flex",
                "model.attn_backend=auto",
            )
        )
    return problems


def _moe_hub_layout(model_dir: str) -> bool:
    from qwen3_trainium.models import hf_config

    return hf_config.is_moe(hf_config.load(model_dir))


def _moe_hf_problem(model_dir: str) -> Problem:
    """model=hf cannot load a Qwen3-MoE checkpoint: say so, and what trains it instead."""
    from qwen3_trainium.models import hf_config

    flavor = hf_config.matching_flavor(hf_config.load(model_dir)) or "<its flavor>"
    message = (
        "a Qwen3-MoE checkpoint: torchtitan's Transformers backend loads experts as fused tensors "
        "(mlp.experts.gate_up_proj), and the Hub's files (and save_pretrained's) hold them per expert "
        "(mlp.experts.<e>.gate_proj ...), so none of its experts would load"
    )
    fix = f"model=nki_moe model.flavor={flavor} checkpoint=hf_finetune checkpoint.initial_load_path={model_dir} (or model=native)"
    return Problem("model.hf_model", model_dir, message, fix)


def model_vocab_size(run: RunConf) -> int:
    if run.model.path is ModelPath.hf:
        from qwen3_trainium.models import hf

        return int(hf.read_config(run.model.hf_model)["vocab_size"])
    return flavors.vocab_size(run.model.flavor)


def block_note(run: RunConf) -> str:
    """The blockwise op's blocks per layer, their padding and what the op saves for backward
    (``memory.blockwise_layer_bytes``); a warning where a smaller block size pads less."""
    from qwen3_trainium.memory import estimate
    from qwen3_trainium.models.kernels.rules import BLOCK_SIZES, num_blocks

    spec = flavors.model_spec(run.model.flavor, "flex")
    layer = next(layer for layer in spec.model.layers if getattr(layer, "moe", None) is not None)
    experts, top_k = layer.moe.num_experts, layer.moe.router.top_k
    tokens = run.training.local_batch_size * run.training.seq_len // run.parallel.context_parallel_degree
    block = run.model.moe_block_size
    if block not in BLOCK_SIZES:
        return ""
    slots = num_blocks(tokens, top_k, experts, block) * block
    shape = estimate.ModelShape(
        params=0, largest_layer=0, n_layers=len(spec.model.layers), dim=spec.model.dim, q_dim=0, kv_dim=0,
        ffn=0, n_heads=0, n_kv_heads=0, vocab=0, num_experts=experts, top_k=top_k,
        expert_width=layer.moe.routed_experts.inner_experts.hidden_dim,
    )  # fmt: skip
    saved = estimate.blockwise_layer_bytes(run, shape, tokens) / estimate.GiB
    kept = (
        "every layer's until its backward"
        if run.activation_checkpoint.mode.value == "none"
        else "one layer's at a time (recomputed)"
    )
    note = (
        f"MoE blocks per layer: {slots // block} of {block} = {slots:,} slots for {tokens * top_k:,} routed tokens "
        f"({100 * (1 - tokens * top_k / slots):.0f}% padding); the op saves {saved:.3f} GiB per layer, {kept}"
    )
    smaller = [b for b in BLOCK_SIZES if b < block]
    if smaller:
        fewer = num_blocks(tokens, top_k, experts, smaller[0]) * smaller[0]
        note += f"\nWARNING model.moe_block_size={smaller[0]} would pad less: {fewer:,} slots instead of {slots:,}"
    return note
