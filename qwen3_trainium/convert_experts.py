"""``python -m qwen3_trainium.convert_experts``: Convert a checkpoint step's MoE expert layout (fused <-> torchtitan).

The published command, kept at its path; the code lives in ``qwen3_trainium/models/convert_experts.py``.
"""

import sys

from qwen3_trainium.models.convert_experts import main

if __name__ == "__main__":
    sys.exit(main())
