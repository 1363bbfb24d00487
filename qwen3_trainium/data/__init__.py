"""Data, run in the ranks and in pre-flight: the shipped assets (corpus, tokenizer, tiny HF Qwen3
and Qwen3-MoE, made deterministically by ``assets``) and the held-out validation split.
"""
