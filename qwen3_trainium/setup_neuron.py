"""``python -m qwen3_trainium.setup_neuron``: Install into a Trainium host's Neuron venv.

The published command, kept at its path; the code lives in ``qwen3_trainium/parent/setup_neuron.py``.
"""

import sys

from qwen3_trainium.parent.setup_neuron import main

if __name__ == "__main__":
    sys.exit(main())
