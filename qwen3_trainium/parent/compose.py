"""Composition, in the parent only: Hydra's config (checked against the schema registered here)
to the typed run config, with every ``auto`` filled and every path absolute; ``save`` writes it
to ``<run_dir>/resolved.yaml`` for the ranks (``config/runconfig.py`` reads it back).
"""

from __future__ import annotations

import os

from omegaconf import DictConfig, OmegaConf

from qwen3_trainium.config import flavors, nodes
from qwen3_trainium.config.runconfig import asset_path, checkpoint_tokenizer_dir, resolved_name
from qwen3_trainium.config.schema import (
    AttnBackend,
    CompileBackend,
    CompileComponent,
    DeviceType,
    MemoryMode,
    ModelPath,
    ParamDtype,
    RunConf,
)

# Fields holding paths a user types; made absolute against the launch directory.
_PATH_FIELDS = (
    ("data", "dataset_path"),
    ("data", "hf_assets_path"),
    ("data", "chat_template"),
    ("checkpoint", "initial_load_path"),
    ("model", "hf_model"),
)


def register() -> None:
    """The schema Hydra composes against (``conf/config.yaml``'s defaults name ``run_schema``)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="run_schema", node=RunConf)


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("q3t_asset"):
        OmegaConf.register_new_resolver("q3t_asset", asset_path)
    if not OmegaConf.has_resolver("q3t_choices"):
        OmegaConf.register_new_resolver("q3t_choices", chosen_options)


def chosen_options(choices) -> str:
    """``--help``'s line of the groups' options in force (``hydra.runtime.choices``, Hydra's own
    groups left out), in the order the help lists the groups."""
    chosen = {g: o for g, o in choices.items() if not g.startswith("hydra/") and o is not None}
    return " ".join(f"{g}={chosen[g]}" for g in sorted(chosen))


def _looks_local(path: str) -> bool:
    return path.startswith((".", "/", "~")) or os.path.exists(path)


def resolve(cfg: DictConfig, launch_dir: str) -> RunConf:
    """Typed run config from Hydra's composed config: autos filled, paths absolute."""
    from qwen3_trainium.config import devices

    run: RunConf = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    if run.device.type is DeviceType.auto:
        run.device.type = DeviceType(devices.detect_device_type())
    device = run.device.type.value
    if run.model.flavor == "auto" and run.model.path is not ModelPath.hf:
        run.model.flavor = flavors.default_flavor(device, moe=run.model.path is ModelPath.nki_moe)
    if run.training.mixed_precision_param is ParamDtype.auto:
        run.training.mixed_precision_param = ParamDtype.float32 if device == "cpu" else ParamDtype.bfloat16
    if (
        run.memory.mode is MemoryMode.auto and not run.parallel.auto
    ):  # parallel=auto traces its best (parent/auto)
        uncalibrated = device == "neuron" and run.model.path is ModelPath.hf
        run.memory.mode = MemoryMode.trace if uncalibrated else MemoryMode.estimate
    if run.model.moe_compute_dtype is ParamDtype.auto:
        neuron = device == "neuron"
        run.model.moe_compute_dtype = ParamDtype.bfloat16 if neuron else run.training.mixed_precision_param
    if run.model.attn_backend is AttnBackend.auto:
        run.model.attn_backend = _auto_attention(run, device)
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


def _auto_attention(run: RunConf, device: str) -> AttnBackend:
    """flex on CUDA; sdpa on CPU and Neuron, except the grouped_mm MoE route on Neuron: AWS's SDK
    2.34 MoE recipes use "the models' own attention, not ... sdpa" (torch-neuronx v2.34.0 release
    notes), and of torchtitan's own backends varlen is the one those notes say works on Neuron
    ("torch.nn.attention.varlen.varlen_attn") that the memory trace can also run on CPU."""
    if device == "cuda":
        return AttnBackend.flex
    grouped_mm = flavors.grouped_mm_route(run.model.path.value, run.model.flavor)
    return AttnBackend.varlen if device == "neuron" and grouped_mm else AttnBackend.sdpa


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


def _resolve_tokenizer(run: RunConf) -> None:
    """``data.hf_assets_path=auto``: a fine-tune from an HF directory tokenizes with that model's
    own tokenizer; anything else with the shipped one. A path the user gives is kept."""
    if run.data.hf_assets_path == "auto":
        run.data.hf_assets_path = checkpoint_tokenizer_dir(run) or asset_path("tokenizer")


def _resolve_hf(run: RunConf) -> None:
    """model=hf: the model directory (made on first use if it is the embedded one; a hub id
    found in the local cache becomes its snapshot directory) also supplies the tokenizer."""
    from qwen3_trainium.data import assets
    from qwen3_trainium.models import hf

    if run.model.hf_model == str(assets.HF_TINY_DIR):
        assets.ensure_hf_model()
    model_dir = hf.local_model_dir(run.model.hf_model)
    if model_dir is None:
        return  # pre-flight reports it, with the download command
    run.model.hf_model = model_dir
    run.data.hf_assets_path = model_dir


def to_yaml(run: RunConf) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(run))


def save(run: RunConf, run_dir: str, name: str | None = None) -> str:
    path = os.path.join(run_dir, name or resolved_name(run.launcher.node_rank))
    os.makedirs(run_dir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(to_yaml(run))
    os.replace(path + ".tmp", path)
    return path
