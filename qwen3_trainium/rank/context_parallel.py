"""The trainer's half of context parallel with our SDPA (``models/context_parallel.py``): the
attention node swapped before torchtitan builds the model, the mask built after it shards a batch.

The swap happens in ``__init__`` before torchtitan's: ``Trainer.__init__`` calls the model
config's ``update_from_config`` (which refuses CP for a ``VarlenAttention.Config`` node:
``torchtitan/models/qwen3/model.py``) BEFORE it applies ``override.imports``
(``torchtitan/trainer.py``: "Model overrides must run after update_from_config"), so the
``document_sdpa``/``causal_sdpa`` overrides come too late to avoid that refusal. Here every
varlen node becomes a ``ContextParallelSDPA`` node and those two overrides leave the list.

``post_dataloading_process``: torchtitan's (masks only for Flex/Varlen nodes, so none for ours;
then ``prepare_context_parallel_input`` shards inputs, labels and positions), then our mask from
the whole row's positions, sharded the same way (``shard_mask``). torchtitan's ``Validator``
has its own copy of that sharding, so its hook is wrapped the same way (held-out validation
under CP: the same loss as without, tests/rank/test_context_parallel_e2e.py).
"""

from __future__ import annotations

from qwen3_trainium.models.context_parallel import shard_mask
from qwen3_trainium.models.overrides.attention import context_parallel_config

DOCUMENT_OVERRIDE = "qwen3_trainium.models.overrides.attention.document_sdpa"
CAUSAL_OVERRIDE = "qwen3_trainium.models.overrides.attention.causal_sdpa"


def use_context_parallel_attention(config) -> bool | None:
    """Swap a native model's sdpa/causal attention nodes for CP ones in the trainer ``config``;
    returns whether they mask documents (sdpa: True, causal: False), None when nothing was swapped
    (CP off, flex, model=hf: torchtitan's own paths)."""
    imports = config.override.imports
    backend = DOCUMENT_OVERRIDE if DOCUMENT_OVERRIDE in imports else CAUSAL_OVERRIDE
    if config.parallelism.context_parallel_degree <= 1 or backend not in imports:
        return None
    layers = getattr(config.model_spec.model, "layers", None) or []
    swapped = 0
    for layer in layers:
        attention = getattr(layer, "attention", None)
        node = getattr(attention, "inner_attention", None)
        replacement = node is not None and context_parallel_config(node)
        if replacement:
            attention.inner_attention = replacement
            swapped += 1
    if not swapped:
        return None
    config.override.imports = [entry for entry in imports if entry != backend]
    return backend == DOCUMENT_OVERRIDE


class ContextParallelAttention:
    """Mixin for a torchtitan ``Trainer``: context parallel through our SDPA when the run uses it."""

    _cp_documents: bool | None = None

    def __init__(self, config, *args, **kwargs):
        self._cp_documents = use_context_parallel_attention(config)
        super().__init__(config, *args, **kwargs)
        validator = getattr(self, "validator", None)
        if self._cp_documents is not None and validator is not None:
            # torchtitan's Validator shards its batches with its own copy of the trainer's code
            # (components/validate.py: "TODO: deduplicate with Trainer.post_dataloading_process")
            validator.post_dataloading_process = self._masked(validator.post_dataloading_process)

    def post_dataloading_process(self, input_dict, labels):
        return self._masked(super().post_dataloading_process)(input_dict, labels)

    def _masked(self, shard):
        """torchtitan's ``post_dataloading_process`` (``shard``), then our mask when CP swapped the
        attention: from the whole row's positions, read before torchtitan shards them."""

        def sharded_with_mask(input_dict, labels, *args):
            whole_row = input_dict.get("positions")
            inputs, labels, extra_kwargs = shard(input_dict, labels, *args)
            if self._cp_documents is not None:
                extra_kwargs["attention_masks"] = shard_mask(
                    whole_row,
                    self.parallel_dims.get_mesh("cp"),
                    self.config.parallelism.context_parallel_load_balancer,
                    documents=self._cp_documents,
                )
            return inputs, labels, extra_kwargs

        return sharded_with_mask
