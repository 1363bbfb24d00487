"""``python launch.py doctor=true``: what this machine offers for training, green or red.

Devices and their count, LNC, Neuron tools on PATH, the versions table, the compile cache, free
disk, and whether the rendezvous endpoint can be used. Exit status 1 when any line is red.
"""

from __future__ import annotations

import os
import shutil
import socket

from qwen3_trainium.config import devices, flavors, neuron_sdk, nodes, seams
from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent.preflight import network
from qwen3_trainium.parent.preflight.stack import installed, versions

GREEN, RED, PLAIN = "\033[32mok  \033[0m", "\033[31mFAIL\033[0m", "    "
NEURON_TOOLS = ("neuron-ls", "neuron-top", "neuronx-cc")
MIN_FREE_DISK = 20 * 2**30


def _endpoint_ok(endpoint: str) -> tuple[bool, str]:
    try:
        host, port = nodes.parse_endpoint(endpoint)
    except ValueError as err:
        return False, f"{endpoint} is no rendezvous endpoint: {err}"
    if port == 0:  # torchrun picks a free port on this host: can we bind one?
        with socket.socket() as s:
            try:
                s.bind((host, 0))
            except OSError as err:
                return False, f"{endpoint}: cannot bind a port on {host} ({err.strerror or err})"
            return True, f"{endpoint} (bound port {s.getsockname()[1]})"
    why = network.connect_error(host, port)  # bounded, the name lookup included
    return (True, f"{endpoint} reachable") if why is None else (False, f"{endpoint} not reachable: {why}")


def _torchtitan_lines(run: RunConf) -> list[tuple[bool | None, str]]:
    """Which torchtitan runs (upstream or AWS's TorchTitan Neuron, and from where) and its seams."""
    import importlib.util

    version = installed("torchtitan")
    kind = seams.torchtitan_kind(version)
    names = {
        "upstream": "upstream torchtitan",
        "neuron": "TorchTitan Neuron (aws-neuron/torchtitan-neuron)",
        "other": "an unchecked torchtitan",
        "missing": "no torchtitan",
    }
    spec = importlib.util.find_spec("torchtitan") if version else None
    where = os.path.dirname(spec.origin) if spec and spec.origin else "-"
    lines: list[tuple[bool | None, str]] = [
        (kind in ("upstream", "neuron"), f"torchtitan: {names[kind]} {version or ''} at {where}")
    ]
    if version is None:
        return lines
    missing = dict((seam.name, error) for seam, error in seams.missing())
    needed = {
        seam.name
        for seam in seams.needed(
            run.model.path.value,
            run.device.type.value,
            run.memory.mode.value,
            moe=run.model.flavor in flavors.MOE_FLAVORS,
            cp=run.parallel.context_parallel_degree > 1,
        )
    }
    private = sum(seam.is_private for seam in seams.SEAMS)
    lines.append(
        (
            not (needed & set(missing)),
            f"torchtitan seams: {len(seams.SEAMS) - len(missing)} of {len(seams.SEAMS)} found "
            f"({private} of them private; list: qwen3_trainium/config/seams.py)",
        )
    )
    lines += [(name not in needed and None, f"  missing {name}: {error}") for name, error in missing.items()]
    return lines


def neuron_sdk_line() -> tuple[bool | None, str]:
    """Which Neuron SDK release the installed torch-neuronx is (``config/neuron_sdk.py``): green on
    the current one, neutral on 2.33 (it runs every job but those needing 2.34), red when unknown."""
    have = installed("torch-neuronx")
    release, current = neuron_sdk.release_of(have), neuron_sdk.CURRENT
    if release is current:
        return True, f"Neuron SDK {release.sdk} (torch-neuronx {have}; {release.source})"
    if release is not None:
        return None, (
            f"Neuron SDK {release.sdk} (torch-neuronx {have}); {current.sdk} is current (grouped_mm MoE, "
            f"varlen and flex attention on Neuron): {neuron_sdk.UPGRADE}"
        )
    return False, f"Neuron SDK: torch-neuronx {have or 'not installed'} is no release this project knows"


def report(run: RunConf, launch_dir: str, tty: bool) -> tuple[bool, str]:
    """(all green, the report)."""
    lines: list[tuple[bool | None, str]] = []
    detected = devices.detect_device_type()
    wanted = run.device.type.value
    lines.append(
        (detected == wanted or wanted == "auto", f"device: configured {wanted}, detected {detected}")
    )
    if detected == "cuda":
        import torch

        lines.append((True, f"cuda devices: {torch.cuda.device_count()} ({torch.cuda.get_device_name(0)})"))
    if wanted == "neuron" or detected == "neuron":
        lnc = os.environ.get("NEURON_LOGICAL_NC_CONFIG", f"unset (launcher sets {run.device.lnc})")
        lines.append((None, f"LNC: NEURON_LOGICAL_NC_CONFIG={lnc}"))
        for tool in NEURON_TOOLS:
            path = shutil.which(tool)
            lines.append((path is not None, f"{tool}: {path or 'not on PATH'}"))
        cache = os.path.expanduser(run.device.compile_cache)
        parent = cache if os.path.isdir(cache) else os.path.dirname(cache)
        lines.append((os.access(parent, os.W_OK), f"compile cache: {cache}"))
    problems, table = versions(run, launching=wanted == "neuron")
    lines.append((not problems, "versions:\n" + table))
    if wanted == "neuron" or detected == "neuron":
        lines.append(neuron_sdk_line())
    lines += _torchtitan_lines(run)
    if wanted == "neuron" or detected == "neuron":
        from qwen3_trainium.models.kernels import neuron

        error = neuron.runtime_error()
        lines.append((error is None, f"NKI runtime (nki, nkilib): {error or 'imports'}"))
    free = shutil.disk_usage(launch_dir).free
    lines.append(
        (
            free >= MIN_FREE_DISK,
            f"free disk at {launch_dir}: {free / 2**30:.1f} GiB (want >= {MIN_FREE_DISK // 2**30})",
        )
    )
    ok, text = _endpoint_ok(run.launcher.rdzv_endpoint)
    lines.append((ok, f"rendezvous: {text}"))
    marks = (GREEN, RED, PLAIN) if tty else ("ok  ", "FAIL", "    ")
    body = "\n".join(
        f"{marks[0] if good else marks[2] if good is None else marks[1]} {text}" for good, text in lines
    )
    return all(good is not False for good, _ in lines), body
