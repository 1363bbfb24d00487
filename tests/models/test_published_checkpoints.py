"""Published Qwen3 checkpoints: config.json read the way Transformers reads it and held against the
flavors, Hub-layout weights checked key by key, and a fine-tune on the model's own tokenizer."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import ROOT, read_metrics, resolve, run_launch

from qwen3_trainium.config import runconfig
from qwen3_trainium.data import assets
from qwen3_trainium.models import hf_config, hf_export
from qwen3_trainium.parent import preflight
from qwen3_trainium.rank import checkpoint
from qwen3_trainium.shared import contract
from tests.support import hub_layout
from tests.support.published_configs import PUBLISHED

TINY = assets.ensure_hf_model()


@pytest.fixture(scope="module")
def other_tokenizer_model(tmp_path_factory):
    """The embedded tiny Qwen3's weights with a tokenizer of its own (trained on other text)."""
    model_dir = tmp_path_factory.mktemp("qwen3-tiny-own-tokenizer")
    shutil.copytree(TINY, model_dir, dirs_exist_ok=True)
    docs = [" ".join(reversed(doc.split())).upper() for doc in assets.make_corpus(2000, seed=7)]
    assets.train_tokenizer(docs, model_dir)
    return model_dir


def _encode(tokenizer_dir, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).encode(text).ids


def test_a_finetune_takes_the_checkpoints_tokenizer_and_says_so(other_tokenizer_model, tmp_path):
    run = resolve("checkpoint=hf_finetune", f"checkpoint.initial_load_path={other_tokenizer_model}")
    assert run.data.hf_assets_path == str(other_tokenizer_model)
    notes: list[str] = []
    assert preflight.check(run, str(tmp_path), launching=False, notes=notes) == []
    assert f"tokenizer: {other_tokenizer_model} (the checkpoint's own)" in notes


def test_another_tokenizer_is_refused_unless_deliberate(other_tokenizer_model, tmp_path):
    shipped = str(runconfig.ASSETS_DIR / "tokenizer")
    args = ["checkpoint=hf_finetune", f"checkpoint.initial_load_path={other_tokenizer_model}"]
    explicit = [*args, f"data.hf_assets_path={shipped}"]
    problems = preflight.check(resolve(*explicit), str(tmp_path), launching=False)
    assert [p.key for p in problems] == ["data.hf_assets_path"]
    assert f"not the tokenizer of {other_tokenizer_model}" in problems[0].message
    assert "data.allow_other_tokenizer=true" in problems[0].fix
    notes: list[str] = []
    run = resolve(*explicit, "data.allow_other_tokenizer=true")
    assert run.data.hf_assets_path == shipped
    assert preflight.check(run, str(tmp_path), launching=False, notes=notes) == []
    assert any(n.startswith("WARNING data.allow_other_tokenizer=true") for n in notes)


