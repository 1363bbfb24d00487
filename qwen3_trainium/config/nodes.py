"""Several nodes, one torchrun each: the rendezvous on the head node, this node's rank, EFA.

Under Slurm (one task per node) everything comes from Slurm's environment: the head node is
the first host of ``SLURM_JOB_NODELIST``, the rendezvous id is ``SLURM_JOB_ID``, the node rank
``SLURM_NODEID``. Elsewhere the same fields are set by hand (``launcher.rdzv_endpoint``,
``launcher.node_rank``), e.g. two "nodes" on one machine with a rendezvous on 127.0.0.1.
"""

from __future__ import annotations

import re

from qwen3_trainium.config.schema import LauncherConf

SINGLE_NODE_ENDPOINT = "localhost:0"  # the guide's form: torchrun picks a free port
HEAD_PLACEHOLDER = "<head node>"
# Libfabric over EFA between Trainium nodes (AWS's multi-node Neuron samples set these).
EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist: ``trn2-[003-006,9],x`` -> ``trn2-003``."""
    nodelist = nodelist.strip()
    match = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?([^,]*)", nodelist)
    if not match or not nodelist:
        return ""
    prefix, ranges, suffix = match.groups()
    if ranges is None:
        return prefix + suffix
    first = re.split(r"[,-]", ranges)[0]
    return prefix + first + suffix


DEFAULT_PORT = 29400  # torchrun's c10d backend without a port (c10d_rendezvous_backend.DEFAULT_PORT)


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``host[:port]`` as torchrun reads ``--rdzv_endpoint`` (torch's
    ``elastic/rendezvous/utils.py`` ``parse_rendezvous_endpoint``, kept here in the standard
    library: pre-flight's quick tier imports no torch): an IPv6 host in brackets, a port in
    0..65535 (else ``DEFAULT_PORT``), a host of word characters, dots, colons and dashes.
    ValueError says what is wrong."""
    endpoint = endpoint.strip()
    if endpoint.startswith("[") and endpoint.endswith("]"):
        host, port_text = endpoint, None
    else:
        host, _, port_text = endpoint.rpartition(":") if ":" in endpoint else (endpoint, "", None)
    if len(host) > 1 and host[0] == "[" and host[-1] == "]":
        host = host[1:-1]
    port = DEFAULT_PORT
    if port_text is not None:
        if not port_text.isdigit() or int(port_text) >= 2**16:
            raise ValueError(f"its port {port_text!r} is not a number from 0 to 65535")
        port = int(port_text)
    if not re.fullmatch(r"[\w.:-]+", host):
        raise ValueError(f"its host {host!r} is not a host name, an IPv4 or an IPv6 address")
    return host, port


def node_rank(configured: int, environ: dict[str, str]) -> int:
    return configured if configured != -1 else int(environ.get("SLURM_NODEID", "0") or 0)


def resolve_launcher(launcher: LauncherConf, environ: dict[str, str]) -> None:
    """Fill ``node_rank``, ``rdzv_endpoint`` and ``rdzv_id`` where they are -1 / auto. An
    endpoint that cannot be known here (several nodes, no Slurm) stays auto: pre-flight says so."""
    launcher.node_rank = node_rank(launcher.node_rank, environ)
    if launcher.rdzv_endpoint == "auto":
        if launcher.nnodes == 1:
            launcher.rdzv_endpoint = SINGLE_NODE_ENDPOINT
        elif head := first_host(environ.get("SLURM_JOB_NODELIST", "")):
            launcher.rdzv_endpoint = f"{head}:{launcher.rdzv_port}"
    if launcher.rdzv_id == "auto" and environ.get("SLURM_JOB_ID"):
        launcher.rdzv_id = environ["SLURM_JOB_ID"]


def shown_endpoint(launcher: LauncherConf) -> str:
    if launcher.rdzv_endpoint == "auto":
        return f"{HEAD_PLACEHOLDER}:{launcher.rdzv_port}"
    return launcher.rdzv_endpoint


def rdzv_args(launcher: LauncherConf) -> list[str]:
    args = ["--rdzv_backend", launcher.rdzv_backend.value, "--rdzv_endpoint", shown_endpoint(launcher)]
    if launcher.rdzv_id != "auto":
        args += ["--rdzv_id", launcher.rdzv_id]
    return args


def node_env(launcher: LauncherConf, device_type: str) -> dict[str, str]:
    return dict(EFA_ENV) if launcher.nnodes > 1 and device_type == "neuron" else {}
