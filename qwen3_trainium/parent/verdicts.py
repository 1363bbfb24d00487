"""Verdicts: pre-flight's on a job before it starts (every check once, a remembered pass
reused) and the launcher's on a run after torchrun ended (stopped, export and samples checked).
"""

from __future__ import annotations

import sys

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.parent import export_check, preflight, report, samples_check, signals
from qwen3_trainium.parent.preflight import cache
from qwen3_trainium.shared import stopfiles


class Preflight:
    """Every pre-flight check of one job, run once: a remembered pass (``preflight/cache.py``)
    is reused, a fresh pass is remembered."""

    def __init__(self, run: RunConf, run_dir: str, *, launching: bool) -> None:
        self.run, self.run_dir, self.launching = run, run_dir, launching
        self.versions = preflight.installed_versions(run)  # for the cache key and job.json
        self.digest = None
        if run.preflight_cache:
            self.digest = cache.key(run, run_dir, launching=launching, versions=self.versions)
        remembered = cache.load(self.digest) if self.digest else None
        self.notes, self.facts = remembered if remembered else (None, {})
        self.cached = remembered is not None
        self.disk_notes: list[str] = []

    def problems(self) -> list:
        """Every problem; the free disk against the checkpoints is checked every time."""
        if not self.cached:
            self.notes, self.facts = [], {}
            problems = preflight.check(
                self.run, self.run_dir, launching=self.launching, notes=self.notes, facts=self.facts
            )
            if problems:
                return problems
            if self.digest:
                cache.store(self.digest, self.notes, self.facts)
        if not self.launching:
            return []
        params, trainable = self.facts.get("params", 0), self.facts.get("trainable")  # None: all of them
        return preflight.check_disk(self.run, self.run_dir, params, self.disk_notes, trainable)

    def print_notes(self) -> None:
        for note in (self.notes or []) + self.disk_notes:
            print(f"[qwen3-trainium] {note}", flush=True)
        if self.cached:
            print(
                "[qwen3-trainium] pre-flight: passed before with this config, code, versions and inputs (cached; preflight_cache=false checks again)",
                flush=True,
            )


def refuse(problems: list, *, ranks_started: bool = False) -> tuple[str, int]:
    print(preflight.format_problems(problems, ranks_started=ranks_started), file=sys.stderr)
    return "failed", 2


def after_run(run: RunConf, run_dir: str, code: int, plotter: report.RunPlotter | None) -> tuple[str, int]:
    """On the lead node: the loss plot (drawn while torchrun shut down), then the export check.
    A stop signal makes the job ``interrupted``, exit code 128 + the signal (``signals.outcome``)."""
    marker = stopfiles.read_json(stopfiles.marker_path(run_dir))
    status, code = signals.outcome(code, marker, signals.LauncherSignals.current)
    if status == "interrupted":
        print(f"[qwen3-trainium] {signals.describe(marker, code)}", file=sys.stderr, flush=True)
    if plotter is None:
        return status, code
    plotter.finish()
    if status == "interrupted":
        report.update_job(run_dir, stop=marker)
        return status, code
    if code == 0 and run.checkpoint.enable and run.checkpoint.last_save_in_hf and run.checkpoint.export_check:
        passed, line = export_check.verify(run, run_dir)
        print(f"[qwen3-trainium] {line}", flush=True)
        code = 0 if passed else 3
    if code == 0 and run.eval.enable:
        passed, line = samples_check.after_run(run, run_dir)
        if line:
            print(f"[qwen3-trainium] {line}", flush=True)
        code = 0 if passed else 3
    return ("ok" if code == 0 else "failed"), code
