"""What eval=on adds to a smoke run's wall time: interleaved A/B, medians.

    python -m bench.eval_cost [--rounds 3] [--model native]

Each round runs ``python launch.py model=M smoke=on tracking=off`` with eval=off and eval=on
(order alternating), and prints the median wall times, their ratio and difference, and, from
the eval=on runs' rank 0 log, the seconds spent validating and sampling.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from bench.common import ROOT, abba

STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) - root - INFO - (.*)")


def _times(log: str) -> dict[str, float]:
    """Seconds from the last step's line to validation's, and from "Training completed" (after
    torchtitan's 2 s end-of-run sleep) to the samples' line, in rank 0's streamed log."""
    marks: dict[str, datetime] = {}
    for line in log.splitlines():
        m = STAMP.search(line)
        if not m:
            continue
        when, what = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f"), m.group(2)
        if what.startswith("step:"):
            marks["last_step"] = when
        elif what.startswith("validate step:"):
            marks["validated"] = when
        elif what.startswith("Training completed"):
            marks["completed"] = when
        elif what.startswith("samples:"):
            marks["sampled"] = when
    out = {}
    if "validated" in marks:
        out["validate_s"] = (marks["validated"] - marks["last_step"]).total_seconds()
    if "sampled" in marks and "completed" in marks:
        out["samples_s"] = (marks["sampled"] - marks["completed"]).total_seconds()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="native")
    args = parser.parse_args()
    walls: dict[str, list[float]] = {"off": [], "on": []}
    parts: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r, order in enumerate(abba(args.rounds, ("off", "on"))):
            for kind in order:
                run_dir = Path(tmp) / f"{r}-{kind}"
                overrides = [f"model={args.model}", "smoke=on", "tracking=off", f"eval={kind}"]
                argv = [sys.executable, "launch.py", *overrides, f"hydra.run.dir={run_dir}"]
                start = time.perf_counter()
                proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
                walls[kind].append(time.perf_counter() - start)
                if proc.returncode != 0:
                    sys.exit(f"run failed ({proc.returncode}): {' '.join(argv)}\n{proc.stderr[-2000:]}")
                if kind == "on":
                    parts.append(_times(proc.stdout + proc.stderr))
    off, on = statistics.median(walls["off"]), statistics.median(walls["on"])
    print(f"model={args.model} smoke=on, {args.rounds} rounds, interleaved")
    print(f"  eval=off  median wall {off:6.2f} s  ({', '.join(f'{w:.2f}' for w in walls['off'])})")
    print(f"  eval=on   median wall {on:6.2f} s  ({', '.join(f'{w:.2f}' for w in walls['on'])})")
    print(f"  eval=on / eval=off = {on / off:.3f}x  (+{on - off:.2f} s)")
    for key in ("validate_s", "samples_s"):
        values = [p[key] for p in parts if key in p]
        if values:
            print(f"  {key:10s} median {statistics.median(values):.2f} s (rank 0 log)")


if __name__ == "__main__":
    main()
