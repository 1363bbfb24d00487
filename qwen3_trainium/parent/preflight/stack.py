"""Pre-flight checks of the software stack: package versions, torchtitan's seams (by capability,
not by version string), the NKI runtime on Trainium, and the Trainium notes a user should read."""

from __future__ import annotations

import importlib.metadata

from qwen3_trainium.config import flavors, neuron_sdk, seams
from qwen3_trainium.config.schema import AttnBackend, ModelPath, RunConf
from qwen3_trainium.parent.preflight.problem import Problem

# package -> (required, why); "=2.14" means any 2.14.x. torchtitan is judged by seams.torchtitan_kind.
REQUIRED = {
    "torch": (
        "=2.14",
        "torch-neuronx 2.14.x pairs with PyTorch 2.14 (config/neuron_sdk.py); torchtitan needs >= 2.14",
    ),
    "torchtitan": ("=0.3.0", "upstream 0.3.0, or TorchTitan Neuron 0.2.2+neuron.* on Trainium"),
    "transformers": ("=5", "model=hf needs Transformers v5"),
    "hydra-core": ("=1.3", "version_base 1.3"),
}
# AWS's update command (SDK 2.33 and 2.34 alike): torch-neuronx==2.14.*, neuronx-cc==2.*, nki.
NEURON_REQUIRED = {
    "torch-neuronx": ("=2.14", "must match torch's major.minor"),
    "neuronx-cc": ("=2", "the Neuron compiler (bundles the NKI Library, nkilib)"),
    "nki": ("", "NKI, its own package since SDK 2.33 (torch-neuronx imports it)"),
}
RECORDED = ("omegaconf", "wandb", "tensorboard", "hydra-optuna-sweeper", "hydra-submitit-launcher")
TITAN_FIX = (
    "pip install 'torchtitan==0.3.0' (make setup), or on Trainium TorchTitan Neuron 0.2.2+neuron.* "
    "(git clone aws-neuron/torchtitan-neuron && pip install -e .)"
)


def installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _shown(required: str) -> str:
    if not required:
        return "any"
    version = required.lstrip("=")
    return version if version.count(".") == 2 else version + ".x"


def _matches(version: str, required: str) -> bool:
    if not required:
        return True
    want = required.lstrip("=").split(".")
    return version.split("+")[0].split(".")[: len(want)] == want


def installed_versions(run: RunConf) -> dict[str, str]:
    """The versions a run records (W&B summary, job.json): every checked package plus the
    tracking and sweep plugins; packages that are not installed are left out."""
    names = [*REQUIRED, *(NEURON_REQUIRED if run.device.type.value == "neuron" else ()), *RECORDED]
    return {name: version for name in names if (version := installed(name))}


def _status(package: str, have: str | None, required: str, run: RunConf, launching: bool) -> str:
    neuron = run.device.type.value == "neuron"
    if package == "torchtitan":
        kind = seams.torchtitan_kind(have)
        if kind == "upstream" or (kind == "neuron" and neuron):
            return "ok"
        if kind == "neuron":
            return "warn"  # AWS's fork off Trainium: the seams decide
    elif have is not None and _matches(have, required):
        return "ok"
    if have is None and package in NEURON_REQUIRED and not launching:
        return "not here"  # a Trainium config validated on another machine
    if package == "transformers" and run.model.path is not ModelPath.hf:
        return "warn"  # only model=hf needs v5
    return "MISSING" if have is None else "MISMATCH"


def versions(run: RunConf, *, launching: bool) -> tuple[list[Problem], str]:
    """(problems, the table). Neuron packages are required when launching on Neuron; a wrong
    installed version is an error anywhere."""
    rows, problems = [], []
    wanted = dict(REQUIRED) | (NEURON_REQUIRED if run.device.type.value == "neuron" else {})
    for package, (required, why) in wanted.items():
        have = installed(package)
        status = _status(package, have, required, run, launching)
        shown = "0.3.0|0.2.2+neuron" if package == "torchtitan" else _shown(required)
        rows.append(f"  {package:14s} {have or '-':16s} {shown:18s} {status}")
        if status in ("MISSING", "MISMATCH"):
            need = required.lstrip("=") or "any"
            what = "not installed" if have is None else f"{have} installed"
            if package == "torchtitan":
                fix = TITAN_FIX
            elif required:
                fix = f"pip install '{package}=={need}.*'"
            else:
                fix = f"install {package} (Neuron pip repository: make setup-neuron)"
            problems.append(Problem(f"versions.{package}", have, f"{what}; {why}: needs {need}", fix))
    table = "\n".join([f"  {'package':14s} {'installed':16s} {'accepted':18s}", *rows])
    return problems, table


TORCH_FIX = "pip install 'torch==2.14.*' (make setup: the version CI proved; on Trainium the Neuron venv's)"


