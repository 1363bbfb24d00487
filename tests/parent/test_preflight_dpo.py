"""objective=dpo's pre-flight (``parent/preflight/dpo.py``): each refusal names its key, the bad
value and a fix, and the settings that work pass. The rules are TRL 1.16.0's where it has them
(label_smoothing: read by robust and exo_pair only, ``trl/trainer/dpo_trainer.py`` 1406-1431;
exo_pair raises on e = 0 at 829-833), checked here against hand-written expectations."""

from __future__ import annotations

import os

import pytest
from conftest import resolve

from qwen3_trainium.parent.preflight import dpo

DPO = ("objective=dpo", "device=cpu", "tracking=off")


def _keys(*overrides: str) -> list[tuple[str, object]]:
    problems = dpo.check_dpo(resolve(*overrides))
    assert all(p.fix and p.message for p in problems), problems
    return [(p.key, p.value) for p in problems]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        # the data and the objective come together
        ((*DPO, "data=chat"), [("data.format", "auto")]),
        (("data=preference", "device=cpu"), [("objective", "sft")]),
        (("objective.dpo.beta=0.5",), [("objective.dpo.beta", 0.5)]),  # read by nothing under sft
        # paths and layouts the step was not made for
        ((*DPO, "parallel.pipeline_parallel_degree=2"), [("parallel.pipeline_parallel_degree", 2)]),
        ((*DPO, "parallel.context_parallel_degree=2"), [("parallel.context_parallel_degree", 2)]),
        ((*DPO, "parallel.tensor_parallel_degree=2"), [("parallel.tensor_parallel_degree", 2)]),
        ((*DPO, "compile=on"), [("compile.enable", True)]),
        # beta, the loss types and their weights
        ((*DPO, "objective.dpo.beta=0"), [("objective.dpo.beta", 0.0)]),
        ((*DPO, "objective.dpo.beta=-0.1"), [("objective.dpo.beta", -0.1)]),
        ((*DPO, "objective.dpo.loss_type=[]"), [("objective.dpo.loss_type", [])]),
        ((*DPO, "objective.dpo.loss_type=[ipo,ipo]"), [("objective.dpo.loss_type", ["ipo", "ipo"])]),
        ((*DPO, "objective.dpo.loss_weights=[1.0,0.5]"), [("objective.dpo.loss_weights", [1.0, 0.5])]),
        ((*DPO, "objective.dpo.loss_weights=[-1.0]"), [("objective.dpo.loss_weights", [-1.0])]),
        ((*DPO, "objective.dpo.discopop_tau=0"), [("objective.dpo.discopop_tau", 0.0)]),
        # label_smoothing: TRL 1.16.0's sigmoid (and hinge, ipo, ...) ignore it
        ((*DPO, "objective.dpo.label_smoothing=0.1"), [("objective.dpo.label_smoothing", 0.1)]),
        (
            (*DPO, "objective.dpo.loss_type=[ipo,hinge]", "objective.dpo.label_smoothing=0.2"),
            [("objective.dpo.label_smoothing", 0.2)],
        ),
        (
            (*DPO, "objective.dpo.loss_type=[robust]", "objective.dpo.label_smoothing=0.5"),
            [("objective.dpo.label_smoothing", 0.5)],
        ),
        (
            (*DPO, "objective.dpo.loss_type=[robust]", "objective.dpo.label_smoothing=-0.1"),
            [("objective.dpo.label_smoothing", -0.1)],
        ),
        ((*DPO, "objective.dpo.loss_type=[exo_pair]"), [("objective.dpo.label_smoothing", 0.0)]),
        (
            (*DPO, "objective.dpo.loss_type=[exo_pair]", "objective.dpo.label_smoothing=1.0"),
            [("objective.dpo.label_smoothing", 1.0)],
        ),
        (
            (*DPO, "objective.dpo.loss_type=[exo_pair,robust]", "objective.dpo.label_smoothing=0.6"),
            [("objective.dpo.label_smoothing", 0.6)],
        ),
        # the reference
        ((*DPO, "objective.dpo.reference=adapters_off"), [("objective.dpo.reference", "adapters_off")]),
        (
            (*DPO, "peft=lora", "objective.dpo.reference_path=/nonexistent"),
            [("objective.dpo.reference_path", "/nonexistent")],
        ),
        (
            (*DPO, "objective.dpo.reference_path=/nonexistent"),
            [("objective.dpo.reference_path", "/nonexistent")],
        ),
    ],
)
def test_each_bad_dpo_setting_is_refused_naming_key_and_value(overrides, expected):
    assert _keys(*overrides) == expected


