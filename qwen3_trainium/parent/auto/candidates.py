"""The legal layouts of one job (``parallel=auto``): every TP, CP and EP degree, activation
checkpointing mode and local batch the job could run with, on the world it was given, kept only
where pre-flight's own rules pass. Standard library only (the model's shape comes in).

What is held fixed: the model, flavor, device, instance, nodes, ``training.seq_len``, ``peft``,
the objective, and the **global batch**: ``training.global_batch_size``, or where it is -1,
``local_batch_size`` x the largest data-parallel degree (FSDP over every rank), so every layout
trains the same tokens per optimizer step; a layout with less data parallelism accumulates
gradients (``accum`` micro-batches, torchtitan's ``global_batch_size``).

What varies, each with the rule that bounds it:
- ``tp``: divides the attention and KV heads (pre-flight ``check_degrees``); on Trainium at most
  the ranks of one chip: "Keep TP4 within a chip. Use NeuronLink-v3's 4 x 4 torus for FSDP
  between chips, and EFA for communication between separate instances" (AWS Neuron, "Best
  practices for training on AWS Neuron", https://awsdocs-neuron.readthedocs-hosted.com/en/latest/
  training/best-practices.html): a chip has 8 physical NeuronCores, so 8 / LNC ranks (4 at LNC=2);
  elsewhere at most the ranks of one node;
- ``cp``: divides the world left by TP, with pre-flight's context-parallel rules (seq_len against
  2 x cp and the attention backend's, ``preflight/context.py``); not with ``objective=dpo``;
- ``ep``: MoE only, divides the experts and ``dp_shard x cp`` (``check_degrees``), and the
  kernels' rule (``model.kernels=[moe_experts]`` splits experts by TP only: ``preflight/model.py``);
  not on Trainium: AWS's "How to use EP to train a model with TorchTitan on Neuron" says its
  Neuron EP backend "runs on Trn3 ... It does not run on Trn2" (``docs/trainium.md``; torchtitan's
  own all-to-all EP, ``parallel=trn2_ep``, is never run on a trn2 here);
- ``ac``: none, selective, full;
- ``local_batch``: every divisor of the global batch over the data-parallel degree;
- on a CPU, the world itself: 1 .. the cores (a CPU "device" is the whole host).
Each candidate then passes the layout checks of pre-flight (``LAYOUT_CHECKS``), so a layout the
launcher would refuse is never offered.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass

from qwen3_trainium.config import devices
from qwen3_trainium.config.schema import ACMode, RunConf
from qwen3_trainium.memory.layout import Layout
from qwen3_trainium.memory.model_shape import ModelShape

AC_MODES = ("none", "selective", "full")
PHYSICAL_CORES_PER_TRN2_CHIP = (
    8  # "Every Trainium2 chip contains eight NeuronCore-V3 cores" (Trainium2 Architecture)
)


@dataclass(frozen=True)
class World:
    """The ranks a job may use: fixed on an accelerator, 1 .. the cores on a CPU."""

    sizes: tuple[int, ...]
    ranks_per_node: int  # of the largest world
    nnodes: int
    ranks_per_chip: int  # the TP ceiling within a chip (Trainium); else ranks_per_node


def world_of(run: RunConf, cpu_count: int) -> World:
    """The worlds ``parallel=auto`` may choose from for ``run``'s device and nodes."""
    kind, nnodes = run.device.type.value, run.launcher.nnodes
    if kind == "cpu":  # the planner chooses the processes: 1 .. one per core (on each node)
        per_node = max(cpu_count, 1)
        sizes = tuple(range(1, per_node + 1)) if nnodes == 1 else (per_node * nnodes,)
        return World(sizes, per_node, nnodes, per_node)
    info = devices.device_info(kind, lnc=run.device.lnc, instance=run.device.instance)
    per_node = run.launcher.nproc_per_node if run.launcher.nproc_per_node > 0 else info.devices_per_node
    per_chip = PHYSICAL_CORES_PER_TRN2_CHIP // run.device.lnc if kind == "neuron" else per_node
    return World((per_node * nnodes,), per_node, nnodes, per_chip)


