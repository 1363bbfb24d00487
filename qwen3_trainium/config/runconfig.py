"""The run config as both sides read it: ``<run_dir>/resolved.yaml`` (written once by the parent,
``parent/compose.py``) loaded back against the same schema, its derived degrees, its asset paths.

Ranks never see Hydra or OmegaConf and never detect devices again, so every rank trains exactly
the config that was checked and printed.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from qwen3_trainium.config.schema import (
    RunConf,
)

RESOLVED_NAME = "resolved.yaml"
RESOLVED_ENV = "QWEN3_TRAINIUM_RESOLVED"
ASSETS_DIR = Path(__file__).resolve().parents[1] / "data"


def asset_path(name: str) -> str:
    """``${q3t_asset:tokenizer}`` in YAML: a shipped asset directory."""
    return str(ASSETS_DIR / name)


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


def resolved_name(node_rank: int) -> str:
    """Node 0's ``resolved.yaml``; every other node of a multi-node job writes its own beside it
    (the run directory is shared, and the files differ in ``launcher.node_rank``)."""
    return RESOLVED_NAME if node_rank <= 0 else f"resolved.node{node_rank}.yaml"


def rank_config_path(run_dir: str, environ=os.environ) -> str:
    """The resolved config this rank's node wrote (``QWEN3_TRAINIUM_RESOLVED``, set by the launcher)."""
    return os.path.join(run_dir, environ.get(RESOLVED_ENV, RESOLVED_NAME))


def load(path: str) -> RunConf:
    """The run config the parent wrote (``save`` in ``parent/compose.py``: OmegaConf's YAML of a
    checked ``RunConf``), rebuilt without OmegaConf: a rank imports no config library."""
    import yaml

    with open(path) as f:
        return _build(RunConf, yaml.safe_load(f))


def _build(tp, value):
    """``value`` (parsed YAML) as the schema type ``tp``: dataclasses, enums (by name, as OmegaConf
    writes them), lists, ``X | None`` and scalars."""
    if value is None:
        return None
    if dataclasses.is_dataclass(tp):
        hints = {f.name: f.type for f in dataclasses.fields(tp)}
        unknown = set(value) - set(hints)
        if unknown:
            raise ValueError(f"{tp.__name__}: keys {sorted(unknown)} are not in the schema")
        return tp(**{name: _build(hints[name], v) for name, v in value.items()})
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _build(inner, value)
    if origin is list:
        (inner,) = typing.get_args(tp)
        return [_build(inner, v) for v in value]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp[value]
    if tp is float:
        return float(value)
    return value


def hf_checkpoint(run: RunConf) -> bool:
    """The run loads HF weights or exports them."""
    ckpt = run.checkpoint
    return ckpt.enable and (ckpt.initial_load_in_hf or ckpt.last_save_in_hf)
