"""One live line in the parent while ranks train: steps done of total, loss, tokens/s, ETA.

It follows rank 0's ``metrics.jsonl`` (the file the metrics rank appends each logged step),
so it needs nothing from inside the ranks. ``render`` is pure; ``ProgressLine`` is the thread
that redraws it in place on a terminal.
"""

from __future__ import annotations

import shutil
import threading
import time
from typing import Any, TextIO

from qwen3_trainium.parent import report

BAR_WIDTH = 20


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def eta_seconds(rows: list[dict[str, Any]], total_steps: int) -> float | None:
    """Time left: the pace between the first and last logged rows (step 1 holds start-up and
    compilation, so it only counts when it is all there is), times the steps left."""
    if not rows:
        return None
    last = rows[-1]
    left = total_steps - last["step"]
    if len(rows) >= 2 and last["step"] > rows[0]["step"]:
        pace = (last["time"] - rows[0]["time"]) / (last["step"] - rows[0]["step"])
    elif isinstance(last.get("step_time_s"), (int, float)):
        pace = float(last["step_time_s"])
    else:
        return None
    return max(0.0, pace * left)


def render(rows: list[dict[str, Any]], total_steps: int, elapsed_s: float) -> str:
    if not rows:
        return f"[qwen3-trainium] starting ({_clock(elapsed_s)}): step 0/{total_steps}"
    last = rows[-1]
    filled = min(BAR_WIDTH, BAR_WIDTH * last["step"] // max(total_steps, 1))
    parts = [f"step {last['step']}/{total_steps} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}]"]
    if isinstance(last.get("loss"), (int, float)):
        parts.append(f"loss {last['loss']:.4f}")
    held_out = [r["val_loss"] for r in rows if isinstance(r.get("val_loss"), (int, float))]
    if held_out:  # eval=on: the latest held-out loss, whichever step it was measured at
        parts.append(f"val_loss {held_out[-1]:.4f}")
    if isinstance(last.get("tokens_per_second"), (int, float)):
        parts.append(f"{last['tokens_per_second']:.0f} tok/s")
    eta = eta_seconds(rows, total_steps)
    parts.append(f"ETA {_clock(eta)}" if eta is not None else "ETA ?")
    parts.append(f"elapsed {_clock(elapsed_s)}")
    return "[qwen3-trainium] " + " | ".join(parts)


class ProgressLine:
    """Redraws ``render`` on ``stream`` every ``interval`` seconds until stopped."""

    def __init__(self, run_dir: str, total_steps: int, stream: TextIO, interval: float = 0.5) -> None:
        self._run_dir, self._total, self._stream, self._interval = run_dir, total_steps, stream, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._start, self._started_at = time.monotonic(), time.time()
        self._shown = ""

    def _draw(self) -> None:
        # only this launch's rows: a resumed run's metrics.jsonl also holds the earlier attempt's
        rows = [r for r in report.read_metrics(self._run_dir) if r.get("time", 0) >= self._started_at]
        line = render(rows, self._total, time.monotonic() - self._start)
        if line == self._shown:
            return
        width = shutil.get_terminal_size((120, 20)).columns - 1
        self._stream.write("\r" + line[:width].ljust(min(width, len(self._shown))))
        self._stream.flush()
        self._shown = line

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._draw()

    def __enter__(self) -> ProgressLine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._draw()
        self._stream.write("\n")
        self._stream.flush()
