"""The ranks' side of the stop signals (the protocol: ``shared/stopfiles.py``; the launcher's side,
and the whole story: ``parent/signals.py``). ``install_rank_handler``, first thing in
``qwen3_trainium.rank.train``: SIGTERM only sets a flag that the trainer reads at each step boundary
(``rank/trainer.py``). A rank that was still starting when SIGTERM came ignored it (torchrun's
workers inherit its SIG_IGN), so the handler also reads the launcher's request file, written
before any rank is signalled. Only the standard library: a rank installs its handler before it
imports torch.
"""

from __future__ import annotations

import os
import signal

from qwen3_trainium.shared.stopfiles import REQUEST_ENV, exit_code, read_json

_requested = 0  # the signal that asked this rank to stop; 0: none


def _on_sigterm(signum: int, frame) -> None:
    global _requested
    if not _requested:
        _requested = signum
        os.write(
            2, b"[qwen3-trainium] SIGTERM: every rank stops after its current step (with a checkpoint)\n"
        )


def _on_fast(signum: int, frame) -> None:
    raise SystemExit(exit_code(signum))  # unwinds through torchtitan's cleanup, no traceback


def install_rank_handler(environ=os.environ) -> None:
    """From now on SIGTERM asks for a stop at the next step boundary instead of ending the rank,
    and SIGINT (the launcher's fast stop) ends it quietly."""
    global _requested
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, _on_fast)
    request = read_json(environ.get(REQUEST_ENV))
    if request and not _requested:  # asked while this rank was starting (and ignoring SIGTERM)
        _requested = int(request["signal"])


def requested() -> int:
    return _requested
