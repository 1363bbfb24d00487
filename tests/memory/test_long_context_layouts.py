"""The long-context layouts (docs/memory.md, "Long context"): each experiment passes pre-flight
with its traced peak at 90% of a trn2 rank's memory or less."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

RANK_GIB = 23.812  # a trn2 rank's HBM at LNC=2 (config/devices.py)


@pytest.mark.heavy  # a trace each: one to two minutes on 2 cores
@pytest.mark.parametrize("experiment", ["qwen3_30b_a3b_trn2_32k", "qwen3_30b_a3b_trn2_32k_lora"])
def test_the_32k_30b_a3b_layouts_pass_preflight_at_90_percent_or_less(experiment, dry_run, tmp_path):
    result, out, err = dry_run(ROOT, tmp_path, f"experiment={experiment}", "memory=trace")
    assert result == ("dry_run", 0), err
    assert "(traced: the second step as rank 0 of 64" in out
    peak = float(re.search(r"step peak\s+([\d.]+) GiB", out).group(1))
    assert peak <= 0.9 * RANK_GIB, f"{experiment}: traced {peak:.3f} GiB"
