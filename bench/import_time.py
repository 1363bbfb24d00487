"""What the parent costs to start, this tree against another checkout, side by side.

Three commands in each tree, interleaved (rotating order, several rounds), each in a fresh
process with its own pre-flight cache:
- ``python launch.py --help`` (Hydra's help: composition only);
- a remembered dry run (``python launch.py dry_run=true`` after one that filled the cache);
- ``import qwen3_trainium.parent.launcher`` (``qwen3_trainium.launcher`` in a tree before the
  packages), with the count of torch / torchtitan / transformers modules it loaded.
Prints the median wall times and the ratio this tree / the other.

    git worktree add /tmp/before <commit>
    python bench/import_time.py --before /tmp/before [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torchtitan", "transformers")
PROBE = (
    "import sys, importlib.util as u; "
    "name = 'qwen3_trainium.parent.launcher' if u.find_spec('qwen3_trainium.parent') else 'qwen3_trainium.launcher'; "
    "__import__(name); print(sum(m.split('.')[0] in {heavy!r} for m in sys.modules))"
)


def run(tree: Path, argv: list[str], cache: str) -> tuple[float, str]:
    env = {**os.environ, "XDG_CACHE_HOME": cache, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    env["PYTHONPATH"] = str(tree)  # this tree's package first, whatever the venv's editable install says
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed in {tree}: {' '.join(argv)}\n{proc.stderr[-2000:]}")
    return wall, proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout (a git worktree)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    trees = {"this tree": HERE, "before": args.before.resolve()}
    caches = {name: tempfile.mkdtemp(prefix="q3t-import-") for name in trees}
    runs = tempfile.mkdtemp(prefix="q3t-import-runs-")
    commands = {
        "launch.py --help": lambda name: ["launch.py", "--help"],
        "dry run, remembered": lambda name: ["launch.py", "dry_run=true", f"hydra.run.dir={runs}/{name}"],
        "import the launcher": lambda name: ["-c", PROBE.format(heavy=HEAVY)],
    }
    for name, tree in trees.items():  # fill each tree's pre-flight cache once
        run(tree, commands["dry run, remembered"](name.replace(" ", "_")), caches[name])
    walls: dict[tuple[str, str], list[float]] = {}
    heavy: dict[str, str] = {}
    order = list(trees)
    for r in range(args.rounds):
        for command, argv in commands.items():
            for name in order if r % 2 == 0 else reversed(order):
                wall, out = run(trees[name], argv(name.replace(" ", "_")), caches[name])
                walls.setdefault((command, name), []).append(wall)
                if command == "import the launcher":
                    heavy[name] = out
    print(
        f"{'command':24s} {'this tree':>10s} {'before':>10s} {'ratio':>7s}   ({args.rounds} rounds, median s)"
    )
    for command in commands:
        now = statistics.median(walls[(command, "this tree")])
        then = statistics.median(walls[(command, "before")])
        print(f"{command:24s} {now:10.3f} {then:10.3f} {now / then:7.2f}")
    print(
        f"torch/torchtitan/transformers modules loaded by importing the launcher: this tree {heavy['this tree']}, before {heavy['before']}"
    )


if __name__ == "__main__":
    main()
