"""On Neuron the export check and the samples check compare float32 forwards, and neuronx-cc casts
float32 matmuls to bfloat16 by default (AWS's neuronx-cc mixed-precision guide,
``parent/export_facts.py``): the launcher adds ``--auto-cast=none`` to the ranks' NEURON_CC_FLAGS
when a check will compare, keeps a user's flags, and pre-flight refuses a user's other auto-cast
before anything starts."""

from __future__ import annotations

import pytest
from conftest import resolve

from qwen3_trainium.parent import argv
from qwen3_trainium.parent.preflight import heldout

TRN2 = ("device=neuron", "parallel=trn2_dp64", "model.flavor=0.6B")
EXPORT = ("checkpoint=hf_export",)


def _flags(*overrides, environ=None):
    run = resolve(*TRN2, *overrides)
    return argv.rank_env(run, "/tmp/run", dict(environ or {})).get("NEURON_CC_FLAGS")


def test_the_ranks_keep_float32_matmuls_when_a_check_compares_float32_forwards():
    assert _flags(*EXPORT) == "--auto-cast=none"
    assert _flags(*EXPORT, environ={"NEURON_CC_FLAGS": "--model-type transformer"}) == (
        "--model-type transformer --auto-cast=none"
    )
    # eval=on's samples compare too, with the export check off
    assert _flags(*EXPORT, "checkpoint.export_check=false", "eval=on") == "--auto-cast=none"


@pytest.mark.parametrize(
    "overrides",
    [
        (),
        ("checkpoint=resume",),
        (*EXPORT, "checkpoint.export_check=false"),
        (*EXPORT, "device=cpu", "parallel=cpu2"),
    ],
    ids=["no checkpoint", "no HF export", "no check", "not neuron"],
)
def test_nothing_is_added_when_no_check_compares_or_off_neuron(overrides):
    assert _flags(*overrides) is None


def test_a_users_own_auto_cast_is_kept_and_another_than_none_refused_before_launch():
    assert _flags(*EXPORT, environ={"NEURON_CC_FLAGS": "--auto-cast=none"}) is None  # theirs stands
    run = resolve(*TRN2, *EXPORT)
    assert heldout.check_probe_precision(run, {"NEURON_CC_FLAGS": "--auto-cast none"}) == []
    assert heldout.check_probe_precision(run, {}) == []  # the launcher adds it
    [problem] = heldout.check_probe_precision(run, {"NEURON_CC_FLAGS": "--auto-cast=matmult -O2"})
    assert (problem.key, problem.value) == ("checkpoint.export_check", True)
    assert "'--auto-cast=matmult -O2'" in problem.message and "drop --auto-cast" in problem.fix
    sampled = resolve(*TRN2, *EXPORT, "checkpoint.export_check=false", "eval=on")
    [problem] = heldout.check_probe_precision(sampled, {"NEURON_CC_FLAGS": "--auto-cast all"})
    assert problem.key == "eval.sample_tokens" and "eval.sample_tokens=0" in problem.fix
    off = resolve(*TRN2, *EXPORT, "checkpoint.export_check=false")
    assert heldout.check_probe_precision(off, {"NEURON_CC_FLAGS": "--auto-cast=matmult"}) == []
