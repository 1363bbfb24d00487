"""model=nki_moe: composition, the kernel switches, pre-launch errors, guarded imports, end to end."""

from __future__ import annotations

import sys

import pytest
from conftest import read_metrics, resolve, run_launch

from qwen3_trainium.parent import preflight
from qwen3_trainium.rank.titan import EXPERTS_OVERRIDE, SDPA_OVERRIDE, to_trainer_config

ROPE = "qwen3_trainium.models.overrides.nki.rope_hf"
MOE = "qwen3_trainium.models.overrides.nki.moe_experts"


def _keys(*overrides):
    return [p.key for p in preflight.check(resolve(*overrides), "/tmp", launching=False)]


def test_nki_moe_translates_to_native_moe_plus_kernel_overrides(tmp_path):
    run = resolve("model=nki_moe", "device=cpu", "smoke=on")
    assert run.model.flavor == "tiny_moe"
    cfg = to_trainer_config(run, str(tmp_path))
    assert cfg.override.imports == [
        SDPA_OVERRIDE,
        ROPE,
        (MOE, {"block_size": 256, "compute_dtype": "float32"}),  # auto: the parameters' dtype on CPU
    ]
    assert cfg.model_spec.flavor == "tiny_moe"
    assert preflight.check(run, str(tmp_path), launching=False) == []


def test_each_kernel_switches_off_on_its_own(tmp_path):
    only_moe = to_trainer_config(resolve("model=nki_moe", "model.kernels=[moe_experts]"), str(tmp_path))
    assert [e if isinstance(e, str) else e[0] for e in only_moe.override.imports] == [SDPA_OVERRIDE, MOE]
    only_rope = to_trainer_config(
        resolve("model=nki_moe", "model.kernels=[rope_hf]", "model.moe_block_size=512"), str(tmp_path)
    )
    assert only_rope.override.imports == [
        SDPA_OVERRIDE,
        EXPERTS_OVERRIDE,
        ROPE,
    ]  # torchtitan's experts, float32 on CPU
    assert _keys("model=nki_moe", "model.kernels=[rope_hf]", "training.seq_len=128") == ["training.seq_len"]
    assert _keys("model=nki_moe", "model.kernels=[moe_experts]", "training.seq_len=128") == []


@pytest.mark.parametrize(
    ("overrides", "dtype"),
    [
        (("device=neuron",), "bfloat16"),  # the NKI kernels' compute dtype
        (("device=cpu",), "float32"),  # the parameters' dtype: no emulated bfloat16 matmuls
        (("device=cpu", "training.mixed_precision_param=bfloat16"), "bfloat16"),
        (("device=neuron", "model.moe_compute_dtype=float32"), "float32"),  # chosen, kept
    ],
)
def test_moe_compute_dtype_auto_is_bfloat16_on_neuron_else_the_parameters_dtype(overrides, dtype):
    assert resolve("model=nki_moe", *overrides).model.moe_compute_dtype.value == dtype


def test_the_moe_blocks_and_their_padding_are_noted_and_a_larger_block_warned():
    from qwen3_trainium.parent.preflight.model import kernel_notes

    headline = ("model=nki_moe", "device=neuron", "model.flavor=30B-A3B", "training.seq_len=4096",
                "training.local_batch_size=1", "activation_checkpoint.mode=selective")  # fmt: skip
    note = kernel_notes(resolve(*headline))[0]
    # nki-library's bound: ceil((4096*8 - 127) / 256) + 127 = 255 blocks; 8 x 4096 routed tokens
    assert "255 of 256 = 65,280 slots for 32,768 routed tokens (50% padding)" in note
    assert "0.453 GiB per layer, one layer's at a time" in note and "WARNING" not in note
    larger = kernel_notes(resolve(*headline, "model.moe_block_size=512"))[0]
    assert "191 of 512 = 97,792 slots" in larger
    assert "WARNING model.moe_block_size=256 would pad less: 65,280 slots instead of 97,792" in larger
    assert "every layer's until its backward" in kernel_notes(resolve("model=nki_moe", "device=cpu"))[0]


def test_default_flavor_off_cpu_is_30b_a3b():
    assert resolve("model=nki_moe", "device=neuron").model.flavor == "30B-A3B"


