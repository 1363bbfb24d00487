"""Preference pairs for ``objective=dpo``: TRL's record formats, TRL's completion masks, pairs
packed whole into rows (docs/dpo.md).

What a training or held-out row carries besides ``input``, ``positions`` and the labels (the
contract between the loader, ``data/preference/loader.py``, and the trainer, ``rank/dpo.py``):
"""

# int64 [seq_len]: at each label position, the side it belongs to: 2j for the chosen response of
# the row's j-th pair, 2j + 1 for its rejected response, -1 elsewhere (prompts, padding). Exactly
# the positions whose label is not -100.
SEGMENT_KEY = "dpo_segment"
# int64 [max_pairs(seq_len)]: the row's j-th pair's index in its split's record list (the
# reference table's key), -1 past the row's last pair.
PAIR_KEY = "dpo_pair"


def max_pairs(seq_len: int) -> int:
    """Pairs a row of ``seq_len`` positions can hold: every side takes at least one input
    position (its first token predicts its second), so a pair takes at least two."""
    return seq_len // 2
