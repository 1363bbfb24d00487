"""A user's own RoPE override: claims the same nodes as qwen3_trainium's rope_hf (for tests)."""

from torchtitan.config import override
from torchtitan.models.common.rope import CosSinRoPE


@override(target=CosSinRoPE.Config, exact=True, description="test: another RoPE")
def other_rope(cfg: CosSinRoPE.Config) -> CosSinRoPE.Config:
    return cfg
