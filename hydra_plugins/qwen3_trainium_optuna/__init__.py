"""hydra-optuna-sweeper's sweeper, ending cleanly when no trial completed (``hydra/sweeper=lr_search``)."""