@pytest.mark.slow
def test_finetune_tokenizes_with_the_directorys_tokenizer_and_exports_it(other_tokenizer_model, tmp_path):
    proc = run_launch(
        "model=native", "checkpoint=[hf_finetune,hf_export]", f"checkpoint.initial_load_path={other_tokenizer_model}",
        "smoke=on", "training.steps=2", "tracking=off", f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"tokenizer: {other_tokenizer_model} (the checkpoint's own)" in proc.stdout
    # The ranks' own tokens: the probe batch the trained model was run on, tokenized in the rank.
    probe = torch.load(tmp_path / contract.PROBE_NAME)["tokens"][0].tolist()
    assert probe == _encode(other_tokenizer_model, checkpoint.PROBE_TEXT)
    assert probe != _encode(runconfig.ASSETS_DIR / "tokenizer", checkpoint.PROBE_TEXT)
    export = Path(json.loads((tmp_path / "export_check.json").read_text())["export_dir"])
    assert (export / "tokenizer.json").read_text() == (other_tokenizer_model / "tokenizer.json").read_text()


# The published config.json files against the flavors --------------------------------------------


def _config_dir(tmp_path, config: dict):
    (tmp_path / "config.json").write_text(json.dumps(config, indent=2))
    return hf_config.load(str(tmp_path))


def _flavor(name: str) -> dict:
    from qwen3_trainium.config import flavors

    return hf_config.flavor_fields(flavors.model_spec(name, "flex").model)


@pytest.mark.parametrize("model", list(PUBLISHED))
def test_each_published_config_passes_against_its_own_flavor(model, tmp_path):
    _, sha256, flavor, config = PUBLISHED[model]
    assert hashlib.sha256(json.dumps(config, indent=2).encode()).hexdigest() == sha256  # the Hub's bytes
    cfg = _config_dir(tmp_path, config)
    assert hf_config.unsupported(cfg) == []
    assert hf_config.differences(_flavor(flavor), hf_config.published_fields(cfg)) == []


@pytest.mark.parametrize(
    ("model", "flavor", "key"),
    [
        ("Qwen/Qwen3-8B", "4B", "hidden_size"),
        ("Qwen/Qwen3-0.6B", "1.7B", "hidden_size"),
        ("Qwen/Qwen3-14B", "32B", "num_hidden_layers"),
        ("Qwen/Qwen3-4B-Instruct-2507", "4B", "rope_theta"),
        ("Qwen/Qwen3-235B-A22B", "235B-A22B-2507", "rope_theta"),  # torchtitan's own 235B flavor
        ("Qwen/Qwen3-30B-A3B", "235B-A22B", "moe_intermediate_size"),
        ("Qwen/Qwen3-30B-A3B", "8B", "num_experts"),
        ("Qwen/Qwen3-8B", "30B-A3B", "intermediate_size"),
        ("Qwen/Qwen3-4B", "8B", "tie_word_embeddings"),
    ],
)
def test_mismatched_pairs_fail_naming_the_key(model, flavor, key, tmp_path):
    cfg = _config_dir(tmp_path, PUBLISHED[model][3])
    diffs = hf_config.differences(_flavor(flavor), hf_config.published_fields(cfg))
    assert any(d.startswith(f"{key}: ") for d in diffs), diffs


def test_transformers_5_spelling_of_the_expert_count_is_read(tmp_path):
    config = dict(PUBLISHED["Qwen/Qwen3-30B-A3B"][3])
    config["num_local_experts"] = config.pop("num_experts")  # what Transformers 5.24 writes
    cfg = _config_dir(tmp_path, config)
    assert hf_config.differences(_flavor("30B-A3B"), hf_config.published_fields(cfg)) == []


@pytest.mark.parametrize(("field", "value"), [("mlp_only_layers", [0, 1]), ("decoder_sparse_step", 2)])
def test_an_moe_layout_with_dense_layers_is_refused_naming_the_field(field, value, tmp_path):
    model_dir = tmp_path / "moe"
    config = {**PUBLISHED["Qwen/Qwen3-30B-A3B"][3], field: value}
    hub_layout.write_hub_model(model_dir, config, shards=16, tokenizer_dir=runconfig.ASSETS_DIR / "tokenizer")
    run = resolve("model=nki_moe", "model.flavor=30B-A3B", "device=neuron", "parallel=trn2_dp64",
                  "checkpoint=hf_finetune", f"checkpoint.initial_load_path={model_dir}")  # fmt: skip
    problems = preflight.check(run, str(tmp_path), launching=False)
    assert any(
        p.key.endswith(f"config.json: {field}") and "dense layers mixed in" in p.message for p in problems
    )


# Hub-layout weights, key by key ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "shards", "overrides", "tensors"),
    [
        # the 2.33-era job (model=nki_moe, trn2_dp64) and the headline (model=native on torch._grouped_mm, TP4 x FSDP16)
        ("Qwen/Qwen3-30B-A3B", 16, ["experiment=qwen3_30b_a3b_trn2_nki_moe_dp64"], 18867),
        ("Qwen/Qwen3-30B-A3B", 16, ["experiment=qwen3_30b_a3b_trn2"], 18867),
        (
            "Qwen/Qwen3-8B",
            5,
            ["model=native", "model.flavor=8B", "device=neuron", "parallel=trn2_tp4_fsdp16"],
            399,
        ),
        (
            "Qwen/Qwen3-0.6B",
            1,
            ["model=native", "model.flavor=0.6B", "device=neuron", "parallel=trn2_dp64"],
            310,
        ),
    ],
)
def test_a_hub_layout_checkpoint_passes_preflight_with_every_tensor_matched(
    model, shards, overrides, tensors, dry_run, tmp_path
):
    model_dir = tmp_path / model.split("/")[1]
    hub_layout.write_hub_model(model_dir, PUBLISHED[model][3], shards, runconfig.ASSETS_DIR / "tokenizer")
    result, out, err = dry_run(ROOT, tmp_path / "run", *overrides, "checkpoint=hf_finetune",
                               f"checkpoint.initial_load_path={model_dir}")  # fmt: skip
    assert result == ("dry_run", 0), err
    assert f"all {tensors} tensors match the model (0 missing, 0 unexpected)" in out


