"""qwen3-trainium: Qwen3 on AWS Trainium with torchtitan, configured by Hydra.

One way through, top to bottom (held by the import contracts in ``pyproject.toml``):

    parent/   runs once per job, in the process ``launch.py`` starts: Hydra composition, pre-flight,
              doctor, torchrun's argv/env and process, stop signals, reports, sweeps.
    memory/   before launch, in the parent or a helper process: the memory estimate, the trace on
              fake tensors (it builds a rank's config), the roofline.
    rank/     inside each torchrun worker: the config function torchrun calls, the trainer,
              metrics, checkpoints, validation, samples, the ranks' side of stop signals.
    models/   model code both sides build: the HF model and config, torchtitan overrides, NKI kernels
              with their pure-PyTorch references, HF export and expert conversion.
    data/     the shipped corpus, tokenizer and tiny checkpoints, and the held-out split.
    config/   the typed schema, flavors, devices, nodes, seams, and the resolved run config.
    shared/   the parent/rank contract (entry points, env vars, run-directory files), the lifeline,
              the verdict gate and the stop-file protocol: the standard library only.

``make_assets``, ``convert_experts`` and ``setup_neuron`` at the top are the published
``python -m qwen3_trainium.<name>`` commands, each a call into its package.
"""
