"""``python -m qwen3_trainium.make_assets``: The assets the default job runs on (corpus, tokenizer,
tiny HF Qwen3s, objective=dpo's preference pairs).

The published command, kept at its path; the code lives in ``qwen3_trainium/data/assets.py`` and,
for the preference pairs (made from the chat corpus's templates, so it imports ``assets``, not the
other way round), ``qwen3_trainium/data/preference/corpus.py``.
"""

import sys

from qwen3_trainium.data.assets import PREFERENCE_DIR, cli
from qwen3_trainium.data.preference.corpus import write_preference_corpus


def main() -> None:
    cli()
    if sys.argv[1:2] != ["--hf-model"]:  # assets' own subcommand: one tiny HF model, nothing else
        write_preference_corpus()
        print(f"wrote the preference pairs to {PREFERENCE_DIR}")


if __name__ == "__main__":
    main()
