"""Hydra entry point: ``python launch.py model=native smoke=on`` (see README)."""

import sys

import hydra
from omegaconf import DictConfig

from qwen3_trainium.parent import compose, launcher, sweep

compose.register()
compose.register_resolvers()


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    return launcher.hydra_task(cfg)


if __name__ == "__main__":
    main()
    sys.exit(sweep.exit_status())  # a multirun: 1 if any job failed, after all of them ran
