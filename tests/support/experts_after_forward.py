"""``python tests/support/experts_after_forward.py RUN_DIR RESOLVED_YAML``: one training step of the
run's model as rank 0 of its world, on torchtitan's fake process group and fake tensors (the
trace's own build, ``trace.py``), watching layer 0. Prints one JSON line:

- ``gathered_param_bytes_during_forward``: bytes of the tensors layer 0's forward saved for backward
  whose shape is a whole (gathered) expert parameter, at the moment they were saved;
- ``saved_gathered_bytes``: the storage those tensors still hold when layer 1's forward starts
  (0 when FSDP freed the gathered experts after layer 0's forward, as it does for any parameter);
- ``experts_local_rows``: the experts layer 0's ``gate_up_ED2F`` holds on this rank at that moment.

A separate process because it starts a (fake) process group.
"""

from __future__ import annotations

import json
import sys


def main(run_dir: str, resolved: str) -> dict:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from qwen3_trainium.config import cpu_device, runconfig
    from qwen3_trainium.memory import trace, tracing
    from qwen3_trainium.rank import titan

    run = runconfig.load(resolved)
    cpu_device.install_rank_device("cpu")
    world = runconfig.degrees(run).world
    trace._fake_world(world)
    config = titan.to_trainer_config(run, run_dir)
    parallel_dims, model_config, model, _ = trace._build(config, world)
    loss_fn = config.loss.build(compile_config=config.compile)
    rank = trace._Rank(config, parallel_dims, model_config, model, loss_fn)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    batch = rank.batch(fake_mode)
    experts = model.layers["0"].moe.routed_experts.inner_experts
    whole = {tuple(p.shape) for p in (experts.gate_up_ED2F, experts.down_EFD)}  # global shapes
    saved: list[torch.Tensor] = []
    found: dict[str, int] = {"gathered_param_bytes_during_forward": 0}
    watching = [False]

    def pack(t):
        if watching[0] and tuple(t.shape) in whole:
            saved.append(t)
            found["gathered_param_bytes_during_forward"] += t.untyped_storage().nbytes()
        return t

    def start(*_):
        watching[0] = True

    def after_layer_0(*_):
        if watching[0]:
            watching[0] = False
            found["saved_gathered_bytes"] = sum(t.untyped_storage().nbytes() for t in saved)
            found["experts_local_rows"] = local_rows(experts.gate_up_ED2F)

    model.layers["0"].register_forward_pre_hook(start)
    model.layers["1"].register_forward_pre_hook(after_layer_0)
    with fake_mode:
        model.to_empty(device="cpu")
        tracing.init_weights(model)
        model.train()
        loss_fn.set_lm_head(model.lm_head)
        model._skip_lm_head = True
        optimizers = config.optimizer.build(model_parts=[model])
        tracker = tracing.step_tracker()
        with tracing.adapted(tracker), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            rank.step(optimizers, batch)
    return found


def local_rows(param) -> int:
    return (param.to_local() if hasattr(param, "to_local") else param).shape[0]


if __name__ == "__main__":
    import contextlib

    with contextlib.redirect_stdout(sys.stderr):  # torchtitan's logs stay off the JSON
        result = main(sys.argv[1], sys.argv[2])
    print(json.dumps(result))