def check_seams(run: RunConf) -> list[Problem]:
    """Every torchtitan seam this run relies on, and the private torch state it reaches into, by
    name (a fork or a torch that lacks one fails here)."""
    problems = []
    moe = run.model.flavor in flavors.MOE_FLAVORS
    cp = run.parallel.context_parallel_degree > 1
    needed = seams.needed(run.model.path.value, run.device.type.value, run.memory.mode.value, moe=moe, cp=cp)
    for seam, error in seams.missing(needed):
        package = "torch" if seam.target.partition(":")[0].split(".")[0] == "torch" else "torchtitan"
        message = f"{package} seam {seam.name} is missing ({error}); used by {seam.uses}"
        fix = TORCH_FIX if package == "torch" else TITAN_FIX
        problems.append(Problem(f"versions.{package}", installed(package), message, fix))
    return problems


def check_nki_runtime(run: RunConf, *, launching: bool, notes: list[str]) -> list[Problem]:
    """On device=neuron with kernels: NKI and the NKI Library must import, and take the parameters
    the kernels are called with. A dry run elsewhere only notes it."""
    if run.device.type.value != "neuron" or not run.model.kernels:
        return []
    from qwen3_trainium.models.kernels import neuron

    error = neuron.runtime_error()
    if error and not launching:
        notes.append(f"NKI runtime: not here ({error}); checked again at launch on the Trainium host")
        return []
    problems = [error] if error else neuron.signature_mismatches()
    return [
        Problem("model.kernels", list(run.model.kernels), f"NKI kernels requested, but {problem}", neuron.FIX)
        for problem in problems
    ]


def trainium_notes(run: RunConf) -> list[str]:
    """Warnings a Trainium user should read before spending the instance."""
    if run.device.type.value != "neuron":
        return []
    notes = []
    if run.parallel.expert_parallel_degree > 1:
        notes.append(
            f"WARNING parallel.expert_parallel_degree={run.parallel.expert_parallel_degree} on trn2 is "
            "experimental: torchtitan's all-to-all expert parallelism has not been run on trn2 here, and "
            "AWS's Neuron EP backend 'does not run on Trn2' (Neuron docs, expert parallelism)"
        )
    kind = seams.torchtitan_kind(installed("torchtitan"))
    if kind == "upstream":
        notes.append(
            "torchtitan: upstream 0.3.0 on Trainium; AWS's guide uses TorchTitan Neuron (0.2.2+neuron.*)"
        )
    return notes


def _needs_2_34(run: RunConf) -> list[str]:
    """What this run uses that AWS documents on Neuron from SDK 2.34 on (``config/neuron_sdk.py``)."""
    if run.model.attn_backend is AttnBackend.varlen:
        return ["torchtitan's varlen attention (torch.nn.attention.varlen.varlen_attn)"]
    if run.model.attn_backend is AttnBackend.flex:
        return ["FlexAttention"]
    return []


def check_neuron_release(run: RunConf, notes: list[str]) -> list[Problem]:
    """On device=neuron: the SDK release the installed torch-neuronx belongs to, and what of this
    run needs 2.34. Refused on 2.33 only where AWS documents no support before 2.34 (attention);
    the grouped_mm route is a warning there (2.33's recipes ran MoE on blockwise NKI kernels)."""
    if run.device.type.value != "neuron":
        return []
    have = installed("torch-neuronx")
    release, needs, new = neuron_sdk.release_of(have), _needs_2_34(run), neuron_sdk.CURRENT
    if release is None:
        seen = f"torch-neuronx {have} is no release this project knows" if have else "torch-neuronx: not here"
        needed = f"; this run needs SDK {new.sdk} for {', '.join(needs)}" if needs else ""
        notes.append(f"Neuron SDK: {seen}{needed}")
        return []
    notes.append(f"Neuron SDK {release.sdk} (torch-neuronx {have}; {release.source})")
    titan = installed("torchtitan") or ""
    if titan.startswith("0.2.2+neuron") and titan != release.torchtitan_neuron:
        notes.append(
            f"torchtitan {titan} with SDK {release.sdk}, which ships TorchTitan Neuron "
            f"{release.torchtitan_neuron}: {neuron_sdk.TITAN_UPGRADE}"
        )
    if neuron_sdk.at_least(release, new):
        return []
    if flavors.grouped_mm_route(run.model.path.value, run.model.flavor):
        notes.append(
            f"WARNING model=native {run.model.flavor} on SDK {release.sdk}: AWS runs MoE on "
            f"torch._grouped_mm from SDK {new.sdk} ({new.source}); upgrade: {neuron_sdk.UPGRADE}"
        )
    return [
        Problem(
            "model.attn_backend",
            run.model.attn_backend.value,
            f"{what} works on Neuron from SDK {new.sdk} ({new.source}); SDK {release.sdk} is installed",
            f"upgrade the Neuron venv: {neuron_sdk.UPGRADE}; or model.attn_backend=sdpa",
        )
        for what in needs
    ]
