"""The run config: Hydra's composed config with every ``auto`` filled and every path absolute.

``resolve`` runs once, in the parent; ``save`` writes ``<run_dir>/resolved.yaml``; ``load``
reads it back (in each rank) against the same schema. Ranks never see Hydra and never detect
devices again, so every rank trains exactly the config that was checked and printed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from qwen3_trainium import flavors, nodes
from qwen3_trainium.schema import (
    AttnBackend,
    CompileBackend,
    CompileComponent,
    DeviceType,
    MemoryMode,
    ModelPath,
    ParamDtype,
    RunConf,
)

RESOLVED_NAME = "resolved.yaml"
RESOLVED_ENV = "QWEN3_TRAINIUM_RESOLVED"
ASSETS_DIR = Path(__file__).parent / "data"

# Fields holding paths a user types; made absolute against the launch directory.
_PATH_FIELDS = (
    ("data", "dataset_path"),
    ("data", "hf_assets_path"),
    ("checkpoint", "initial_load_path"),
    ("model", "hf_model"),
)


def asset_path(name: str) -> str:
    """``${q3t_asset:tokenizer}`` in YAML: a shipped asset directory."""
    return str(ASSETS_DIR / name)


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("q3t_asset"):
        OmegaConf.register_new_resolver("q3t_asset", asset_path)


def _looks_local(path: str) -> bool:
    return path.startswith((".", "/", "~")) or os.path.exists(path)


def resolve(cfg: DictConfig, launch_dir: str) -> RunConf:
    """Typed run config from Hydra's composed config: autos filled, paths absolute."""
    from qwen3_trainium import devices

    run: RunConf = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    if run.device.type is DeviceType.auto:
        run.device.type = DeviceType(devices.detect_device_type())
    device = run.device.type.value
    if run.model.flavor == "auto" and run.model.path is not ModelPath.hf:
        run.model.flavor = flavors.default_flavor(device, moe=run.model.path is ModelPath.nki_moe)
    if run.training.mixed_precision_param is ParamDtype.auto:
        run.training.mixed_precision_param = ParamDtype.float32 if device == "cpu" else ParamDtype.bfloat16
    if run.memory.mode is MemoryMode.auto:
        uncalibrated = device == "neuron" and run.model.path is ModelPath.hf
        run.memory.mode = MemoryMode.trace if uncalibrated else MemoryMode.estimate
    if run.model.moe_compute_dtype is ParamDtype.auto:
        neuron = device == "neuron"
        run.model.moe_compute_dtype = ParamDtype.bfloat16 if neuron else run.training.mixed_precision_param
    if run.model.attn_backend is AttnBackend.auto:
        run.model.attn_backend = AttnBackend.flex if device == "cuda" else AttnBackend.sdpa
    _resolve_compile(run)
    known_instance = device != "neuron" or run.device.instance in devices.NEURON_INSTANCES
    if run.launcher.nproc_per_node == -1 and known_instance and run.device.lnc in (1, 2):
        info = devices.device_info(device, lnc=run.device.lnc, instance=run.device.instance)
        run.launcher.nproc_per_node = info.devices_per_node  # else -1 stays: pre-flight explains
    nodes.resolve_launcher(run.launcher, dict(os.environ))
    for group, key in _PATH_FIELDS:
        node = getattr(run, group)
        value = getattr(node, key)
        if value and _looks_local(value):
            setattr(node, key, os.path.abspath(os.path.join(launch_dir, os.path.expanduser(value))))
    if run.model.path is ModelPath.hf:
        _resolve_hf(run)
    else:
        _resolve_tokenizer(run)
    return run


def _resolve_compile(run: RunConf) -> None:
    comp, device = run.compile, run.device.type.value
    if comp.backend is CompileBackend.auto:
        comp.backend = CompileBackend.neuron if device == "neuron" else CompileBackend.inductor
    if comp.enable_async_tensor_parallel is None:
        comp.enable_async_tensor_parallel = (
            comp.enable
            and device == "cuda"
            and run.parallel.tensor_parallel_degree > 1
            and CompileComponent.model in comp.components
        )


def checkpoint_tokenizer_dir(run: RunConf) -> str | None:
    """The HF directory a fine-tune starts from, when it holds a tokenizer (native, nki_moe)."""
    ckpt = run.checkpoint
    if not (ckpt.enable and ckpt.initial_load_in_hf and ckpt.initial_load_path):
        return None
    return (
        ckpt.initial_load_path
        if os.path.isfile(os.path.join(ckpt.initial_load_path, "tokenizer.json"))
        else None
    )


def _resolve_tokenizer(run: RunConf) -> None:
    """``data.hf_assets_path=auto``: a fine-tune from an HF directory tokenizes with that model's
    own tokenizer; anything else with the shipped one. A path the user gives is kept."""
    if run.data.hf_assets_path == "auto":
        run.data.hf_assets_path = checkpoint_tokenizer_dir(run) or asset_path("tokenizer")


def _resolve_hf(run: RunConf) -> None:
    """model=hf: the model directory (made on first use if it is the embedded one; a hub id
    found in the local cache becomes its snapshot directory) also supplies the tokenizer."""
    from qwen3_trainium import hf, make_assets

    if run.model.hf_model == str(make_assets.HF_TINY_DIR):
        make_assets.ensure_hf_model()
    model_dir = hf.local_model_dir(run.model.hf_model)
    if model_dir is None:
        return  # pre-flight reports it, with the download command
    run.model.hf_model = model_dir
    run.data.hf_assets_path = model_dir


@dataclass(frozen=True)
class Degrees:
    world: int  # launcher.nnodes x launcher.nproc_per_node
    fixed: int  # replicate x tensor x pipeline x context: every degree but the FSDP shard
    shard: int  # data_parallel_shard_degree with -1 resolved (what the others leave)


def degrees(run: RunConf) -> Degrees:
    par = run.parallel
    world = run.launcher.nnodes * run.launcher.nproc_per_node
    fixed = (
        par.data_parallel_replicate_degree * par.tensor_parallel_degree
        * par.pipeline_parallel_degree * par.context_parallel_degree
    )  # fmt: skip
    shard = par.data_parallel_shard_degree if par.data_parallel_shard_degree != -1 else world // max(fixed, 1)
    return Degrees(world, fixed, shard)


def to_yaml(run: RunConf) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(run))


def resolved_name(node_rank: int) -> str:
    """Node 0's ``resolved.yaml``; every other node of a multi-node job writes its own beside it
    (the run directory is shared, and the files differ in ``launcher.node_rank``)."""
    return RESOLVED_NAME if node_rank <= 0 else f"resolved.node{node_rank}.yaml"


def rank_config_path(run_dir: str, environ=os.environ) -> str:
    """The resolved config this rank's node wrote (``QWEN3_TRAINIUM_RESOLVED``, set by the launcher)."""
    return os.path.join(run_dir, environ.get(RESOLVED_ENV, RESOLVED_NAME))


def save(run: RunConf, run_dir: str, name: str | None = None) -> str:
    path = os.path.join(run_dir, name or resolved_name(run.launcher.node_rank))
    os.makedirs(run_dir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(to_yaml(run))
    os.replace(path + ".tmp", path)
    return path


def load(path: str) -> RunConf:
    merged = OmegaConf.merge(OmegaConf.structured(RunConf), OmegaConf.load(path))
    return OmegaConf.to_object(merged)  # type: ignore[return-value]
