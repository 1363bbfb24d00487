"""hydra-optuna-sweeper's ``OptunaSweeper``, plus one thing: a search in which every trial failed
ends with one line and the sweep summary, not a traceback.

Upstream asks Optuna for the best trial after the last batch (``hydra_optuna_sweeper/_impl.py``,
``OptunaSweeperImpl.sweep``: ``study.best_trial``), and Optuna raises ``ValueError("No trials
are completed yet.")`` when none completed (``optuna/storages/_in_memory.py``,
``get_best_trial``). Each failed job has printed its own reason already; the summary
(``qwen3_trainium.parent.sweep.SweepSummary``, run after the sweeper returns) lists them and the
multirun exits 1. It lives in the ``hydra_plugins`` namespace because Hydra instantiates
sweepers only from there.
"""

from __future__ import annotations

import sys

from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper

NONE_COMPLETED = "No trials are completed yet."


class Qwen3OptunaSweeper(OptunaSweeper):
    def sweep(self, arguments):
        try:
            return super().sweep(arguments)
        except ValueError as err:
            if str(err) != NONE_COMPLETED:
                raise
            print(
                "qwen3-trainium: no trial of the Optuna search completed (each job's reason is above, "
                "and in the sweep summary); no best value, no optimization_results.yaml",
                file=sys.stderr,
                flush=True,
            )
            return None
