"""hydra-submitit-launcher's Slurm launcher with a dry run (selected by ``cluster=slurm_*``)."""
