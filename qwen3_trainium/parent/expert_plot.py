"""``expert_load.png``: a MoE run's heatmap of expert load (layer x expert, each layer's share of
its token-expert assignments over the run), drawn from ``expert_load.json`` beside ``loss.png``;
and the sweep summary's expert-load section. A dense run has no ``expert_load.json``: nothing is
drawn, matplotlib is not imported."""

from __future__ import annotations

import os
from typing import Any

from qwen3_trainium.shared.expert_load_file import HEATMAP_NAME, read_load, shares, summary

MOE_COLUMNS = ("max_load", "zero_experts")


def pyplot():
    """matplotlib's pyplot, headless (the loss plots use it too)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def plot_expert_load(run_dir: str, label: str) -> bool:
    """Draw ``<run_dir>/expert_load.png``; False when the run has no expert load record."""
    data = read_load(run_dir)
    if not data:
        return False
    plt = pyplot()
    table = shares(data)
    layers, experts = len(table), len(table[0])
    size = (min(16, max(6.4, 3 + 0.12 * experts)), min(12, max(3.6, 2 + 0.25 * layers)))
    fig, ax = plt.subplots(figsize=size, dpi=100)
    image = ax.imshow(table, aspect="auto", interpolation="nearest", cmap="viridis", vmin=0.0)
    fig.colorbar(image, ax=ax, label="share of the layer's tokens")
    ax.set_xlabel(f"expert ({experts})")
    ax.set_ylabel("layer")
    step = max(1, layers // 16)  # at most ~16 layer labels
    ax.set_yticks(range(0, layers, step), [str(layer) for layer in data["layers"][::step]])
    figures = summary(data)
    ax.set_title(
        f"{label}\nsteps {data['first_step']}-{data['step']}, top_k {data['top_k']},"
        f" max/mean {figures['max_load']}, experts with no token {figures['zero_experts']}",
        fontsize=9,
    )
    fig.tight_layout()
    path = os.path.join(run_dir, HEATMAP_NAME)
    partial = f"{path}.{os.getpid()}.partial.png"
    fig.savefig(partial)
    plt.close(fig)
    os.replace(partial, path)  # whoever sees the file sees all of it
    return True


def sweep_section(sweep_dir: str, rows: list[dict[str, Any]], labels: list[str]) -> str:
    """summary.md's expert-load part: each MoE job's heatmap (drawn if missing), linked relative to
    the sweep directory; empty when no job has an expert load record."""
    lines = []
    for row, label in zip(rows, labels, strict=True):
        run_dir = row["run_dir"]
        path = os.path.join(run_dir, HEATMAP_NAME)
        if not read_load(run_dir) or not (os.path.isfile(path) or plot_expert_load(run_dir, label)):
            continue
        lines.append(
            f"### {label}\n\n![expert load of job {row['job']}]({os.path.relpath(path, sweep_dir)})\n"
        )
    return "\n## Expert load\n\n" + "\n".join(lines) if lines else ""
