"""``memory=trace`` of objective=dpo traces the DPO step (``rank/dpo.py``), not torchtitan's
cross-entropy body: on the tiny Qwen3 (``config/flavors.py`` TINY_DIMS: vocab 512, dim 256, 4
layers, q 4 x 64, k and v 2 x 64, MLP 768), the traced step's FLOPs differ from SFT's by exactly
what the DPO step adds, counted here by hand:

- pass 1, the lm_head over every position without a gradient: 2 x tokens x dim x vocab;
- with ``reference=adapters_off`` (LoRA), the reference forward besides: every matmul of the decoder
  and its adapters once (2 x tokens x weights), then its own pass 1 over the lm_head.

The roofline (``memory/roofline.py``) counts matmul FLOPs; the document-masked attention adds the
same to both sides. And LoRA-DPO keeps no reference copy: its traced parameters are LoRA-SFT's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import resolve

from qwen3_trainium.parent import compose

TOKENS = 256  # smoke=on: batch 1 x training.seq_len 256
DIM, VOCAB, LAYERS, RANK = 256, 512, 4, 8
LM_HEAD = 2 * TOKENS * DIM * VOCAB
# per layer: wq 256x256, wk and wv 256x128, wo 256x256, w1 and w3 256x768, w2 768x256
LAYER_WEIGHTS = 256 * 256 + 2 * 256 * 128 + 256 * 256 + 3 * 256 * 768
# peft=lora rank 8 on q, k, v (one fused wqkv: A 256x8, B 8x512) and o (A 256x8, B 8x256)
LAYER_ADAPTERS = 256 * RANK + RANK * 512 + 256 * RANK + RANK * 256
BASE = ("model=native", "device=cpu", "smoke=on", "tracking=off")


def _trace(tmp_path, name: str, *overrides: str) -> dict:
    """The trace of a helper process (as pre-flight's), with roofline ceilings for the FLOPs."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    path = compose.save(resolve(*BASE, *overrides), str(run_dir), "trace.yaml")
    command = [
        sys.executable,
        "-m",
        "qwen3_trainium.memory.trace",
        str(run_dir),
        path,
        "1e12",
        "1e11",
        "1e11",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.heavy  # two traces, 15 to 25 s (the LoRA test below, in make test, traces the same body)
def test_full_dpo_trace_adds_exactly_the_no_grad_lm_head_pass(tmp_path):
    sft = _trace(tmp_path, "sft", "data=chat")
    dpo = _trace(tmp_path, "dpo", "objective=dpo")  # reference=precompute: a table lookup
    assert dpo["step_flops"] - sft["step_flops"] == LM_HEAD
    assert dpo["parts"]["parameters (+ gathered)"] == sft["parts"]["parameters (+ gathered)"]
    assert dpo["parts"]["optimizer states"] == sft["parts"]["optimizer states"]


@pytest.mark.slow  # two traces, about 15 s
def test_lora_dpo_trace_runs_the_adapters_off_reference_and_keeps_no_copy(tmp_path):
    sft = _trace(tmp_path, "sft", "data=chat", "peft=lora")
    dpo = _trace(tmp_path, "dpo", "objective=dpo", "peft=lora")  # reference=auto: adapters_off
    reference_forward = 2 * TOKENS * LAYERS * (LAYER_WEIGHTS + LAYER_ADAPTERS) + LM_HEAD
    assert dpo["step_flops"] - sft["step_flops"] == reference_forward + LM_HEAD
    assert dpo["parts"]["parameters (+ gathered)"] == sft["parts"]["parameters (+ gathered)"]  # no copy
