"""Pre-flight checks of the checkpoint group: the paths, the HF weights against the model (every
key and shape, through the model's own state-dict adapter), and the folder a run resumes from.

torchtitan loads HF weights with ``strict=False``, so a missing tensor would train silently from
random init; here it is an error before any process starts (``checkpoint.allow_partial_load``
turns it into a printed warning for deliberate partial loads).
"""

from __future__ import annotations

import glob
import os

from qwen3_trainium.config.schema import ModelPath, RunConf
from qwen3_trainium.parent.preflight.problem import Problem
from qwen3_trainium.shared.contract import latest_step

SHOWN = 5  # keys listed per kind in a message


def check_shard_size(run: RunConf) -> list[Problem]:
    from qwen3_trainium.models.hf_export import parse_size

    try:
        if parse_size(run.checkpoint.hf_max_shard_size) <= 0:
            raise ValueError("a shard must hold at least one byte")
    except ValueError as err:
        fix = "checkpoint.hf_max_shard_size=5GB (or 500MB, 2GiB, a number of bytes)"
        return [Problem("checkpoint.hf_max_shard_size", run.checkpoint.hf_max_shard_size, str(err), fix)]
    return []


def check_checkpoint_paths(run: RunConf) -> list[Problem]:
    ck = run.checkpoint
    if ck.initial_load_in_hf and not ck.initial_load_path and run.model.path is not ModelPath.hf:
        message = "checkpoint=hf_finetune loads HF weights from a directory, and none is set"
        return [
            Problem(
                "checkpoint.initial_load_path",
                None,
                message,
                "checkpoint.initial_load_path=<an HF model directory>",
            )
        ]
    path = ck.initial_load_path
    if not path:
        return []
    if not os.path.isdir(path):
        what = "is a file, not a directory" if os.path.exists(path) else "does not exist"
        return [
            Problem(
                "checkpoint.initial_load_path",
                path,
                what,
                "checkpoint.initial_load_path=<a checkpoint directory>",
            )
        ]
    if not ck.initial_load_in_hf:
        return []
    problems = []
    if not os.path.isfile(os.path.join(path, "config.json")):
        problems.append(
            Problem(
                "checkpoint.initial_load_path",
                path,
                "no config.json: not an HF model directory",
                "point it at a complete HF model directory",
            )
        )
    if not glob.glob(os.path.join(path, "*.safetensors")):
        problems.append(
            Problem(
                "checkpoint.initial_load_path",
                path,
                "no *.safetensors weights in this directory",
                "download the weights (hf download <id> --local-dir <dir>)",
            )
        )
    return problems


def check_checkpoint_contents(run: RunConf, run_dir: str, trial, notes: list[str]) -> list[Problem]:
    """HF initial weights and the resume folder against the model ``trial`` would build."""
    ckpt = trial.checkpoint
    problems: list[Problem] = []
    hf_dir = ckpt.initial_load_path if ckpt.enable and ckpt.initial_load_in_hf else None
    if hf_dir and run.model.path is not ModelPath.hf:
        problems += _config_dims(run, trial, hf_dir)
    if hf_dir and not problems:
        problems += _hf_keys(run, trial, hf_dir, notes)
    if ckpt.enable:
        problems += _resume_folder(os.path.join(run_dir, ckpt.folder), trial, notes, ckpt.load_step, run)
    return problems


def _config_dims(run: RunConf, trial, hf_dir: str) -> list[Problem]:
    """config.json, parsed by Transformers, against the flavor: every shape-defining field."""
    from qwen3_trainium.models import hf_config

    cfg = hf_config.load(hf_dir)
    where = f"{hf_dir}/config.json"
    uniform = "a Qwen3 checkpoint whose every layer is the same (dense, or routed experts only)"
    problems = [
        Problem(
            f"{where}: {field}", value, f"{why}: this project's Qwen3 models cannot represent it", uniform
        )
        for field, value, why in hf_config.unsupported(cfg)
    ]
    # RoPE scaling is the rope check's (rope.py): YaRN set on a default-RoPE checkpoint is allowed
    flavor, published = (
        {k: v for k, v in fields.items() if k not in hf_config.ROPE}
        for fields in (hf_config.flavor_fields(trial.model_spec.model), hf_config.published_fields(cfg))
    )
    diffs = hf_config.differences(flavor, published)
    if diffs:
        message = f"model.flavor={run.model.flavor} disagrees with {where} ({'; '.join(diffs)})"
        fix = "the flavor of these weights (or model=hf model.hf_model=<dir>)"
        problems.append(Problem("model.flavor", run.model.flavor, message, fix))
    return problems


def _meta_state_shapes(trial):
    """(``{key: shape}`` of the model's state dict, the model), built on the meta device."""
    import torch

    with torch.device("meta"):
        model = trial.model_spec.model.build()
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}, model


