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


# Both traces in one helper process (one torch import): each on torchtitan's fake process group,
# torn down before the next (memory/trace.py ``_fake_world``).
TRACES = """
import dataclasses, json, sys
import torch.distributed as dist
from qwen3_trainium.config import devices, runconfig
from qwen3_trainium.memory import trace
out = []
for run_dir, path in zip(sys.argv[1::2], sys.argv[2::2]):
    run = runconfig.load(path)
    out.append(dataclasses.asdict(trace.trace(run, run_dir, devices.Roofline(1e12, 1e11, 1e11))))
    dist.destroy_process_group()
print(json.dumps(out))
"""


def _traces(tmp_path, **runs: tuple[str, ...]) -> dict[str, dict]:
    """Each run's trace (as pre-flight's helper process makes it), with roofline ceilings for the FLOPs."""
    args = []
    for name, overrides in runs.items():
        run_dir = tmp_path / name
        run_dir.mkdir()
        args += [str(run_dir), compose.save(resolve(*BASE, *overrides), str(run_dir), "trace.yaml")]
    done = subprocess.run([sys.executable, "-c", TRACES, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(zip(runs, json.loads(done.stdout.strip().splitlines()[-1]), strict=True))


@pytest.mark.heavy  # two traces, about 12 s
def test_full_dpo_trace_adds_exactly_the_no_grad_lm_head_pass(tmp_path):
    # reference=precompute: a table lookup
    traced = _traces(tmp_path, sft=("data=chat",), dpo=("objective=dpo",))
    sft, dpo = traced["sft"], traced["dpo"]
    assert dpo["step_flops"] - sft["step_flops"] == LM_HEAD
    assert dpo["parts"]["parameters (+ gathered)"] == sft["parts"]["parameters (+ gathered)"]
    assert dpo["parts"]["optimizer states"] == sft["parts"]["optimizer states"]


@pytest.mark.heavy  # two traces in one process, about 14 s (make test near 20 minutes)
def test_lora_dpo_trace_runs_the_adapters_off_reference_and_keeps_no_copy(tmp_path):
    # reference=auto: adapters_off
    traced = _traces(tmp_path, sft=("data=chat", "peft=lora"), dpo=("objective=dpo", "peft=lora"))
    sft, dpo = traced["sft"], traced["dpo"]
    reference_forward = 2 * TOKENS * LAYERS * (LAYER_WEIGHTS + LAYER_ADAPTERS) + LM_HEAD
    assert dpo["step_flops"] - sft["step_flops"] == reference_forward + LM_HEAD
    assert dpo["parts"]["parameters (+ gathered)"] == sft["parts"]["parameters (+ gathered)"]  # no copy
