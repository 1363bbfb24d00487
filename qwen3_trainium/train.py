"""Rank entry point: ``torchrun ... -m qwen3_trainium.train --module ... --config ...``.

It installs the configured device for torchtitan (the CPU device module; nothing on neuron
or cuda) before torchtitan's trainer is imported, then hands over to torchtitan's own
``torchtitan.train.main`` with the command line untouched.
"""

import os

from qwen3_trainium import devices, runconfig
from qwen3_trainium.titan import RUN_DIR_ENV


def main() -> None:
    run = runconfig.load(runconfig.rank_config_path(os.environ[RUN_DIR_ENV]))
    devices.install_rank_device(run.device.type.value)

    from torchtitan.train import main as titan_main

    titan_main()


if __name__ == "__main__":
    main()
