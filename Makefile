# The README's two commands: `make smoke` (the main job, 10 steps on CPU) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup setup-neuron doctor smoke smoke-native smoke-hf smoke-nki-moe sweep-paths wandb-sync test test-fast lint format bench bench-paths assets clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# On a Trainium host: torch-neuronx and neuronx-cc from the Neuron pip repository (already in
# pip's configuration on the Neuron DLAMI; elsewhere NEURON_PIP_INDEX=<its URL from AWS's setup guide>).
setup-neuron: setup
	$(PY) -m pip install $(if $(NEURON_PIP_INDEX),--extra-index-url $(NEURON_PIP_INDEX)) -r requirements-neuron.txt
	$(PY) launch.py doctor=true device=neuron

doctor: setup
	$(PY) launch.py doctor=true

smoke: smoke-native

smoke-native: setup
	$(PY) launch.py model=native smoke=on

smoke-hf: setup
	$(PY) launch.py model=hf smoke=on

smoke-nki-moe: setup
	$(PY) launch.py model=nki_moe smoke=on

# The three training paths side by side: one summary table, summary.csv/md and loss.png.
sweep-paths: setup
	$(PY) launch.py -m model=hf,native,nki_moe smoke=on

# Upload offline W&B runs (needs WANDB_API_KEY and a network): every run under RUNS (default runs/).
RUNS ?= runs
wandb-sync: setup
	@found=$$(find $(RUNS) -type d -name 'offline-run-*' -path '*/wandb/*' 2>/dev/null | sort); \
	if [ -z "$$found" ]; then echo "no offline W&B runs under $(RUNS)/"; exit 0; fi; \
	echo "$$found" | xargs $(VENV)/bin/wandb sync

test: setup
	$(PY) -m pytest

test-fast: setup
	$(PY) -m pytest -m "not slow"

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: setup
	$(PY) bench/launch_overhead.py
	$(PY) bench/paths.py
	$(PY) bench/kernels.py

bench-paths: setup
	$(PY) bench/paths.py

assets: setup
	$(PY) -m qwen3_trainium.make_assets

clean:
	rm -rf runs outputs .pytest_cache .ruff_cache
