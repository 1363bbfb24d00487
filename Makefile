# The README's two commands: `make smoke` (the main job, 10 steps on CPU) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup smoke smoke-native smoke-hf smoke-nki-moe test test-fast lint format bench bench-paths assets clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

smoke: smoke-native

smoke-native: setup
	$(PY) launch.py model=native smoke=on

smoke-hf: setup
	$(PY) launch.py model=hf smoke=on

smoke-nki-moe: setup
	$(PY) launch.py model=nki_moe smoke=on

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
