"""The dataloader configs torchtitan builds in each rank (``Trainer.Config.dataloader`` and the
``Validator``'s): ours over torchtitan's ``ParallelAwareDataloader``, for chat, preference pairs
(``objective=dpo``) and text. Each rank builds its rows from the run's resolved config
(``config_path``); the held-out loader reads the rank's share once, then padding
(``data/chat/stream.py``, ``data/text.py``).
"""

from __future__ import annotations

from qwen3_trainium.config import runconfig


def dataloaders(run, run_dir: str) -> tuple[object, object | None]:
    """(training loader config, held-out loader config or None without eval=on)."""
    path = runconfig.rank_config_path(run_dir)
    if run.data.format.value == "preference":
        from qwen3_trainium.data.preference.loader import PreferenceDataLoader

        train = PreferenceDataLoader.Config(config_path=path, split="train")
        val = PreferenceDataLoader.Config(config_path=path, split="validation", infinite=False)
        return train, val if run.eval.enable else None
    if run.data.format.value != "text":
        from qwen3_trainium.data.chat.loader import ChatDataLoader

        train = ChatDataLoader.Config(config_path=path, split="train")
        val = ChatDataLoader.Config(config_path=path, split="validation", infinite=False)
        return train, val if run.eval.enable else None
    from qwen3_trainium.data import text

    name, dataset_path, _ = text.train_dataset(run)
    train = text.TextDataLoader.Config(dataset=name, dataset_path=dataset_path, config_path=path)
    if not run.eval.enable:
        return train, None
    from qwen3_trainium.data import heldout

    src = heldout.register(run)
    val = text.TextDataLoader.Config(
        dataset=src.val_dataset, dataset_path=src.val_path, infinite=False, held_out=True
    )
    return train, val
