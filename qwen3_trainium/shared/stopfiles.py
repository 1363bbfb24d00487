"""The stop protocol the launcher and the ranks share: the signals, the exit codes (128 + the
signal), the launcher's request file (``stop_request*.json``) and the ranks' marker
(``stopped.json``). The launcher's side is ``parent/signals.py``, the ranks' ``rank/stop.py``.
Only the standard library: a rank reads it before it imports torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal

REQUEST_ENV = "QWEN3_TRAINIUM_STOP_REQUEST"  # the launcher's request file (absolute path)
MARKER_NAME = "stopped.json"
GRACEFUL = signal.SIGTERM
FAST = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def exit_code(signum: int) -> int:
    return 128 + signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def request_path(run_dir: str, node_rank: int) -> str:
    return os.path.join(
        run_dir, "stop_request.json" if node_rank <= 0 else f"stop_request.node{node_rank}.json"
    )


def marker_path(run_dir: str) -> str:
    return os.path.join(run_dir, MARKER_NAME)


def write_json(path: str, record: dict) -> None:
    """Atomically: a reader sees the whole record or none."""
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def read_json(path: str | None) -> dict | None:
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def remove(*paths: str) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
