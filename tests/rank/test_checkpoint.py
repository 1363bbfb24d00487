"""The checkpoint group: HF fine-tune (every key checked), HF export round trip, kill-and-resume."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, launch_killed_after, read_metrics, resolve, run_launch
from safetensors.torch import load_file, save_file

from qwen3_trainium.data import assets
from qwen3_trainium.parent import preflight
from qwen3_trainium.rank.titan import to_trainer_config

TINY = str(assets.ensure_hf_model())


def _problems(*overrides, run_dir="/tmp", notes=None):
    return preflight.check(resolve(*overrides), str(run_dir), launching=False, notes=notes)


def test_groups_translate_to_torchtitan_fields(tmp_path):
    cfg = to_trainer_config(resolve("checkpoint=resume"), str(tmp_path)).checkpoint
    assert (cfg.enable, cfg.last_save_model_only, cfg.keep_latest_k, cfg.save_rng) == (True, False, 3, True)
    both = resolve("checkpoint=[hf_finetune,hf_export]", f"checkpoint.initial_load_path={TINY}")
    cfg = to_trainer_config(both, str(tmp_path)).checkpoint
    assert (cfg.initial_load_in_hf, cfg.initial_load_path, cfg.last_save_in_hf, cfg.export_dtype) == (
        True,
        TINY,
        True,
        "float32",
    )
    assert json.loads(cfg.hf_config_json)["hidden_size"] == 256  # the source model's config.json
    assert cfg.probe_path == str(tmp_path / "export_probe.pt")


def test_native_export_without_hf_source_writes_a_config_from_the_flavor(tmp_path):
    cfg = to_trainer_config(resolve("checkpoint=hf_export"), str(tmp_path)).checkpoint
    made = json.loads(cfg.hf_config_json)
    source = json.loads(Path(TINY, "config.json").read_text())
    for key in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "tie_word_embeddings",
    ):
        assert made[key] == source[key], key


def test_hf_finetune_needs_a_path_and_a_complete_directory(tmp_path):
    assert [p.key for p in _problems("checkpoint=hf_finetune")] == ["checkpoint.initial_load_path"]
    assert (
        "does not exist"
        in _problems("checkpoint=hf_finetune", f"checkpoint.initial_load_path={tmp_path}/x")[0].message
    )
    messages = [
        p.message for p in _problems("checkpoint=hf_finetune", f"checkpoint.initial_load_path={tmp_path}")
    ]
    assert any("no config.json" in m for m in messages) and any("no *.safetensors" in m for m in messages)


def test_all_keys_matching_is_said_in_one_line():
    notes: list[str] = []
    assert _problems("checkpoint=hf_finetune", f"checkpoint.initial_load_path={TINY}", notes=notes) == []
    assert [n for n in notes if n.startswith("HF weights")] == [
        f"HF weights {TINY}: all 46 tensors match the model (0 missing, 0 unexpected)"
    ]


def test_missing_and_unexpected_keys_fail_unless_partial_load_is_allowed(tmp_path):
    partial = tmp_path / "partial"
    shutil.copytree(TINY, partial)
    weights = load_file(partial / "model.safetensors")
    weights.pop("model.layers.3.mlp.down_proj.weight")
    weights["model.layers.9.extra.weight"] = weights["model.norm.weight"].clone()
    save_file(weights, partial / "model.safetensors")
    problems = _problems("checkpoint=hf_finetune", f"checkpoint.initial_load_path={partial}")
    assert [p.key for p in problems] == ["checkpoint.initial_load_path"]
    assert "1 missing (model.layers.3.mlp.down_proj.weight)" in problems[0].message
    assert "1 unexpected (model.layers.9.extra.weight)" in problems[0].message
    notes: list[str] = []
    assert (
        _problems(
            "checkpoint=hf_finetune",
            f"checkpoint.initial_load_path={partial}",
            "checkpoint.allow_partial_load=true",
            notes=notes,
        )
        == []
    )
    warning = [n for n in notes if n.startswith("WARNING partial HF load allowed")]
    assert len(warning) == 1 and "1 missing" in warning[0]


def test_flavor_dims_against_config_json():
    problems = _problems(
        "model.flavor=debugmodel", "checkpoint=hf_finetune", f"checkpoint.initial_load_path={TINY}"
    )
    assert [p.key for p in problems] == ["model.flavor"]
    assert "vocab_size: flavor 2048, config.json 512" in problems[0].message


def _flag_lines(stdout: str, marker: str) -> list[str]:
    return [line for line in stdout.splitlines() if marker in line]


@pytest.mark.slow
@pytest.mark.heavy
def test_finetune_and_export_round_trip_native_and_hf(tmp_path):
    from transformers import AutoModelForCausalLM

    for path, extra in (("native", [f"checkpoint.initial_load_path={TINY}"]), ("hf", [])):
        run_dir = tmp_path / path
        groups = "checkpoint=[hf_finetune,hf_export]" if path == "native" else "checkpoint=hf_export"
        proc = run_launch(
            f"model={path}", groups, *extra, "smoke=on", "tracking=off", f"hydra.run.dir={run_dir}"
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert _flag_lines(proc.stdout, "all 46 tensors match the model (0 missing, 0 unexpected)")
        report = json.loads((run_dir / "export_check.json").read_text())
        print(f"{path}: export round trip max abs logit diff {report['max_abs_logit_diff']:.3e}")
        assert report["max_abs_logit_diff"] <= 1e-5
        export = Path(report["export_dir"])
        assert {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"} <= {
            p.name for p in export.iterdir()
        }
        assert not (export / "sharded").exists()
        AutoModelForCausalLM.from_pretrained(export)  # loads on its own (in this process too)
        # the same command again: the folder's last step is an HF export, refused before launch
        again = run_launch(
            f"model={path}", groups, *extra, "smoke=on", "tracking=off", f"hydra.run.dir={run_dir}"
        )
        assert again.returncode == 2 and "HF export of a finished run" in again.stderr


RESUME = [
    "checkpoint=resume",
    "checkpoint.interval=10",
    "training.steps=40",
    "training.local_batch_size=1",
    "tracking=off",
]


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.parametrize(  # nki_moe: the experts in the fused layout; native MoE: on torch._grouped_mm
    "model", ["native", "nki_moe", "native model.flavor=tiny_moe"]
)
def test_kill_and_resume_ends_where_an_uninterrupted_run_ends(model, tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    resume = [f"model={model.split()[0]}", *model.split()[1:], *RESUME]
    proc = run_launch(*resume, f"hydra.run.dir={straight}")
    assert proc.returncode == 0, proc.stderr[-3000:]

    launch_killed_after(killed / "checkpoint" / "step-10", *resume, f"hydra.run.dir={killed}")
    rows_before = len(read_metrics(killed))
    assert 10 <= rows_before < 40, "killed before the end, after the checkpoint"

    again = run_launch(*resume, f"hydra.run.dir={killed}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert _flag_lines(again.stdout, "resuming from")
    rows = read_metrics(killed)
    assert len(rows) > 40 - 10 + rows_before - 1  # appended, not truncated
    final = {d.name: read_metrics(d)[-1] for d in (straight, killed)}
    assert final["killed"]["step"] == final["straight"]["step"] == 40
    diff = abs(final["killed"]["loss"] - final["straight"]["loss"])
    print(
        f"resume: final loss straight {final['straight']['loss']:.8f} killed+resumed {final['killed']['loss']:.8f} diff {diff:.2e}"
    )
    assert diff <= 1e-5

    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(str(killed / "checkpoint" / "step-40")).read_metadata().state_dict_metadata
    assert any(k.startswith("rng") for k in saved)  # every rank's RNG streams are in the checkpoint
    # the same folder cannot be resumed by another model (nki_moe: the same model, experts in
    # torchtitan's layout: the message names the conversion)
    other = {
        "native": ["model=native", "model.flavor=tiny_moe"],
        "nki_moe": ["model=nki_moe", "model.kernels=[rope_hf]"],
    }.get(model, ["model=native", "model.flavor=tiny"])
    problems = preflight.check(resolve(*other, "checkpoint=resume"), str(killed), launching=False)
    assert [p.key for p in problems] == ["checkpoint.folder"]
    if model.startswith("native"):
        assert "holds a different model" in problems[0].message
    else:
        assert "qwen3_trainium.convert_experts" in problems[0].fix and "--to torchtitan" in problems[0].fix


@pytest.mark.slow
@pytest.mark.heavy
def test_a_checkpoint_in_torchtitans_expert_layout_is_refused_then_converted_and_resumed(tmp_path):
    """model=nki_moe wrote w1_EFD / w2_EDF / w3_EFD before its experts were stored fused (the layout
    model.kernels=[rope_hf] writes today): pre-flight refuses it naming the conversion; converted,
    the same command resumes it and its losses follow the run that never stopped."""
    common = ["model=nki_moe", "checkpoint=resume", "checkpoint.interval=2", "training.local_batch_size=1",
              "tracking=off"]  # fmt: skip
    titan_layout = [*common, "model.kernels=[rope_hf]"]
    straight, run_dir = tmp_path / "straight", tmp_path / "run"
    assert run_launch(*titan_layout, "training.steps=4", f"hydra.run.dir={straight}").returncode == 0
    assert run_launch(*titan_layout, "training.steps=2", f"hydra.run.dir={run_dir}").returncode == 0
    step = run_dir / "checkpoint" / "step-2"
    before = sorted(p.name for p in step.iterdir())

    refused = run_launch(*common, "training.steps=4", f"hydra.run.dir={run_dir}")
    assert refused.returncode == 2 and "Traceback" not in refused.stdout + refused.stderr
    assert f"python -m qwen3_trainium.convert_experts {step} --to fused" in refused.stderr
    assert sorted(p.name for p in step.iterdir()) == before  # nothing written

    converted = subprocess.run([sys.executable, "-m", "qwen3_trainium.convert_experts", str(step)],
                               cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert converted.returncode == 0, converted.stderr
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoint.torchtitan" / "step-2").iterdir()) == before
    again = run_launch(*common, "training.steps=4", f"hydra.run.dir={run_dir}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert _flag_lines(again.stdout, "resuming from")
    losses = {d.name: [row["loss"] for row in read_metrics(d)] for d in (straight, run_dir)}
    print(f"torchtitan layout straight {losses['straight']}, converted and resumed {losses['run']}")
    assert len(losses["run"]) == 4  # two before the conversion, two after
    for a, b in zip(losses["straight"], losses["run"], strict=True):  # grouped GEMM vs blocks: 1e-6
        assert abs(a - b) <= 1e-5


class _Scaled(torch.nn.Module):
    """A stand-in model part: logits are the one-hot next id scaled by a weight bfloat16 cannot
    hold (1 + 2**-10 rounds to 1.0)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([1 + 2**-10]))

    def forward(self, tokens, positions):
        return torch.nn.functional.one_hot((tokens + 1) % 512, 512).float() * self.weight


def test_the_probe_holds_float32_logits_of_the_weights_the_export_holds_and_where_they_ran(
    tmp_path, monkeypatch
):
    from qwen3_trainium.rank import probe

    monkeypatch.setenv("NEURON_CC_FLAGS", "--auto-cast=none")
    model = _Scaled()
    probe.save_probe(model, str(assets.TOKENIZER_DIR), str(tmp_path / "probe.pt"), "bfloat16")
    saved = torch.load(tmp_path / "probe.pt")
    tokens = probe.probe_tokens(str(assets.TOKENIZER_DIR))
    assert torch.equal(saved["tokens"], tokens) and saved["logits"].dtype == torch.float32
    assert saved["logits"].max().item() == 1.0  # the bfloat16 export's weight, not the trained one
    assert (saved["device"], saved["neuron_cc_flags"]) == ("cpu", "--auto-cast=none")
    assert model.weight.item() == 1 + 2**-10  # the trained value is back
