"""``python -m qwen3_trainium.make_assets``: The assets the default job runs on (corpus, tokenizer, tiny HF Qwen3s).

The published command, kept at its path; the code lives in ``qwen3_trainium/data/assets.py``.
"""

from qwen3_trainium.data.assets import cli

if __name__ == "__main__":
    cli()
