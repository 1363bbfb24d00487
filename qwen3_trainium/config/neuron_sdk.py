"""The Neuron SDK releases this project knows, told apart by the torch-neuronx installed.

Standard library only: ``make setup-neuron`` (``parent/setup_neuron.py``) imports it under any
``python3`` before it has chosen the Neuron venv; pre-flight and the doctor read it too.

Sources, one per release (read 2026-12-06):
- 2.34.0: torch-neuronx release notes, https://github.com/aws-neuron/torch-neuronx/releases/tag/v2.34.0
  ("torch-neuronx 2.13.3.1 and 2.14.3.1 (Neuron 2.34.0 Release)", 11/30/2026). The same notes:
  the TorchTitan Neuron MoE recipes "now use upstream torch._grouped_mm and the models' own
  attention, not Neuron blockwise MoE kernels and sdpa", about 1.3x the MFU of the 2.33.0
  recipes for Qwen3-30B-A3B (TP4 x FSDP16), "about 60% lower cold time to first iteration";
  "The torch.accelerator memory functions and torch.nn.attention.varlen.varlen_attn work on
  Neuron"; "FlexAttention runs faster with more masks". TorchTitan Neuron 0.2.2+neuron.2 and
  NKI 0.8.0 are as issue #38 reports them from AWS's 2.34.0 release: no stored page of those two
  components could be read here, so they are recorded, not checked.
- 2.33.0: torch-neuronx release notes, https://github.com/aws-neuron/torch-neuronx/releases/tag/v2.33.0
  (2.13.3.0.* / 2.14.3.0.* with PyTorch 2.13.0 / 2.14.0, Python 3.12-3.14), the component index
  https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/release-notes/components/index.html
  (TorchTitan Neuron 0.2.2+neuron.1, NKI 0.7.0, neuronx-cc 2.28.7631.0). 2.33.1 exists (the
  site's list of releases); no page of it names another torch-neuronx, so 2.14.3.0.* is 2.33.x.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    sdk: str
    date: str
    torch_neuronx: tuple[str, ...]  # the package families' version prefixes: 2.14.3.1 -> 2.14.3.1.*
    torch: tuple[str, ...]  # the PyTorch each family pairs with, in the same order
    torchtitan_neuron: str
    nki: str
    source: str


SDK_2_34 = Release(
    sdk="2.34.0",
    date="2026-11-30",
    torch_neuronx=("2.14.3.1", "2.13.3.1"),
    torch=("2.14", "2.13"),
    torchtitan_neuron="0.2.2+neuron.2",
    nki="0.8.0",
    source="https://github.com/aws-neuron/torch-neuronx/releases/tag/v2.34.0",
)
SDK_2_33 = Release(
    sdk="2.33",
    date="2026-10-19",
    torch_neuronx=("2.14.3.0", "2.13.3.0"),
    torch=("2.14.0", "2.13.0"),
    torchtitan_neuron="0.2.2+neuron.1",
    nki="0.7.0",
    source="https://github.com/aws-neuron/torch-neuronx/releases/tag/v2.33.0",
)
RELEASES = (SDK_2_34, SDK_2_33)
CURRENT = SDK_2_34

# The DLAMI's venv, by the PyTorch it carries. AWS names it for 2.33 ("Deep Learning AMI Neuron
# torch-neuronx 2.14.0 DLAMI ... in the /opt/aws_neuronx_venv_torch_neuronx_2_14_0 virtual
# environment": https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/setup/pytorch/update-dlami.html).
# No stored page names 2.34's; the name follows PyTorch's version, not the SDK's, so set-up looks
# for any ``..._2_14*`` venv and takes the newest, this documented one first among equals.
DLAMI_VENV = "/opt/aws_neuronx_venv_torch_neuronx_2_14_0"
DLAMI_VENV_GLOB = "/opt/aws_neuronx_venv_torch_neuronx_2_14*"

# AWS's update command for the DLAMI venv (the same page; its version globs are the release's).
UPGRADE = (
    'python -m pip install --upgrade "torch-neuronx==2.14.*" "neuronx-cc==2.*" nki '
    "--extra-index-url https://pip.repos.neuron.amazonaws.com "
    "--extra-index-url https://download.pytorch.org/whl/cpu"
)
TITAN_UPGRADE = "cd torchtitan-neuron && git pull && pip install -e ."


def release_of(torch_neuronx: str | None) -> Release | None:
    """The SDK release a torch-neuronx version belongs to (None: not installed, or unknown)."""
    if not torch_neuronx:
        return None
    parts = torch_neuronx.split("+")[0].split(".")
    for release in RELEASES:
        if any(parts[:4] == family.split(".") for family in release.torch_neuronx):
            return release
    return None


def at_least(release: Release | None, wanted: Release) -> bool:
    """``release`` is ``wanted`` or newer (by the order of RELEASES, newest first)."""
    return release is not None and RELEASES.index(release) <= RELEASES.index(wanted)
