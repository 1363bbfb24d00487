"""Pre-flight of a resume's data: the step a run resumes from holds each data-parallel rank's
position in its stream (torchtitan's ``dataloader`` state: ``dp_rank_N``, the pickled
``StatefulDataLoader`` state, and ``world_size``); that position means the same rows only on the
same data, read the same way (``data/identity.py``). Read here in the parent with DCP's own loader
(two keys of the step folder, no process group), compared with the identity this run's streams
would have, and refused before any process starts, each difference with its key and fix. The
ranks check again as they load (``RowStream`` / ``TextRows.load_state_dict``).
"""

from __future__ import annotations

import io
import pickle
import warnings

from qwen3_trainium.config.schema import RunConf
from qwen3_trainium.data import identity as ident
from qwen3_trainium.parent.preflight.problem import Problem
from qwen3_trainium.parent.preflight.shares import dp_ranks

RANK_KEY = "dataloader.dp_rank_0"  # every rank's identity is the same: rank 0's stands for all
WORLD_KEY = "dataloader.world_size"


def saved_data_state(step_dir: str, metadata: dict) -> tuple[dict | None, int | None]:
    """(rank 0's dataset state, the data-parallel world size it was written for), or Nones when
    the step holds no data state (a model-only step)."""
    if RANK_KEY not in metadata or WORLD_KEY not in metadata:
        return None, None
    import torch.distributed.checkpoint as dcp

    wanted = {RANK_KEY: io.BytesIO(), WORLD_KEY: io.BytesIO()}
    with warnings.catch_warnings():  # "torch.distributed is disabled ...": one process, on purpose
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(wanted, storage_reader=dcp.FileSystemReader(step_dir), no_dist=True)
    loader_state = pickle.loads(wanted[RANK_KEY])  # our own ranks' StatefulDataLoader state
    return _dataset_state(loader_state), int(wanted[WORLD_KEY])


def _dataset_state(state) -> dict | None:
    """The dataset's own ``state_dict`` inside a StatefulDataLoader state (workers nest it)."""
    if not isinstance(state, dict):
        return None
    if isinstance(state.get("dataset_state"), dict):
        return state["dataset_state"]
    for value in state.values():
        found = _dataset_state(value)
        if found is not None:
            return found
    return None


def our_identity(run: RunConf) -> dict:
    if run.data.format.value == "preference":
        from qwen3_trainium.data.preference import source as preference

        return preference.identity(run)
    if run.data.format.value != "text":
        from qwen3_trainium.data.chat import source

        return source.identity(run)
    from qwen3_trainium.data import text

    return text.identity(run)


def check_resume_data(run: RunConf, step_dir: str, metadata: dict, notes: list[str]) -> list[Problem]:
    state, world = saved_data_state(step_dir, metadata)
    if state is None:
        return []
    restart = f"a new run directory with checkpoint.initial_load_path={step_dir} (its weights)"
    if world != dp_ranks(run):
        message = (
            f"{step_dir} holds the data positions of {world} data-parallel ranks; this run has {dp_ranks(run)}, "
            "and torchtitan cannot re-split them"
        )
        fix = f"the layout it was written with ({world} data-parallel ranks) to resume it, or {restart}"
        return [Problem("launcher.nproc_per_node", run.launcher.nproc_per_node, message, fix)]
    saved = state.get("identity")
    if not saved:
        notes.append(
            f"WARNING {step_dir} predates data identities: its data cannot be checked against this run's"
        )
        return _pending_too_long(run, state, step_dir, restart)
    ours = our_identity(run)
    return [
        Problem(
            change.key,
            change.ours,
            f"{step_dir} was written reading other data ({change.saved!r} then): resuming would read other "
            "rows than the run it continues",
            ident.fix(change, step_dir),
        )
        for change in ident.changes(saved, ours)
    ]


def _pending_too_long(run: RunConf, state: dict, step_dir: str, restart: str) -> list[Problem]:
    """A chat state without identity: a sample read but not placed, longer than this seq_len,
    would make a row longer than seq_len."""
    longest = max((len(p[0]) for p in state.get("pending", [])), default=0)
    if longest <= run.training.seq_len:
        return []
    message = f"{step_dir} holds a sample of {longest} tokens waiting for a row, past training.seq_len"
    return [
        Problem(
            "training.seq_len",
            run.training.seq_len,
            message,
            f"training.seq_len={longest} or more, or {restart}",
        )
    ]
