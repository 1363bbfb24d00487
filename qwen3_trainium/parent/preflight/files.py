"""Pre-flight checks of the files a run will read and the folders it will write, in the parent,
before any process starts (standard library only: milliseconds, run on every launch, never
cached):
- every safetensors file that will be read, the shard index included, has a whole header;
- ``config.json`` names the architecture of the path (Qwen3 for dense, Qwen3-MoE for MoE);
- ``checkpoint.load_step`` exists;
- the run, checkpoint and export folders can be written (a probe file created and removed).

The safetensors layout (huggingface/safetensors, "Format"): 8 bytes, a little-endian unsigned
64-bit N; N bytes of a UTF-8 JSON header mapping each tensor name to ``dtype``, ``shape`` and
``data_offsets`` [begin, end] into the byte buffer that follows (``__metadata__`` aside); then
the buffer, which the offsets cover entirely. An interrupted download or a full disk leaves a
file shorter than its header says, which safetensors itself reports only as "Error while
deserializing header", with no file name, from inside a rank.
"""

from __future__ import annotations

import json
import os
import re
import struct

from qwen3_trainium.config import flavors
from qwen3_trainium.config.schema import ModelPath, RunConf
from qwen3_trainium.parent.preflight.problem import Problem

INDEX = "model.safetensors.index.json"
MAX_HEADER = 100 * 2**20  # safetensors refuses larger headers (its N_MAX... "HeaderTooLarge")
PROBE = ".qwen3-trainium-write-probe"
# config.json's model_type and architectures of each kind (Transformers' Qwen3 and Qwen3-MoE:
# transformers/models/qwen3/configuration_qwen3.py, qwen3_moe/configuration_qwen3_moe.py)
ARCHITECTURES = {
    "qwen3": ("Qwen3 (dense)", "Qwen3ForCausalLM"),
    "qwen3_moe": ("Qwen3-MoE", "Qwen3MoeForCausalLM"),
}


def _size(n: int) -> str:
    return f"{n:,} bytes"


def safetensors_header_problem(path: str) -> str | None:
    """Why ``path`` is not a whole safetensors file, or None if its header and sizes agree."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{_size(size)}: too short to hold a header"
            (length,) = struct.unpack("<Q", head)
            if length > MAX_HEADER or 8 + length > size:
                return f"{_size(size)}: the header says {_size(length)} of header alone"
            header = json.loads(f.read(length).decode("utf-8"))
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    except (UnicodeDecodeError, ValueError):
        return f"{_size(size)}: the header is not valid JSON"
    if not isinstance(header, dict):
        return f"{_size(size)}: the header is not a JSON object"
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = entry["data_offsets"]
            end = max(end, int(stop))
        except (TypeError, KeyError, ValueError):
            return f"{_size(size)}: tensor {name!r} has no data_offsets"
    have = size - 8 - length
    if end != have:
        return f"{_size(size)}: the header's tensors need {_size(end)} of data, the file holds {_size(have)}"
    return None


def safetensors_files(directory: str) -> tuple[list[str], list[str]]:
    """(the weight files a loader reads: the index's shards, else every ``*.safetensors``, the
    problems of the index itself)."""
    index = os.path.join(directory, INDEX)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return [], [f"{index}: not a valid shard index (no JSON weight_map)"]
        missing = [s for s in shards if not os.path.isfile(os.path.join(directory, s))]
        problems = [f"{index} lists {s}, which is not in the directory" for s in missing]
        return [os.path.join(directory, s) for s in shards if s not in missing], problems
    names = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
    return [os.path.join(directory, n) for n in names], []


def check_weights(key: str, directory: str) -> list[Problem]:
    """Every weight file of an HF directory that will be read: a whole header, sizes that agree."""
    fix = "download it again (hf download <id> --local-dir <dir>), or point the key at a complete copy"
    files, problems = safetensors_files(directory)
    found = [Problem(key, directory, why, fix) for why in problems]
    for path in files:
        why = safetensors_header_problem(path)
        if why:
            found.append(Problem(key, path, f"truncated or corrupt safetensors file ({why})", fix))
    return found


def check_architecture(key: str, directory: str, moe: bool | None) -> list[Problem]:
    """config.json's model_type and architectures against the path: ``moe`` True (Qwen3-MoE),
    False (dense Qwen3) or None (either: model=hf)."""
    path = os.path.join(directory, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
        if not isinstance(config, dict):
            raise ValueError
    except FileNotFoundError:
        return []  # the directory checks name a missing config.json
    except (OSError, ValueError):
        return [
            Problem(
                key, path, "not a valid JSON config", "download it again, or point the key at a complete copy"
            )
        ]
    wanted = ["qwen3", "qwen3_moe"] if moe is None else ["qwen3_moe" if moe else "qwen3"]
    model_type, architectures = config.get("model_type"), config.get("architectures") or []
    names = " or ".join(f"model_type {t!r} ({ARCHITECTURES[t][1]})" for t in wanted)
    fix = _architecture_fix(key, moe)
    if model_type not in wanted:
        message = f"{path} describes model_type {model_type!r} {architectures}, not {names}"
        return [Problem(key, directory, message, fix)]
    expected = ARCHITECTURES[model_type][1]
    if architectures and expected not in architectures:
        message = f"{path} names architectures {architectures} for model_type {model_type!r}, not {expected}"
        return [Problem(key, directory, message, fix)]
    return []


def _architecture_fix(key: str, moe: bool | None) -> str:
    if moe is None:
        return "a Qwen3 or Qwen3-MoE checkpoint (this project trains Qwen3 only)"
    if moe:
        return f"a Qwen3-MoE checkpoint for a MoE flavor ({', '.join(flavors.MOE_FLAVORS[2:])}), or a dense flavor for dense weights"
    return "a dense Qwen3 checkpoint for a dense flavor, or model=nki_moe / a MoE model.flavor for Qwen3-MoE weights"


def check_inputs(run: RunConf) -> list[Problem]:
    """The HF directories this run reads: their config.json and every weight file's header."""
    problems: list[Problem] = []
    ck = run.checkpoint
    if ck.enable and ck.initial_load_in_hf and ck.initial_load_path and os.path.isdir(ck.initial_load_path):
        moe = run.model.path is ModelPath.nki_moe or run.model.flavor in flavors.MOE_FLAVORS
        if run.model.path is not ModelPath.hf:
            problems += check_architecture("checkpoint.initial_load_path", ck.initial_load_path, moe)
        problems += check_weights("checkpoint.initial_load_path", ck.initial_load_path)
    model = run.model.hf_model
    if run.model.path is ModelPath.hf and model and os.path.isdir(model):
        problems += check_architecture("model.hf_model", model, None)
        if run.model.load_weights:
            problems += check_weights("model.hf_model", model)
    return problems


