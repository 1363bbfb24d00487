"""The report the on-device tests leave for a bug report: every figure, the versions, the commit."""

from __future__ import annotations

import datetime
import platform
from pathlib import Path


class DeviceReport:
    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[str, str, str]]] = {}  # device -> (check, figure, verdict)

    def add(self, device: str, check: str, figure: str, verdict: str = "pass") -> None:
        self.rows.setdefault(device, []).append((check, figure, verdict))
        print(f"[{device}] {check}: {figure} ({verdict})")

    def text(self, device: str) -> str:
        from qwen3_trainium.parent import tracking
        from qwen3_trainium.parent.preflight import stack

        names = [*stack.REQUIRED, *(stack.NEURON_REQUIRED if device == "neuron" else ()), "nki-library"]
        lines = [
            f"# qwen3-trainium on-device report ({device})",
            "",
            f"- date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
            f"- commit: {tracking.git_commit() or 'unknown'}",
            f"- host: {platform.node()} ({platform.machine()}), Python {platform.python_version()}",
            "",
            "| package | version |",
            "|---|---|",
            *(f"| {name} | {stack.installed(name) or '-'} |" for name in names),
            "",
            "| check | figure | verdict |",
            "|---|---|---|",
            *(f"| {check} | {figure} | {verdict} |" for check, figure, verdict in self.rows[device]),
            "",
        ]
        return "\n".join(lines)

    def write(self, root: Path) -> list[Path]:
        written = []
        for device in self.rows:
            path = root / ("trn2_report.md" if device == "neuron" else f"{device}_report.md")
            path.write_text(self.text(device))
            written.append(path)
            print(f"wrote {path}")
        return written