# Qwen3-MoE in and out, end to end ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "extra"),
    [  # defaults: float32 on CPU; the native case in make test-heavy (the same round trip, 27 s)
        ("nki_moe", []),
        pytest.param("native", ["model.flavor=tiny_moe"], marks=pytest.mark.heavy),
    ],
)
def test_moe_finetune_from_transformers_and_export_round_trip(path, extra, tmp_path):
    """From a Qwen3MoeForCausalLM saved by Transformers: every key matched, it trains, and its export
    reloads with AutoModelForCausalLM in a fresh process with the same logits (float32)."""
    source = assets.ensure_hf_moe_model()
    proc = run_launch(
        f"model={path}", *extra, "checkpoint=[hf_finetune,hf_export]", f"checkpoint.initial_load_path={source}",
        "smoke=on", "tracking=off", f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "all 135 tensors match the model (0 missing, 0 unexpected)" in proc.stdout
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(1, 11)) and rows[-1]["loss"] < rows[0]["loss"]
    report = json.loads((tmp_path / "export_check.json").read_text())
    print(f"{path}: MoE export round trip max abs logit diff {report['max_abs_logit_diff']:.3e}")
    assert report["max_abs_logit_diff"] <= 1e-5
    exported = hf_config.load(report["export_dir"])
    assert type(exported).__name__ == "Qwen3MoeConfig"
    assert hf_config.published_fields(exported) == hf_config.published_fields(hf_config.load(str(source)))


def test_model_hf_refuses_a_qwen3_moe_directory_and_names_the_path_that_trains_it(tmp_path):
    source = assets.ensure_hf_moe_model()
    problems = preflight.check(
        resolve("model=hf", f"model.hf_model={source}"), str(tmp_path), launching=False
    )
    assert [p.key for p in problems] == ["model.hf_model"]
    assert "per expert" in problems[0].message and "model=nki_moe model.flavor=tiny_moe" in problems[0].fix


# Exports that drop in where the source was --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.heavy  # 20-30 s: moved out of make test to keep it near 20 minutes
def test_a_bf16_export_in_small_shards_loads_in_place_of_its_source(tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    proc = run_launch(
        "model=native", "checkpoint=[hf_finetune,hf_export]", f"checkpoint.initial_load_path={TINY}",
        "checkpoint.export_dtype=bfloat16", "checkpoint.hf_max_shard_size=2MB", "smoke=on", "training.steps=2",
        "tracking=off", f"hydra.run.dir={tmp_path}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "export_check.json").read_text())
    print(
        f"bf16 sharded export: max abs logit diff {report['max_abs_logit_diff']:.3e} (weights rounded to bf16 both sides)"
    )
    assert report["max_abs_logit_diff"] <= 1e-5
    export = Path(report["export_dir"])
    index = json.loads((export / "model.safetensors.index.json").read_text())
    shards = sorted(export.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and set(index["weight_map"].values()) == {s.name for s in shards}
    assert all(s.stat().st_size <= 2_000_000 + 100_000 for s in shards)  # the limit, plus the header
    with safe_open(str(shards[0]), "pt") as f:
        assert f.get_tensor(next(iter(f.keys()))).dtype == torch.bfloat16
    assert (export / "generation_config.json").read_text() == (TINY / "generation_config.json").read_text()
    # the source's config.json key for key, plus the Transformers 4.x RoPE form it lacks (models/hf_rope.py)
    source, exported = (
        json.loads((TINY / "config.json").read_text()),
        json.loads((export / "config.json").read_text()),
    )
    theta = source["rope_parameters"]["rope_theta"]
    assert exported == {**source, "rope_theta": theta, "rope_scaling": None}
    AutoModelForCausalLM.from_pretrained(export)


@pytest.mark.parametrize(
    ("text", "size"), [("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("2GiB", 2 * 2**30), ("123", 123)]
)
def test_shard_sizes_read_as_save_pretrained_reads_them(text, size):
    assert hf_export.parse_size(text) == size