def step_dirs(folder: str) -> list[int]:
    """The steps of ``folder`` that hold a DCP checkpoint (``step-N/.metadata``), in order."""
    found = []
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        match = re.fullmatch(r"step-(\d+)", name)
        if match and os.path.isfile(os.path.join(folder, name, ".metadata")):
            found.append(int(match.group(1)))
    return sorted(found)


def check_load_step(run: RunConf, run_dir: str) -> list[Problem]:
    """``checkpoint.load_step=N`` (not -1) must be a saved step of the checkpoint folder: torchtitan
    would otherwise fail in every rank (``FileNotFoundError``, ``components/checkpointer/dcp.py``)."""
    ck = run.checkpoint
    if not ck.enable or ck.load_step < 0:
        return []
    folder = os.path.join(run_dir, ck.folder)
    steps = step_dirs(folder)
    if ck.load_step in steps:
        return []
    have = f"the saved steps are {', '.join(map(str, steps))}" if steps else "it holds no saved step"
    message = f"{folder}/step-{ck.load_step} does not exist: {have}"
    fix = (
        f"checkpoint.load_step={steps[-1]} (or -1: the newest)"
        if steps
        else "checkpoint.load_step=-1 (start fresh)"
    )
    return [Problem("checkpoint.load_step", ck.load_step, message, fix)]


def _existing(path: str) -> str:
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def probe_writable(path: str) -> str | None:
    """Why files cannot be written under ``path`` (created later if missing), or None. A probe
    file is created and removed in ``path``, or in its nearest existing parent."""
    where = _existing(os.path.abspath(path))
    if not os.path.isdir(where):
        return f"{where} is a file, not a folder"
    probe = os.path.join(where, f"{PROBE}.{os.getpid()}")
    try:
        with open(probe, "w") as f:
            f.write("probe\n")
    except OSError as err:
        return f"cannot write in {where} ({err.strerror or err})"
    try:
        os.remove(probe)
    except OSError:
        pass
    return None


def written_folders(run: RunConf, run_dir: str) -> list[tuple[str, str]]:
    """(key, folder) of every folder a run writes: the run directory (metrics, logs, trackers),
    and the checkpoint folder, which also holds the HF export (``step-N``)."""
    folders = [("hydra.run.dir", run_dir)]
    if run.checkpoint.enable:
        folders.append(("checkpoint.folder", os.path.join(run_dir, run.checkpoint.folder)))
    return folders


def check_writable(run: RunConf, run_dir: str) -> list[Problem]:
    problems = []
    for key, folder in written_folders(run, run_dir):
        why = probe_writable(folder)
        if why:
            value = run.checkpoint.folder if key == "checkpoint.folder" else folder
            fix = (
                f"{key}=<a folder this user can write>"
                if key != "hydra.run.dir"
                else "hydra.run.dir=<a writable folder>"
            )
            problems.append(Problem(key, value, f"the run could not save there: {why}", fix))
    return problems
