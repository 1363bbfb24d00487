"""Pre-flight checks of the run: attention vs device, training values, world size, the device
being there, override imports and compile (torchtitan's own validation: ``titan.py``)."""

from __future__ import annotations

import os

from qwen3_trainium.config import devices, runconfig
from qwen3_trainium.config.schema import AttnBackend, CompileComponent, RunConf
from qwen3_trainium.parent.preflight.problem import Problem


def check_attention(run: RunConf) -> list[Problem]:
    device, backend = run.device.type.value, run.model.attn_backend
    reasons = {
        ("cpu", AttnBackend.flex): "FlexAttention has no backward on CPU",
        ("cpu", AttnBackend.varlen): "varlen attention needs CUDA flash attention",
    }  # on Neuron both run from SDK 2.34 on: stack.check_neuron_release
    reason = reasons.get((device, backend))
    if reason is not None:
        return [
            Problem(
                "model.attn_backend",
                backend.value,
                f"{reason} (device.type={device})",
                "model.attn_backend=sdpa (or auto)",
            )
        ]
    if backend is AttnBackend.flex and run.memory.mode.value == "trace":
        return [
            Problem(
                "model.attn_backend",
                backend.value,
                "memory=trace runs one step on fake CPU tensors, and FlexAttention has no backward on CPU",
                "memory=estimate, or model.attn_backend=varlen (torchtitan's varlen attention traces)",
            )
        ]
    return []


def check_device(run: RunConf) -> list[Problem]:
    """device.*: the LNC on every device (rope_hf's seq_len rule reads it wherever the config is
    validated, so that it is valid on trn2), the instance on Neuron (elsewhere it is ignored,
    with a note: ``device_notes``)."""
    problems = []
    if run.device.lnc not in (1, 2):
        problems.append(
            Problem(
                "device.lnc",
                run.device.lnc,
                "a logical NeuronCore is 1 or 2 physical cores (on every device it sets rope_hf's seq_len rule)",
                "device.lnc=2 (trn2 default) or 1",
            )
        )
    if run.device.type.value == "neuron" and run.device.instance not in devices.NEURON_INSTANCES:
        known = ", ".join(devices.NEURON_INSTANCES)
        problems.append(
            Problem(
                "device.instance",
                run.device.instance,
                "no checked facts (cores, HBM, FLOPS) for this instance",
                f"one of: {known}",
            )
        )
    return problems


NEURON_ONLY = ("instance", "compile_cache")  # device.* knobs that mean nothing on another device


def device_notes(run: RunConf) -> list[str]:
    """One line per Neuron-only knob set away from its default on another device: it is ignored."""
    from qwen3_trainium.config.schema import DeviceConf

    device = run.device.type.value
    if device == "neuron":
        return []
    default = DeviceConf()
    notes = [
        f"note: device.{key}={getattr(run.device, key)} is ignored on device.type={device} (Neuron only)"
        for key in NEURON_ONLY
        if getattr(run.device, key) != getattr(default, key)
    ]
    uses_lnc = "rope_hf" in run.model.kernels
    if run.device.lnc != default.lnc and not uses_lnc:
        notes.append(f"note: device.lnc={run.device.lnc} is ignored on device.type={device} (Neuron only)")
    return notes


def check_nodes(run: RunConf, *, launching: bool) -> list[Problem]:
    """Several nodes need one rendezvous every node can reach (the node rank: check_ranges)."""
    launcher, problems = run.launcher, []
    if launcher.nnodes <= 1:
        return problems
    endpoint = launcher.rdzv_endpoint
    fix = f"launcher.rdzv_endpoint=<head node host>:{launcher.rdzv_port} on every node, or submit with cluster=slurm_trn2"
    if endpoint == "auto" and launching:
        message = f"{launcher.nnodes} nodes need the head node's host:port, and this is no Slurm job (SLURM_JOB_NODELIST is unset)"
        problems.append(Problem("launcher.rdzv_endpoint", endpoint, message, fix))
    elif endpoint != "auto" and endpoint.rsplit(":", 1)[-1] in ("0", endpoint):
        message = "port 0 (or none) lets torchrun pick a port on one node; the other nodes cannot find it"
        problems.append(Problem("launcher.rdzv_endpoint", endpoint, message, fix))
    return problems