def test_kernel_problems_before_launch():
    assert _keys("model=nki_moe", "model.kernels=[flash]") == ["model.kernels"]
    assert _keys("model=native", "model.kernels=[rope_hf]") == ["model.kernels"]
    assert _keys("model=nki_moe", "model.flavor=tiny") == ["model.flavor"]
    assert _keys("model=nki_moe", "model.moe_block_size=128") == ["model.moe_block_size"]
    assert _keys("model=nki_moe", "parallel=cpu2", "parallel.expert_parallel_degree=2") == [
        "parallel.expert_parallel_degree"
    ]
    # on Neuron the kernels' shape rules apply: tiny_moe's hidden size 256 is below moe_cte's 512
    assert _keys("model=nki_moe", "device=neuron", "model.flavor=tiny_moe") == ["model.flavor"]
    assert _keys("experiment=qwen3_30b_a3b_trn2_nki_moe_dp64") == []
    assert _keys("experiment=qwen3_30b_a3b_trn2_nki_moe") == []
    # 30B-A3B at batch 8 without activation checkpointing: 48 layers of padded blocks do not fit
    assert _keys("model=nki_moe", "device=neuron", "model.flavor=30B-A3B") == ["memory"]


def test_seq_len_rule_fails_before_launch_naming_256_and_512(tmp_path):
    proc = run_launch("model=nki_moe", "training.seq_len=300", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert "ValueError" in proc.stderr and "256 or 512" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout and not (tmp_path / "logs").exists()


def test_lnc1_halves_the_multiple():
    assert _keys("model=nki_moe", "device.lnc=1", "training.seq_len=384") == []


def test_override_conflict_is_caught_in_the_parent_naming_both(tmp_path):
    other = "tests.support.conflicting_override.other_rope"
    proc = run_launch("model=nki_moe", f"override.imports=[{other}]", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2
    assert f"'{ROPE}' and '{other}' both claim node" in proc.stderr
    # torchtitan applies the overrides: checked while the ranks import torch, which then stop
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "the ranks stopped before touching a device" in proc.stderr
    assert "Training starts" not in proc.stdout and not (tmp_path / "metrics.jsonl").exists()


def test_dry_run_shows_the_override_imports(tmp_path):
    proc = run_launch("model=nki_moe", "dry_run=true", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    section = proc.stdout.split("# override.imports")[1].split("# torchrun command")[0]
    assert ROPE in section and MOE in section and "'block_size': 256" in section


def test_pypi_placeholders_do_not_break_anything(monkeypatch):
    """PyPI's nki / torch-neuronx raise ImportError on import; the kernels fall back cleanly."""
    from qwen3_trainium.models.kernels import neuron

    class Placeholder:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("nki", "nkilib", "torch_neuronx"):
                raise ImportError("WRONG PACKAGE: this is a placeholder")
            return None

    monkeypatch.setattr(sys, "meta_path", [Placeholder(), *sys.meta_path])
    for name in ("nki", "nkilib", "torch_neuronx"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    neuron.runtime_error.cache_clear()
    try:
        assert neuron.nki_runtime() is False and "WRONG PACKAGE" in neuron.runtime_error()
        from qwen3_trainium.config import devices

        assert devices.detect_device_type() == "cpu"
    finally:
        neuron.runtime_error.cache_clear()


@pytest.mark.slow
def test_nki_moe_smoke_trains_and_step_one_matches_native(tmp_path):
    common = ["smoke=on", "tracking=off"]
    runs = {"nki_moe": tmp_path / "nki", "native": tmp_path / "native"}
    # float32 on both sides (CPU): the blockwise experts by default (moe_compute_dtype auto),
    # torchtitan's via param_dtype_experts; the same seed gives the same weights in both layouts
    for path, flavor in (("nki_moe", []), ("native", ["model.flavor=tiny_moe"])):
        proc = run_launch(f"model={path}", *flavor, *common, f"hydra.run.dir={runs[path]}")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {k: read_metrics(d) for k, d in runs.items()}
    assert [r["step"] for r in rows["nki_moe"]] == list(range(1, 11))
    assert rows["nki_moe"][-1]["loss"] < rows["nki_moe"][0]["loss"]
    first = {k: v[0]["loss"] for k, v in rows.items()}
    print(f"step-1 loss nki_moe {first['nki_moe']:.8f} native {first['native']:.8f}")
    assert abs(first["nki_moe"] - first["native"]) <= 1e-5
