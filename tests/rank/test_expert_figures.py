"""The ``moe/*`` figures and the ``expert_load.json`` record (rank/expert_figures.py) on hand-made
tables of (layer, expert) counts."""

from __future__ import annotations

import json
import math

import pytest
import torch

from qwen3_trainium.rank import expert_figures as ef


def test_even_load_is_one_over_mean_and_entropy_one():
    out = ef.figures(torch.full((3, 4), 5.0))
    assert out == {
        ef.MAX_OVER_MEAN: 1.0,
        ef.ENTROPY: pytest.approx(1.0),
        ef.ZERO_TOKENS: 0.0,
        ef.ASSIGNMENTS: 20.0,
    }


def test_the_worst_layer_and_the_mean_entropy():
    counts = torch.tensor([[8.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    out = ef.figures(counts)
    assert out[ef.MAX_OVER_MEAN] == 4.0  # layer 0: 8 against a mean of 2
    assert out[ef.ENTROPY] == pytest.approx((0.0 + 1.0) / 2)
    assert out[ef.ZERO_TOKENS] == 3.0 and out[ef.ASSIGNMENTS] == 8.0
    half = ef.figures(torch.tensor([[1.0, 1.0, 0.0, 0.0]]))
    assert half[ef.ENTROPY] == pytest.approx(math.log(2) / math.log(4))  # two of four, evenly


def test_a_window_without_tokens_has_no_shape_figures():
    out = ef.figures(torch.zeros(2, 4))
    assert out == {ef.ZERO_TOKENS: 8.0, ef.ASSIGNMENTS: 0.0}


def test_record_is_written_whole(tmp_path):
    data = ef.record(torch.tensor([[3.0, 1.0], [0.0, 4.0]], dtype=torch.float64), [0, 2], 1, 1, 5)
    path = ef.write_record(str(tmp_path), data)
    back = json.loads(open(path).read())
    assert back["tokens_per_expert"] == [[3, 1], [0, 4]] and back["layers"] == [0, 2]
    assert (back["first_step"], back["step"], back["top_k"], back["num_experts"]) == (1, 5, 1, 2)