def _hf_keys(run: RunConf, trial, hf_dir: str, notes: list[str]) -> list[Problem]:
    from safetensors import safe_open

    _, model = _meta_state_shapes(trial)
    adapter = trial.model_spec.state_dict_adapter(trial.model_spec.model, trial.hf_assets_path)
    expected = {k: tuple(v.shape) for k, v in adapter.to_hf(model.state_dict()).items()}
    present: dict[str, tuple] = {}
    for path in sorted(glob.glob(os.path.join(hf_dir, "*.safetensors"))):
        with safe_open(path, "pt") as f:
            present.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})
    missing = sorted(set(expected) - set(present))
    unexpected = sorted(set(present) - set(expected))
    shapes = sorted(k for k in set(expected) & set(present) if expected[k] != present[k])
    if not (missing or unexpected or shapes):
        notes.append(
            f"HF weights {hf_dir}: all {len(expected)} tensors match the model (0 missing, 0 unexpected)"
        )
        return []
    detail = "; ".join(
        f"{len(keys)} {kind} ({', '.join(keys[:SHOWN])}{', ...' if len(keys) > SHOWN else ''})"
        for kind, keys in (("missing", missing), ("unexpected", unexpected), ("with another shape", shapes))
        if keys
    )
    if run.checkpoint.allow_partial_load:
        notes.append(f"WARNING partial HF load allowed (checkpoint.allow_partial_load=true): {detail}")
        return []
    fix = (
        "weights of this model (model.flavor / model.hf_model), "
        "or checkpoint.allow_partial_load=true for a deliberate partial load"
    )
    return [
        Problem("checkpoint.initial_load_path", hf_dir, f"the HF weights do not fit the model: {detail}", fix)
    ]


def check_resume_kind(run: RunConf, run_dir: str) -> list[Problem]:
    """The newest step torchtitan would resume from is not an HF export (files only, no torch)."""
    if not run.checkpoint.enable:
        return []
    folder = os.path.join(run_dir, run.checkpoint.folder)
    latest = latest_step(folder)
    if latest is None or latest[1] != "hf":
        return []
    step_dir = os.path.join(folder, f"step-{latest[0]}")
    message = (
        f"{step_dir} is the HF export of a finished run; torchtitan would try to resume from it and fail"
    )
    fix = f"a new run directory, starting from it: checkpoint=hf_finetune checkpoint.initial_load_path={step_dir}"
    return [Problem("checkpoint.folder", folder, message, fix)]


def _resume_step(folder: str, load_step: int = -1) -> str | None:
    """The DCP step folder torchtitan would resume from, or None (nothing, or an HF export)."""
    latest = latest_step(folder)
    if latest is None:
        return None
    step, kind = latest
    if load_step >= 0:
        step, kind = load_step, "dcp"  # files.check_load_step: it exists
    return None if kind == "hf" else os.path.join(folder, f"step-{step}")  # hf: check_resume_kind's


def _resume_folder(
    folder: str, trial, notes: list[str], load_step: int = -1, run: RunConf | None = None
) -> list[Problem]:
    """The step a run resumes from: its model, and (``resume_data.py``) its data positions."""
    step_dir = _resume_step(folder, load_step)
    if step_dir is None:
        return []
    from torch.distributed.checkpoint import FileSystemReader

    try:
        saved = FileSystemReader(step_dir).read_metadata().state_dict_metadata
    except Exception as err:  # a truncated or foreign .metadata: unpickling fails in many ways
        message = f"{step_dir}/.metadata cannot be read as a DCP checkpoint ({type(err).__name__}: {err})"
        fix = "checkpoint.load_step=<an earlier saved step>, or move the damaged step folder aside"
        return [Problem("checkpoint.folder", folder, message, fix)]
    problems = _resume_model(folder, step_dir, saved, trial)
    if not problems and run is not None:
        from qwen3_trainium.parent.preflight.resume_data import check_resume_data

        problems = check_resume_data(run, step_dir, saved, notes)
    if not problems:
        notes.append(f"resuming from {step_dir}")
    return problems


def _resume_model(folder: str, step_dir: str, saved: dict, trial) -> list[Problem]:
    """The step's tensors against the model this run builds."""
    ours, _ = _meta_state_shapes(trial)
    wrong = sorted(
        k for k, shape in ours.items() if k not in saved or tuple(getattr(saved[k], "size", ())) != shape
    )
    if not wrong:
        return []
    layouts = _expert_layouts(saved, ours)
    if layouts:
        return [_expert_layout_problem(folder, step_dir, *layouts)]
    message = (
        f"{step_dir} holds a different model: {len(wrong)} of {len(ours)} tensors missing or shaped "
        f"differently ({', '.join(wrong[:SHOWN])})"
    )
    fix = "resume with the model that wrote it, or use a new run directory"
    return [Problem("checkpoint.folder", folder, message, fix)]


def _expert_layouts(saved, ours) -> tuple[str, str] | None:
    """(the checkpoint's expert layout, the model's) when they are the two different layouts of
    the same experts (``convert_experts.py``), else None."""
    from qwen3_trainium.models.expert_layout import layout_of

    have, want = layout_of(saved), layout_of(ours)
    return (have, want) if have and want and have != want else None


def _expert_layout_problem(folder: str, step_dir: str, have: str, want: str) -> Problem:
    written = {
        "torchtitan": "torchtitan's grouped-experts layout (w1_EFD / w2_EDF / w3_EFD: model=native, "
        "model=nki_moe without moe_experts, and model=nki_moe checkpoints written before its experts were stored fused)",
        "fused": "the NKI kernels' layout (gate_up_ED2F / down_EFD: model=nki_moe with moe_experts)",
    }
    message = f"{step_dir} holds the experts in {written[have]}; this model stores them in {written[want]}"
    fix = f"convert the step once (the original is kept): python -m qwen3_trainium.convert_experts {step_dir} --to {want}"
    return Problem("checkpoint.folder", folder, message, fix)
