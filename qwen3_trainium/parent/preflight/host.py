"""Pre-flight checks of the machine a run is launched on: processes against the host's cores or
devices and memory, a layout written for a device this host lacks, the trackers that must start,
and the disk the checkpoints will fill. Standard library only (the disk check takes the model's
size from the full pre-flight); run on every launch, never cached: the host changes, the config
does not.
"""

from __future__ import annotations

import glob
import importlib.util
import netrc
import os
import shutil
from urllib.parse import urlparse

from qwen3_trainium.config import devices
from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent import tracking
from qwen3_trainium.parent.preflight.network import reachable  # the one bounded probe (name lookup included)
from qwen3_trainium.parent.preflight.problem import Problem

GiB = 2**30
RANK_BASE_BYTES = devices.RANK_BASE_BYTES
WANDB_HOST = "https://api.wandb.ai"
available_memory = devices.available_memory


def host_cores() -> int:
    """The cores this process may run on (its affinity mask: a Slurm allocation, taskset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def visible_cuda_devices(environ=os.environ) -> int:
    """CUDA devices this process may use, without importing torch: ``CUDA_VISIBLE_DEVICES`` when
    set (CUDA's own rule: an empty list hides them all), else the driver's ``/dev/nvidia<N>`` nodes."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return len([d for d in listed.split(",") if d.strip()])
    return len(glob.glob("/dev/nvidia[0-9]*"))


def _layout(layout: str) -> str:
    return f" (parallel={layout})" if layout else ""


def check_host(run: RunConf, *, layout: str = "", environ=os.environ) -> list[Problem]:
    """Processes per node against this host. Launching only: a dry run validates any layout."""
    device, nproc = run.device.type.value, run.launcher.nproc_per_node
    if nproc < 1:
        return []  # -1 unresolved (an unknown instance or LNC): check_device / check_ranges name it
    if device == "neuron" and not devices.accelerator_present():
        message = (
            f"device.type=neuron{_layout(layout)}, and this host has no Neuron device (no /dev/neuron*):"
            f" launching would start {nproc} processes on its {host_cores()} CPU cores. Refused, not adapted:"
            " a Trainium layout on CPU is a different run"
        )
        fix = "dry_run=true to validate the Trainium config here, or a layout for this host: parallel=cpu2 (device=cpu)"
        return [Problem("device", "neuron", message, fix)]
    if device == "cuda":
        count = visible_cuda_devices(environ)
        if nproc > count:
            message = f"{nproc} processes, one per GPU, and this host shows {count} CUDA device(s)"
            fix = f"launcher.nproc_per_node=-1 (one per device) or at most {count}; device=cpu without a GPU"
            return [Problem("launcher.nproc_per_node", nproc, message, fix)]
        return []
    if device != "cpu":
        return []
    problems = []
    cores = host_cores()
    if nproc > cores and not run.launcher.oversubscribe:
        message = f"{nproc} CPU processes{_layout(layout)} on a host with {cores} cores (more processes than cores thrash)"
        fix = f"launcher.nproc_per_node=<at most {cores}> (parallel=cpu2: 2), or launcher.oversubscribe=true to run them anyway"
        problems.append(Problem("launcher.nproc_per_node", nproc, message, fix))
    available = available_memory()
    if available is not None and nproc * RANK_BASE_BYTES > available:
        message = (
            f"{nproc} processes x {RANK_BASE_BYTES / GiB:.2f} GiB (a rank with torch imported, before any model)"
            f" = {nproc * RANK_BASE_BYTES / GiB:.1f} GiB, over the {available / GiB:.1f} GiB this host has available"
        )
        fix = f"launcher.nproc_per_node=<at most {max(available // RANK_BASE_BYTES, 1)}> (parallel=cpu2: 2)"
        problems.append(Problem("launcher.nproc_per_node", nproc, message, fix))
    return problems


# ---- trackers -------------------------------------------------------------------------------


def wandb_credentials(environ=os.environ) -> bool:
    """An API key in the environment, or the netrc entry ``wandb login`` writes for the host."""
    if environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(environ.get("WANDB_BASE_URL") or WANDB_HOST).hostname or ""
    path = environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _not_installed(package: str) -> Problem:
    fix = f"pip install {package} (make setup installs it), or tracking=off"
    return Problem(f"tracking.{package}", True, f"the {package} package is not installed", fix)


def check_trackers(run: RunConf, environ=os.environ) -> list[Problem]:
    """Each tracker asked for must start: installed, and W&B online with credentials and a route
    to its server. Otherwise the ranks would log a WARNING and train without it."""
    track, problems = run.tracking, []
    if track.tensorboard and importlib.util.find_spec("tensorboard") is None:
        problems.append(_not_installed("tensorboard"))
    if not track.wandb:
        return problems
    if importlib.util.find_spec("wandb") is None:
        return problems + [_not_installed("wandb")]
    mode = tracking.wandb_mode(track.wandb_mode.value, environ)
    if mode != "online":
        return problems
    asked = (
        "tracking.wandb_mode=online"
        if track.wandb_mode.value == "online"
        else f"tracking.wandb_mode=auto is online here ({'WANDB_MODE=online' if environ.get('WANDB_MODE') else 'WANDB_API_KEY is set'})"
    )
    fixes = "tracking.wandb_mode=offline (make wandb-sync uploads the run later)"
    if not wandb_credentials(environ):
        message = f"{asked}, and there are no W&B credentials (no WANDB_API_KEY, no netrc entry): W&B would not start"
        problems.append(
            Problem(
                "tracking.wandb_mode",
                mode,
                message,
                f"{fixes}, or log in: wandb login (or export WANDB_API_KEY=...)",
            )
        )
        return problems
    server = environ.get("WANDB_BASE_URL") or WANDB_HOST
    why = reachable(server)
    if why:
        message = f"{asked}, and the W&B server cannot be reached ({why}): W&B would not start"
        problems.append(
            Problem("tracking.wandb_mode", mode, message, f"{fixes}, or run where {server} is reachable")
        )
    return problems


# ---- disk -----------------------------------------------------------------------------------


def checkpoint_bytes(run: RunConf, params: int, trainable: int | None = None) -> tuple[int, int, int]:
    """(bytes of one interval checkpoint, how many are kept at once, bytes of the final save), for
    ``params`` parameters of which ``trainable`` (None: all) have gradients.

    An interval checkpoint (torchtitan's DCP) holds every parameter in float32, frozen ones too
    (FSDP keeps them in float32, ``mixed_precision_param`` is the compute copy; torchtitan 0.3.0
    ``checkpointer/base.py`` ``ModelWrapper`` saves ``model.state_dict()``, which holds every
    parameter whatever its ``requires_grad``), and AdamW's two float32 moments for the trainable
    ones only (``components/optimizer/optimizer.py`` gives the optimizer ``p.requires_grad``
    parameters): 4 bytes a parameter plus 8 a trainable one. ``keep_latest_k`` of them are kept
    (0: all). The final save is model-only with ``last_save_model_only`` (float32, or
    ``export_dtype`` in HF); with peft=lora an HF export is the float32 adapters
    (``rank/checkpoint.py``), plus the merged model with ``peft.merge_on_export``."""
    ck, steps = run.checkpoint, run.training.steps
    trainable = params if trainable is None else trainable
    one = 4 * params + 8 * trainable
    saves = steps // ck.interval if ck.interval > 0 else 0
    kept = min(saves, ck.keep_latest_k) if ck.keep_latest_k > 0 else saves
    exported = 2 if ck.export_dtype.value in ("bfloat16", "float16") else 4
    if ck.last_save_in_hf and run.peft.method.value == "lora":
        final = 4 * trainable + (exported * (params - trainable) if run.peft.merge_on_export else 0)
    elif ck.last_save_in_hf:
        final = exported * params
    else:
        final = 4 * params if ck.last_save_model_only else one
    return one, max(kept, 0), final


def check_disk(
    run: RunConf, run_dir: str, params: int, notes: list[str], trainable: int | None = None
) -> list[Problem]:
    """Free space where the checkpoints go against what the run will write: refused when not
    even one checkpoint fits, a warning when all of them do not. ``params`` and ``trainable``
    are the full pre-flight's counts (``facts``; ``checkpoint_bytes``)."""
    if not run.checkpoint.enable or params <= 0:
        return []
    from qwen3_trainium.parent.preflight.files import _existing

    folder = os.path.join(run_dir, run.checkpoint.folder)
    try:
        free = shutil.disk_usage(_existing(folder)).free
    except OSError:
        return []
    one, kept, final = checkpoint_bytes(run, params, trainable)
    first = one if kept else final
    total = one * kept + final
    plan = (
        f"{kept} x {one / GiB:.2f} GiB (model and AdamW state, checkpoint.keep_latest_k={run.checkpoint.keep_latest_k})"
        f" + {final / GiB:.2f} GiB final save = {total / GiB:.2f} GiB"
    )
    if first > free:
        message = f"{folder} has {free / GiB:.2f} GiB free; the first checkpoint alone needs {first / GiB:.2f} GiB ({plan})"
        fix = "free disk space, checkpoint.folder=<a folder on a larger disk>, or checkpoint=none"
        return [Problem("checkpoint.folder", run.checkpoint.folder, message, fix)]
    if total > free:
        notes.append(
            f"WARNING disk: {folder} has {free / GiB:.2f} GiB free and the run will write {plan};"
            " fewer checkpoints kept (checkpoint.keep_latest_k) or a larger disk"
        )
    return []
