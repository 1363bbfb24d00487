"""Hydra entry point: ``python launch.py model=native smoke=on`` (see README)."""

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from qwen3_trainium import launcher, runconfig, schema

schema.register()
runconfig.register_resolvers()


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> int:
    hydra_cfg = HydraConfig.get()
    code = launcher.run_job(
        cfg,
        run_dir=hydra_cfg.runtime.output_dir,
        run_name=hydra_cfg.job.override_dirname or "default",
        launch_dir=os.getcwd(),
    )
    if hydra_cfg.mode == RunMode.RUN and code != 0:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
