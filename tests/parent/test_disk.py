"""The disk check (``preflight/host.py``) charges what torchtitan writes: every parameter in float32
(frozen ones too) and AdamW's two float32 moments for the trainable ones only. With peft=lora the
base is frozen, so a checkpoint is about a third of a full fine-tune's. The expectations are
worked by hand from the byte counts and the tiny flavor's dimensions."""

from __future__ import annotations

import shutil

from conftest import resolve

from qwen3_trainium.parent import verdicts
from qwen3_trainium.parent.preflight import cache, host

INTERVALS = (
    "checkpoint=resume",
    "training.steps=100",
    "checkpoint.interval=10",
    "checkpoint.keep_latest_k=3",
)


def test_a_checkpoint_is_four_bytes_a_parameter_and_eight_more_a_trainable_one():
    run = resolve(*INTERVALS, "checkpoint.last_save_model_only=true")
    assert host.checkpoint_bytes(run, 1000, 10) == (4 * 1000 + 8 * 10, 3, 4 * 1000)
    assert host.checkpoint_bytes(run, 1000) == (12 * 1000, 3, 4 * 1000)  # no count given: all train


def test_a_lora_hf_export_is_the_float32_adapters_and_the_merged_model_only_when_asked():
    lora = ("peft=lora", "checkpoint=[hf_finetune,hf_export]", "checkpoint.initial_load_path=/base")
    adapters_only = resolve(*lora, "checkpoint.export_dtype=bfloat16")
    assert host.checkpoint_bytes(adapters_only, 1000, 10)[2] == 4 * 10
    merged = resolve(*lora, "checkpoint.export_dtype=bfloat16", "peft.merge_on_export=true")
    assert host.checkpoint_bytes(merged, 1000, 10)[2] == 4 * 10 + 2 * 990
    full = resolve("checkpoint=[hf_finetune,hf_export]", "checkpoint.initial_load_path=/base")
    assert host.checkpoint_bytes(full, 1000)[2] == 4 * 1000  # export_dtype float32


# The tiny flavor (dim 256, 4 layers, 4 heads and 2 KV heads of 64, SwiGLU 768, vocab 512, tied
# embeddings), LoRA rank 8 on q/k/v/o: torchtitan's fused wqkv (256 -> 512) and wo (256 -> 256).
TINY_BASE = 512 * 256 + 256 + 4 * (256 * 512 + 256 * 256 + 2 * 64 + 3 * 256 * 768 + 2 * 256)
TINY_ADAPTERS = 4 * ((8 * 256 + 512 * 8) + (8 * 256 + 256 * 8))


def test_the_full_preflight_hands_the_disk_check_the_trainable_count(monkeypatch, tmp_path):
    """A peft=lora run whose disk holds one LoRA checkpoint but not one charged at 12 bytes a
    parameter passes (with a warning: three of them do not fit)."""
    assert (TINY_BASE, TINY_ADAPTERS) == (3_279_616, 40_960)
    params = TINY_BASE + TINY_ADAPTERS
    one = 4 * params + 8 * TINY_ADAPTERS
    run = resolve("model=native", "smoke=on", "tracking=off", "peft=lora", *INTERVALS)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(host.shutil, "disk_usage", lambda path: usage._replace(free=one + 1))
    monkeypatch.setattr(
        cache, "_sources", lambda: []
    )  # not this test's subject; files may be edited meanwhile
    check = verdicts.Preflight(run, str(tmp_path), launching=True)
    assert check.problems() == []
    assert check.facts == {"params": params, "trainable": TINY_ADAPTERS}
    assert check.disk_notes and f"3 x {one / 2**30:.2f} GiB" in check.disk_notes[0]
    monkeypatch.setattr(host.shutil, "disk_usage", lambda path: usage._replace(free=one - 1))
    again = verdicts.Preflight(run, str(tmp_path), launching=True)
    assert again.cached and again.facts == check.facts  # the counts are remembered with the pass
    (problem,) = again.problems()  # only the disk is checked again
    assert problem.key == "checkpoint.folder" and f"needs {one / 2**30:.2f} GiB" in problem.message
