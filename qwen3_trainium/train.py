"""Rank entry point: ``torchrun ... -m qwen3_trainium.train --module ... --config ...``.

It first makes SIGTERM a request to stop at the next step boundary with a checkpoint
(``stop.py``, ``trainer.py``), then installs the configured device for torchtitan (the CPU
device module; nothing on neuron or cuda) before torchtitan's trainer is imported, and hands
over to torchtitan's own ``torchtitan.train.main`` with the command line untouched.
"""

import os

from qwen3_trainium import devices, runconfig, stop
from qwen3_trainium.titan import RUN_DIR_ENV


def main() -> None:
    stop.install_rank_handler()  # before torch is imported: SIGTERM no longer ends the rank
    run = runconfig.load(runconfig.rank_config_path(os.environ[RUN_DIR_ENV]))
    devices.install_rank_device(run.device.type.value)

    from torchtitan.train import main as titan_main

    titan_main()


if __name__ == "__main__":
    main()
