"""The rank side, run inside each torchrun worker and never in the parent's Hydra process:
``train`` (torchrun's ``-m`` entry), ``titan`` (run config to torchtitan ``Trainer.Config``, and the
zero-argument function torchtitan calls), the trainer, metrics, checkpoint manager, validator,
samples and the ranks' stop handler. Never imports Hydra, OmegaConf or the parent.
"""
