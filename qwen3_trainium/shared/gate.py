"""The verdict every rank waits for before it touches a device.

When the checks that need no torch pass, the launcher starts torchrun at once and runs the rest
of pre-flight (torchtitan's validation of the ``Trainer.Config``, the model on the meta device,
memory, the checkpoint's keys) while the ranks import torch and torchtitan, the same seconds of
work on both sides. Each rank blocks in ``titan.trainer_config``, the function torchtitan calls
before it builds anything, until the launcher writes ``verdict.json``:
- ok: the rank goes on;
- refused: the rank exits 0 at once, having touched no device, logged no step and written no
  checkpoint; the launcher prints every problem and exits 2, as it would have before launch;
- no verdict and the launcher gone (killed): the rank exits 1 rather than wait forever.
Only the standard library here: ranks import this before torch.
"""

from __future__ import annotations

import json
import os
import sys
import time

VERDICT_ENV = "QWEN3_TRAINIUM_VERDICT"  # the file the ranks wait for (absolute path)
LAUNCHER_PID_ENV = "QWEN3_TRAINIUM_LAUNCHER_PID"  # lifeline.PARENT_ENV: set for every torchrun
POLL_S = 0.02


def verdict_path(run_dir: str, node_rank: int) -> str:
    return os.path.join(run_dir, "verdict.json" if node_rank <= 0 else f"verdict.node{node_rank}.json")


def write(path: str, *, ok: bool, problems: int = 0) -> None:
    """Atomically: a rank reads the whole verdict or none of it."""
    with open(path + ".tmp", "w") as f:
        json.dump({"ok": ok, "problems": problems, "at": time.time()}, f)
    os.replace(path + ".tmp", path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def wait(path: str, launcher_pid: int | None) -> bool:
    """True once the verdict is ok; False if it refused the run or the launcher died without one."""
    while True:
        verdict = read(path)
        if verdict is not None:
            return bool(verdict["ok"])
        if launcher_pid is not None and not _alive(launcher_pid):
            return False
        time.sleep(POLL_S)


def hold_rank(environ=os.environ) -> None:
    """In each rank, before torchtitan builds anything: wait for the launcher's verdict."""
    path = environ.get(VERDICT_ENV)
    if not path:
        return  # started by hand (or by a dry run's printed command): nothing to wait for
    pid = environ.get(LAUNCHER_PID_ENV)
    if wait(path, int(pid) if pid else None):
        return
    verdict = read(path)
    if verdict is None:
        print("[qwen3-trainium] the launcher exited before its pre-flight verdict; stopping", file=sys.stderr)
        sys.exit(1)
    sys.exit(0)  # refused: the launcher reports the problems and exits 2
