"""The kernels' shape rules, without torch: pre-flight checks them before any process starts,
and the kernels (rope.py, moe.py) raise the same ValueError at call time."""

from __future__ import annotations

PARTITION = 128  # SBUF partitions per NeuronCore
BLOCK_SIZES = (256, 512, 1024)  # what both NKI MoE kernels accept (forward: B % 256 == 0)


def seq_multiple(lnc: int) -> int:
    return PARTITION * lnc


def check_seq_len(seq_len: int, lnc: int) -> None:
    """ValueError unless ``seq_len`` is a multiple of 128 * LNC (the kernel only asserts)."""
    multiple = seq_multiple(lnc)
    if seq_len % multiple == 0 and seq_len > 0:
        return
    lower = seq_len // multiple * multiple
    nearest = [n for n in (lower, lower + multiple) if n > 0]
    raise ValueError(
        f"rope_hf needs training.seq_len to be a multiple of 128 x LNC = {multiple} "
        f"(LNC={lnc}); got {seq_len}. Nearest valid: {' or '.join(map(str, nearest))}."
    )
