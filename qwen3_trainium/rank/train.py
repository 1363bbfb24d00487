"""Rank entry point: ``torchrun ... -m qwen3_trainium.rank.train --module ... --config ...``.

It first ties itself to torchrun (SIGKILL when torchrun ends, ``lifeline.py``), makes SIGTERM a request to stop at the next step boundary with a checkpoint
(``stop.py``, ``trainer.py``), then installs the configured device for torchtitan (the CPU
device module; nothing on neuron or cuda) before torchtitan's trainer is imported, and hands
over to torchtitan's own ``torchtitan.train.main`` with the command line untouched.

After a run that ended well (torchtitan has closed the trainer and destroyed the process group)
the rank flushes its logs and leaves with ``os._exit(0)``, skipping the interpreter's teardown
of torch's C++ objects, as CPython's own ``multiprocessing`` children end
(``multiprocessing/popen_fork.py``: ``os._exit(code)`` after ``_bootstrap``). That teardown
once aborted a rank of a two-node run that had finished its work ("terminate called without an
active exception", SIGABRT with no Python frame, after "Process group destroyed"). torch's
elastic agent waits at its exit barrier only for workers that succeeded
(``torch/distributed/elastic/agent/server/api.py`` ``_invoke_run``), so the aborted rank's agent
left, taking the rendezvous store with it, and the other node failed too
(``RendezvousConnectionError``). Inductor's compile workers, whose ``atexit`` shutdown this skips,
exit on their own when their parent goes (``torch/_inductor/compile_worker/utils.py``,
``os.getppid()`` watch).
"""

import logging
import os
import sys

from qwen3_trainium.config import cpu_device, runconfig
from qwen3_trainium.rank import stop
from qwen3_trainium.shared import lifeline
from qwen3_trainium.shared.contract import RUN_DIR_ENV


def main() -> None:
    lifeline.die_with_parent()  # SIGKILL when torchrun ends, however it ends: no orphaned ranks
    stop.install_rank_handler()  # before torch is imported: SIGTERM no longer ends the rank
    run = runconfig.load(runconfig.rank_config_path(os.environ[RUN_DIR_ENV]))
    cpu_device.install_rank_device(run.device.type.value)

    from torchtitan.train import main as titan_main

    titan_main()
    _leave()


def _leave() -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
