"""Every check that can fail before a process starts, reported all together.

Each problem names the config key, the bad value and the fix. ``check`` never raises for a
user error: it returns the list, and the launcher prints it and exits non-zero.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass

from qwen3_trainium import devices, flavors
from qwen3_trainium.schema import AttnBackend, ModelPath, RunConf

STREAMED_DATASETS = ("c4", "c4_validation")  # torchtitan streams these: no offline cache


@dataclass(frozen=True)
class Problem:
    key: str
    value: object
    message: str
    fix: str

    def __str__(self) -> str:
        return f"- {self.key} = {self.value!r}: {self.message}\n  fix: {self.fix}"


def format_problems(problems: list[Problem]) -> str:
    head = f"qwen3-trainium: {len(problems)} config problem(s), nothing was started:"
    return "\n".join([head, *map(str, problems)])


def _model(run: RunConf) -> list[Problem]:
    if run.model.path is ModelPath.hf:
        return _hf_model(run)
    known = flavors.all_flavors()
    if run.model.flavor not in known:
        return [
            Problem("model.flavor", run.model.flavor, "not a Qwen3 flavor", f"one of: {', '.join(known)}")
        ]
    return _kernels(run)


def _kernels(run: RunConf) -> list[Problem]:
    from qwen3_trainium.kernels import KERNEL_OVERRIDES

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
        problems += _moe_kernel(run)
    return problems


def _rope_seq_len(run: RunConf) -> list[Problem]:
    """rope_hf's rule, on every device: a config validated here must be valid on trn2."""
    from qwen3_trainium.kernels.rope import check_seq_len, seq_multiple

    try:
        check_seq_len(run.training.seq_len, run.device.lnc)
    except ValueError as err:
        fix = f"training.seq_len=<a multiple of {seq_multiple(run.device.lnc)}>, or model.kernels without rope_hf"
        return [Problem("training.seq_len", run.training.seq_len, f"ValueError: {err}", fix)]
    return []


def _moe_kernel(run: RunConf) -> list[Problem]:
    from qwen3_trainium.kernels.moe import BLOCK_SIZES

    model, par = run.model, run.parallel
    problems = []
    if model.moe_block_size not in BLOCK_SIZES:
        message = "the NKI MoE kernels take blocks of 256, 512 or 1024 tokens"
        problems.append(
            Problem("model.moe_block_size", model.moe_block_size, message, "model.moe_block_size=256")
        )
    degrees = {
        "expert_parallel_degree": par.expert_parallel_degree,
        "tensor_parallel_degree": par.tensor_parallel_degree,
    }
    for key, degree in degrees.items():
        if degree != 1:
            message = "the blockwise MoE kernel replaces torchtitan's token dispatch: experts stay whole on each rank"
            fix = f"parallel.{key}=1, or model.kernels without moe_experts"
            problems.append(Problem(f"parallel.{key}", degree, message, fix))
    if run.device.type.value == "neuron":
        problems += _moe_dims_on_neuron(run)
    return problems