def global_batch(run: RunConf, world: World) -> int:
    """Sequences per optimizer step, the same for every layout."""
    gbs = run.training.global_batch_size
    return gbs if gbs > 0 else run.training.local_batch_size * max(world.sizes)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(run: RunConf, shape: ModelShape, world: World) -> list[Layout]:
    """Every combination of the knobs, before the checks (the degrees already divide the world)."""
    batch = global_batch(run, world)
    dpo = run.objective.kind.value == "dpo"
    out = []
    for size in world.sizes:
        per_node = min(size, world.ranks_per_node)
        for tp in _divisors(size):
            if tp > min(world.ranks_per_chip, per_node):
                continue
            for cp in _divisors(size // tp):
                if dpo and cp > 1:
                    continue
                dp = size // (tp * cp)
                eps = [e for e in _divisors(dp * cp) if shape.num_experts and shape.num_experts % e == 0]
                if run.device.type.value == "neuron":  # AWS: the Neuron EP backend "does not run on Trn2"
                    eps = []
                for ep in eps or [1]:
                    if batch % dp:
                        continue
                    for ac in AC_MODES:
                        for local in _divisors(batch // dp):
                            accum = batch // (dp * local)
                            out.append(Layout(size, per_node, tp, cp, ep, ac, local, accum))
    return out


def apply(run: RunConf, layout: Layout) -> RunConf:
    """A copy of ``run`` with ``layout``'s degrees, checkpointing and batch."""
    out = copy.deepcopy(run)
    par = out.parallel
    par.tensor_parallel_degree, par.context_parallel_degree = layout.tp, layout.cp
    par.expert_parallel_degree, par.data_parallel_shard_degree = layout.ep, -1
    par.data_parallel_replicate_degree, par.pipeline_parallel_degree = 1, 1
    out.launcher.nproc_per_node = layout.world // out.launcher.nnodes
    out.activation_checkpoint.mode = ACMode[layout.ac]
    out.training.local_batch_size = layout.local_batch
    out.training.global_batch_size = layout.global_batch if layout.accum > 1 else -1
    return out


def overrides(run: RunConf, layout: Layout) -> list[str]:
    """The command-line overrides that give ``layout`` without ``parallel=auto``."""
    chosen = apply(run, layout)
    par = chosen.parallel
    return [
        f"launcher.nproc_per_node={chosen.launcher.nproc_per_node}",
        f"parallel.tensor_parallel_degree={par.tensor_parallel_degree}",
        f"parallel.context_parallel_degree={par.context_parallel_degree}",
        f"parallel.expert_parallel_degree={par.expert_parallel_degree}",
        "parallel.data_parallel_shard_degree=-1",
        f"activation_checkpoint.mode={layout.ac}",
        f"training.local_batch_size={layout.local_batch}",
        f"training.global_batch_size={chosen.training.global_batch_size}",
    ]


def legal(run: RunConf, shape: ModelShape, world: World) -> tuple[list[tuple[Layout, RunConf]], Counter]:
    """(each legal layout with its run, the count of refused ones by the key pre-flight named)."""
    from qwen3_trainium.parent.preflight.system import check_degrees

    kept, refused = [], Counter()
    seen: dict[tuple, list] = {}  # the checks read the degrees, not the batch or checkpointing
    for layout in layouts(run, shape, world):
        candidate = apply(run, layout)
        key = (layout.world, layout.tp, layout.cp, layout.ep, layout.accum > 1)
        if key not in seen:
            problems, _ = check_degrees(candidate, shape)
            seen[key] = problems or layout_problems(candidate)
        if seen[key]:
            refused[seen[key][0].key] += 1
            continue
        kept.append((layout, candidate))
    return kept, refused


def layout_problems(run: RunConf) -> list:
    """Pre-flight's quick checks that read the layout (``registry.CHECKS`` by name)."""
    from qwen3_trainium.parent.preflight.registry import CHECKS, Pass

    state = Pass(run, run_dir="", launching=False)
    problems = []
    for check in CHECKS:
        if check.name in LAYOUT_CHECKS and check.quick is not None:
            problems += check.quick(state)
    return problems


# pre-flight's quick checks that a layout can fail (the others read files, data, the stack)
LAYOUT_CHECKS = frozenset(
    {"model", "ranges", "rope", "context parallel", "world size", "objective", "peft", "moe balance"}
)