def check_world_size(run: RunConf) -> list[Problem]:
    par, launcher = run.parallel, run.launcher
    resolved = runconfig.degrees(run)
    world, fixed = resolved.world, resolved.fixed
    shard = par.data_parallel_shard_degree
    if fixed < 1 or shard == 0 or shard < -1:
        return []  # a degree out of range: check_ranges names it
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


def check_device_present(run: RunConf) -> list[Problem]:
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


def check_override_imports(run: RunConf) -> list[Problem]:
    """override.imports (the open hatch for the user's own torchtitan ``@override`` factories):
    each entry a ``module.function`` whose module can be found, without importing it."""
    import importlib.util

    problems = []
    for entry in run.override.imports:
        module, _, function = entry.rpartition(".")
        try:
            found = bool(module and function) and importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            problems.append(
                Problem(
                    "override.imports",
                    entry,
                    "not an importable module.function (the module is not found on sys.path)",
                    "override.imports=[<package.module.factory>] with the package installed or on PYTHONPATH",
                )
            )
    return problems


def _cpp_compiler() -> str | None:
    """The C++ compiler Inductor would call on CPU: $CXX, else g++ or clang++ on PATH."""
    import shutil

    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    return shutil.which("g++") or shutil.which("clang++")


def check_compile(run: RunConf) -> list[Problem]:
    """compile.*: a backend that targets the device, async TP only where it exists."""
    comp, device = run.compile, run.device.type.value
    backend = comp.backend.value
    problems = []
    if comp.enable and not comp.components:
        fix = "compile.components=[model,loss] (or compile=off)"
        problems.append(Problem("compile.components", [], "compile.enable=true compiles nothing", fix))
    if backend == "neuron" and device != "neuron":
        message = f"the neuron backend comes with torch-neuronx and compiles for Trainium only (device.type={device})"
        problems.append(Problem("compile.backend", backend, message, "compile.backend=auto (inductor here)"))
    # Source: AWS's guide to Qwen3 on Trainium with torchtitan, as recorded in shared/STACK.md
    # ("For throughput AWS recommends --compile.enable --compile.backend neuron with SimpleFSDP;
    # eager is for correctness"); the neuron backend ships with torch-neuronx.
    if backend == "inductor" and device == "neuron":
        message = "Inductor does not target Neuron; AWS's Trainium setting is --compile.backend neuron"
        problems.append(Problem("compile.backend", backend, message, "compile.backend=auto (neuron)"))
    if comp.enable and backend == "inductor" and device == "cpu" and _cpp_compiler() is None:
        message = "Inductor compiles C++ on CPU, and no compiler was found ($CXX, g++, clang++)"
        fix = "install g++ (apt install g++), set CXX=<compiler>, or compile=off"
        problems.append(Problem("compile.backend", backend, message, fix))
    if comp.enable_async_tensor_parallel:
        why = []
        if device != "cuda":
            why.append(f"it is an Inductor pass over CUDA symmetric memory (device.type={device})")
        if run.parallel.tensor_parallel_degree <= 1:
            why.append("it overlaps tensor-parallel collectives and parallel.tensor_parallel_degree is 1")
        if not comp.enable or CompileComponent.model not in comp.components:
            why.append("it needs the model compiled (compile=on with model in compile.components)")
        if why:
            fix = "compile.enable_async_tensor_parallel=null (on only where it applies)"
            problems.append(Problem("compile.enable_async_tensor_parallel", True, "; ".join(why), fix))
    return problems