def test_model_hf_is_refused_with_the_command_that_works():
    from qwen3_trainium.data import assets

    problems = dpo.check_dpo(resolve(*DPO, "model=hf", f"model.hf_model={assets.ensure_hf_model()}"))
    assert [(p.key, p.value) for p in problems] == [("model", "hf")]
    for key in ("model=native", "checkpoint=hf_finetune", "checkpoint.initial_load_path=", "model.flavor="):
        assert key in problems[0].fix


@pytest.mark.parametrize(
    "overrides",
    [
        DPO,  # the shipped default: sigmoid, beta 0.1, precompute
        (*DPO, "peft=lora"),  # adapters_off, auto
        (*DPO, "peft=lora", "objective.dpo.reference=precompute"),  # exact too: lora_b starts at zero
        (*DPO, "objective.dpo.loss_type=[robust]", "objective.dpo.label_smoothing=0.0"),
        (*DPO, "objective.dpo.loss_type=[robust]", "objective.dpo.label_smoothing=0.49"),
        (*DPO, "objective.dpo.loss_type=[exo_pair]", "objective.dpo.label_smoothing=1e-3"),
        (*DPO, "objective.dpo.loss_type=[sigmoid,exo_pair]", "objective.dpo.label_smoothing=0.3"),
        (*DPO, "objective.dpo.loss_type=[sigmoid,bco_pair]", "objective.dpo.loss_weights=[0.8,0.2]"),
        (*DPO, "objective.dpo.loss_weights=[0.0]"),
        ("device=cpu", "data=chat"),  # objective=sft with its defaults: nothing to say
    ],
)
def test_settings_that_work_pass(overrides):
    assert _keys(*overrides) == []


def test_reference_path_to_an_hf_directory_passes(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert _keys(*DPO, f"objective.dpo.reference_path={tmp_path}") == [
        ("objective.dpo.reference_path", str(tmp_path))
    ]  # a config.json alone: no weights
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert _keys(*DPO, f"objective.dpo.reference_path={tmp_path}") == []


def _pairs_file(tmp_path, records: list[dict]):
    import json

    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


PAIR = {"prompt": "What is 2 plus 3?", "chosen": "5.", "rejected": "6."}


def test_the_dry_run_counts_the_pairs_of_preference_records(tmp_path):
    """The full tier reads the pairs with data/preference's source (chat's would refuse them)."""
    from qwen3_trainium.parent.preflight import chat

    path = _pairs_file(tmp_path, [PAIR, {"chosen": "Hi there", "rejected": "Hi you"}, PAIR])
    notes: list[str] = []
    assert chat.check_chat(resolve(*DPO, f"data.dataset_path={path}"), notes) == []
    assert notes[0].startswith("preference data: 3 records: 3 pairs, "), notes


def test_a_bad_preference_record_is_refused_with_its_file_and_line(tmp_path):
    from qwen3_trainium.parent.preflight import chat

    path = _pairs_file(tmp_path, [PAIR, {"prompt": "p", "chosen": "same"}])
    problems = chat.check_chat(resolve(*DPO, f"data.dataset_path={path}"), [])
    assert [(p.key, p.value) for p in problems] == [("data.dataset_path", f"{path}:2")]
    assert "chosen and rejected" in problems[0].fix


def test_a_resume_whose_reference_table_is_missing_is_refused_before_launch(tmp_path):
    """A DCP step in the run directory: torchtitan would resume from it, with the trained weights."""
    from qwen3_trainium.parent.preflight import dpo_reference
    from qwen3_trainium.rank.dpo_reference_key import table_path

    run = resolve(*DPO, "checkpoint=resume")
    step = tmp_path / run.checkpoint.folder / "step-5"
    step.mkdir(parents=True)
    assert (
        dpo_reference.check_reference_on_resume(run, str(tmp_path)) == []
    )  # no .metadata: nothing to resume
    (step / ".metadata").write_bytes(b"")
    problems = dpo_reference.check_reference_on_resume(run, str(tmp_path))
    table = table_path(run, "train")
    assert [(p.key, p.value) for p in problems] == [("checkpoint.folder", str(step.parent))]
    assert "step 5" in problems[0].message and table in problems[0].fix
    os.makedirs(os.path.dirname(table), exist_ok=True)
    open(table, "wb").close()
    assert dpo_reference.check_reference_on_resume(run, str(tmp_path)) == []
    lora = resolve(*DPO, "checkpoint=resume", "peft=lora")  # adapters_off: no table to read
    assert dpo_reference.check_reference_on_resume(lora, str(tmp_path)) == []
