"""Convert a torchtitan (DCP) checkpoint step between the two layouts of Qwen3-MoE's experts.

    python -m qwen3_trainium.convert_experts RUN_DIR/checkpoint/step-N [--to fused|torchtitan]

``model=nki_moe`` stores each layer's experts in the NKI kernels' layout (``gate_up_ED2F``,
``down_EFD``: ``overrides/blockwise_experts.py``); torchtitan's grouped experts (``model=native``,
and ``model=nki_moe`` before that layout) store ``w1_EFD`` / ``w2_EDF`` / ``w3_EFD``; the
conversion is ``expert_layout.py``'s, the one the HF boundary uses. A step
written in one layout does not resume in the other: pre-flight refuses it and names this command.
It rewrites the model's expert tensors and their AdamW states (``exp_avg``, ``exp_avg_sq``,
``step``, the parameter-group fields); everything else (the data position, RNG, LR schedule,
train state) is copied as it is, so the resumed run continues exactly.

The step is converted in place; the original moves to ``<checkpoint folder>.<layout>/step-N``
beside the folder, out of torchtitan's reach (it resumes from the newest ``step-N`` it finds).
It needs the whole step in host memory (a trn2.48xlarge holds 2 TiB; Qwen3-30B-A3B's full
training state is about 0.5 TB).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import warnings

from qwen3_trainium.models.expert_layout import FUSED, SOURCE, TITAN, layout_of, match, to_fused, to_titan


def _path(key: str, mapping: dict) -> tuple:
    """The nested-dict path of a converted key: its source key's, the parameter renamed."""
    m = match(key)
    if m is None:
        return mapping[key]
    old, new = SOURCE[m["param"]], m["param"]
    source = f"{m['head']}{old}{m['tail'] or ''}"
    return tuple(p.replace(old, new) if isinstance(p, str) else p for p in mapping[source])


def convert(step_dir: str, to: str) -> str:
    """Rewrite ``step_dir`` in layout ``to``; returns where the original went."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict, unflatten_state_dict
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    step_dir = os.path.abspath(step_dir)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        nested = _load_state_dict_from_keys(checkpoint_id=step_dir)
    flat, mapping = flatten_state_dict(nested)
    have = layout_of(flat)
    if have is None:
        raise ValueError(f"{step_dir} holds no routed experts: nothing to convert")
    if have == to:
        raise ValueError(f"{step_dir} is already in the {to} layout")
    converted = (to_fused if to == FUSED else to_titan)(flat)
    new_mapping = {key: _path(key, mapping) for key in converted}
    folder, step = os.path.split(step_dir)
    keep = os.path.join(f"{folder}.{have}", step)
    staging = f"{step_dir}.converting"
    shutil.rmtree(staging, ignore_errors=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(unflatten_state_dict(converted, new_mapping), checkpoint_id=staging, no_dist=True)
    os.makedirs(os.path.dirname(keep), exist_ok=True)
    os.replace(step_dir, keep)
    os.replace(staging, step_dir)
    return keep


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step_dir", help="a checkpoint step directory (RUN_DIR/checkpoint/step-N)")
    parser.add_argument("--to", choices=(FUSED, TITAN), default=FUSED,
                        help="fused: for model=nki_moe (default); torchtitan: for model=native")  # fmt: skip
    args = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(args.step_dir, ".metadata")):
        print(
            f"convert_experts: {args.step_dir} is not a DCP checkpoint step (no .metadata)", file=sys.stderr
        )
        return 2
    try:
        keep = convert(args.step_dir, args.to)
    except ValueError as err:
        print(f"convert_experts: {err}", file=sys.stderr)
        return 2
    print(f"{args.step_dir}: experts converted to the {args.to} layout; the original is in {keep}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
