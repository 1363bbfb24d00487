"""Configuration, imported by every side: the typed schema of each Hydra group (``schema``,
``choices``), model flavors, devices, nodes, torchtitan seams, and the resolved run config
(``runconfig``: ``resolved.yaml`` loaded back without Hydra or OmegaConf, so a rank can read it).
"""
