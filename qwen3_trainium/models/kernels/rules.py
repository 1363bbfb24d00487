"""The kernels' shape rules, without torch: pre-flight checks them before any process starts,
and the kernels (rope.py, moe.py) raise the same ValueError at call time."""

from __future__ import annotations

PARTITION = 128  # SBUF partitions per NeuronCore
BLOCK_SIZES = (256, 512, 1024)  # what both NKI MoE kernels accept (forward: B % 256 == 0)


def num_blocks(num_tokens: int, top_k: int, num_experts: int, block_size: int) -> int:
    """Static upper bound on the blocks of one MoE layer (nki-library's ``get_n_blocks``): every
    expert may hold a partly filled block, so about ``(E - 1) x B`` of the ``N x B`` slots can be
    padding whatever the token count (Qwen3-30B-A3B, B 256: 32,512 slots)."""
    assignments = num_tokens * top_k
    return -(-(assignments - (num_experts - 1)) // block_size) + num_experts - 1


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