def _moe_dims_on_neuron(run: RunConf) -> list[Problem]:
    """moe_cte / blockwise_mm_bwd shape rules (Neuron only: elsewhere the reference runs)."""
    spec = flavors.model_spec(run.model.flavor, "flex")
    layer = next(layer for layer in spec.model.layers if getattr(layer, "moe", None) is not None)
    experts = layer.moe.routed_experts.inner_experts
    dim, inter, lnc = experts.dim, experts.hidden_dim, run.device.lnc
    fits_h = dim % 512 == 0 and 512 <= dim <= 8192 and (dim // lnc) % 32 == 0
    if fits_h and inter % 16 == 0 and (inter // lnc) % 32 == 0:
        return []
    message = (
        f"hidden size {dim} / expert size {inter} do not fit the NKI MoE kernels "
        "(H a multiple of 512 in [512, 8192], I a multiple of 32 per core)"
    )
    fix = "a larger flavor (30B-A3B, 235B-A22B), or model.kernels without moe_experts"
    return [Problem("model.flavor", run.model.flavor, message, fix)]


def _hf_model(run: RunConf) -> list[Problem]:
    from qwen3_trainium import hf

    if hf.transformers_major() < hf.MIN_TRANSFORMERS_MAJOR:
        import transformers

        message = f"transformers {transformers.__version__} is installed; model=hf needs Transformers v5"
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


def model_vocab_size(run: RunConf) -> int:
    if run.model.path is ModelPath.hf:
        from qwen3_trainium import hf

        return int(hf.read_config(run.model.hf_model)["vocab_size"])
    return flavors.vocab_size(run.model.flavor)


def _attention(run: RunConf) -> list[Problem]:
    device, backend = run.device.type.value, run.model.attn_backend
    reasons = {
        ("cpu", AttnBackend.flex): "FlexAttention has no backward on CPU",
        ("cpu", AttnBackend.varlen): "varlen attention needs CUDA flash attention",
        ("neuron", AttnBackend.flex): "FlexAttention is compiled by Inductor, which does not target Neuron",
        ("neuron", AttnBackend.varlen): "varlen attention needs CUDA flash attention",
    }
    reason = reasons.get((device, backend))
    if reason is None:
        return []
    return [
        Problem(
            "model.attn_backend",
            backend.value,
            f"{reason} (device.type={device})",
            "model.attn_backend=sdpa (or auto)",
        )
    ]


def _training(run: RunConf) -> list[Problem]:
    problems = []
    for key in ("steps", "seq_len", "local_batch_size"):
        value = getattr(run.training, key)
        if value < 1:
            problems.append(
                Problem(
                    f"training.{key}", value, "must be at least 1", f"training.{key}=<a positive integer>"
                )
            )
    if run.launcher.nproc_per_node < 1 or run.launcher.nnodes < 1:
        problems.append(
            Problem(
                "launcher.nproc_per_node",
                run.launcher.nproc_per_node,
                "must be at least 1 (or -1: one per device)",
                "launcher.nproc_per_node=-1",
            )
        )
    return problems


def _world_size(run: RunConf) -> list[Problem]:
    par, launcher = run.parallel, run.launcher
    world = launcher.nnodes * launcher.nproc_per_node
    fixed = (
        par.data_parallel_replicate_degree * par.tensor_parallel_degree
        * par.pipeline_parallel_degree * par.context_parallel_degree
    )  # fmt: skip
    shard = par.data_parallel_shard_degree
    if world < 1 or (world % fixed == 0 if shard == -1 else fixed * shard == world):
        return []
    degrees = (
        f"replicate {par.data_parallel_replicate_degree} x shard {shard} x tensor {par.tensor_parallel_degree}"
        f" x pipeline {par.pipeline_parallel_degree} x context {par.context_parallel_degree}"
    )
    ranks = f"{world} ranks (launcher.nnodes={launcher.nnodes} x launcher.nproc_per_node={launcher.nproc_per_node})"
    if shard == -1:
        message = f"{ranks} cannot be split into groups of {fixed} (the degrees other than shard)"
    else:
        message = f"the degrees multiply to {fixed * shard}, but there are {ranks}"
    fix = "parallel.data_parallel_shard_degree=-1 (shard over what is left), or change the degrees"
    return [Problem("parallel", degrees, message, fix)]


def _data(run: RunConf) -> list[Problem]:
    problems = []
    assets = run.data.hf_assets_path
    if not os.path.isfile(os.path.join(assets, "tokenizer.json")):
        problems.append(
            Problem(
                "data.hf_assets_path",
                assets,
                "no tokenizer.json in this directory",
                "point data.hf_assets_path at a directory with tokenizer.json (and tokenizer_config.json)",
            )
        )
    from torchtitan.hf_datasets.text_datasets import DATASETS

    if run.data.dataset.lower() not in DATASETS:
        fix = f"one of {', '.join(sorted(DATASETS))}, or data=local data.dataset_path=<dir>"
        problems.append(Problem("data.dataset", run.data.dataset, "not a torchtitan dataset name", fix))
    path = run.data.dataset_path
    if path and os.path.isabs(path) and not os.path.isdir(path):
        what = "is a file, not a directory" if os.path.isfile(path) else "does not exist"
        fix = (
            f"data.dataset_path={os.path.dirname(path)}"
            if os.path.isfile(path)
            else "data.dataset_path=<a directory of *.jsonl / *.txt>"
        )
        problems.append(Problem("data.dataset_path", path, what, fix))
    return problems


def _needs_hub(run: RunConf) -> bool:
    path = run.data.dataset_path
    return not (path and os.path.isabs(path))


def hub_offline() -> bool:
    """True when the Hugging Face Hub is switched off or cannot be reached (5 s probe)."""
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return True
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or ""
    try:
        socket.create_connection((host, 443), timeout=5).close()
    except OSError:
        return True
    return False


def _hub_cached(repo: str) -> bool:
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(repo, repo_type="dataset", local_files_only=True)
    except Exception:  # LocalEntryNotFoundError and friends: not in the cache
        return False
    return True


def _hub_dataset(run: RunConf) -> list[Problem]:
    from torchtitan.hf_datasets.text_datasets import DATASETS

    name = run.data.dataset.lower()
    repo = run.data.dataset_path or DATASETS[name].path
    streamed = name in STREAMED_DATASETS and not run.data.dataset_path
    if (streamed or not _hub_cached(repo)) and hub_offline():
        return [
            Problem(
                "data.dataset", repo,
                "a Hugging Face Hub dataset that is not in the local cache, and the Hub cannot be reached from here",
                f"download it where there is network (hf download --repo-type dataset {repo} --local-dir ./assets/data) "
                "and run with data=local data.dataset_path=./assets/data",
            )
        ]  # fmt: skip
    return []


def _tokenizer_fits(run: RunConf) -> list[Problem]:
    tokenizer = os.path.join(run.data.hf_assets_path, "tokenizer.json")
    if not os.path.isfile(tokenizer):
        return []
    with open(tokenizer) as f:
        data = json.load(f)
    ids = list(data["model"]["vocab"].values()) + [t["id"] for t in data.get("added_tokens", [])]
    vocab = max(ids) + 1
    model_vocab = model_vocab_size(run)
    if vocab <= model_vocab:
        return []
    message = f"the tokenizer has {vocab} ids but the model ({run.model.flavor}) has vocab_size {model_vocab}"
    return [
        Problem(
            "data.hf_assets_path",
            run.data.hf_assets_path,
            message,
            "use the model's own tokenizer, or a larger flavor",
        )
    ]


def _device_present(run: RunConf) -> list[Problem]:
    device = run.device.type.value
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return [
                Problem(
                    "device",
                    device,
                    "CUDA is not available on this machine",
                    "device=cpu (or device=auto), or dry_run=true to only validate",
                )
            ]
    if device == "neuron" and devices.detect_device_type() != "neuron":
        return [
            Problem(
                "device",
                device,
                "no Neuron device here (torch-neuronx missing, or it sees no NeuronCore; Trainium hosts install it from the Neuron pip repository)",
                "device=auto, or dry_run=true to only validate a Trainium config here",
            )
        ]
    return []


def _titan(run: RunConf, run_dir: str) -> list[Problem]:
    """Let torchtitan validate here, as each rank would: build the Trainer.Config, size the
    model against it (seq_len vs RoPE table, TP vs heads) and apply the overrides, on a copy."""
    import copy

    from torchtitan.config import apply_overrides

    from qwen3_trainium.titan import to_trainer_config

    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # rank 0 logs torchtitan's own INFO and warnings; once is enough
    try:
        cfg = to_trainer_config(run, run_dir)
        trial = copy.deepcopy(cfg)
        trial.model_spec.model.update_from_config(config=trial)
        try:
            apply_overrides(trial.override, trial)
        except (ValueError, TypeError, ImportError) as err:  # conflicts name both overrides
            fix = "drop one of them (override.imports, model.kernels) or narrow its fqns"
            return [Problem("override.imports", [str(e) for e in trial.override.imports], str(err), fix)]
    except (ValueError, TypeError, AssertionError, ImportError, NotImplementedError) as err:
        return [
            Problem(
                "(torchtitan)",
                "Trainer.Config",
                f"torchtitan rejected the config: {err}",
                "change the value it names",
            )
        ]
    finally:
        root.setLevel(level)
    return []


def missing_values(cfg) -> list[Problem]:
    """Required values (``???``) nobody set: reported before the config is resolved."""
    from omegaconf import OmegaConf

    return [
        Problem(key, "???", "a required value is not set", f"{key}=<value> on the command line")
        for key in sorted(OmegaConf.missing_keys(cfg))
    ]


def check(run: RunConf, run_dir: str, *, launching: bool) -> list[Problem]:
    problems = _model(run)
    if problems:
        return problems  # the checks below need a known model
    problems += _attention(run) + _training(run) + _world_size(run) + _data(run) + _tokenizer_fits(run)
    if launching:
        problems += _device_present(run)
        if _needs_hub(run) and not problems:
            problems += _hub_dataset(run)
    if not problems:
        problems += _titan(run, run_dir)
    return problems
