# The README's two commands: `make smoke` (the main job, 10 steps on CPU) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup setup-neuron lock doctor test-neuron test-gpu test-heavy smoke smoke-native smoke-hf smoke-nki-moe smoke-chat smoke-dpo smoke-bf16 sweep-paths wandb-sync test test-fast lint format bench bench-compile bench-paths bench-moe bench-auto assets clean

setup: $(STAMP)

# The CPU/CI stack: pyproject.toml's ranges, held to the exact versions CI proved (constraints.txt).
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# Rewrite constraints.txt from a fresh venv with the newest versions pyproject.toml admits.
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install --quiet --upgrade pip
	.venv-lock/bin/python -m pip install --quiet -e '.[dev]'
	{ sed -n '1,3p' constraints.txt; .venv-lock/bin/python -m pip freeze --exclude-editable; } > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf .venv-lock

# On a Trainium host: into the existing Neuron venv (NEURON_VENV=..., else the active venv with
# torch_neuronx, else the DLAMI's), keeping its torch / torch-neuronx / neuronx-cc / nki /
# torchtitan; only missing packages are installed. NEURON_PIP_INDEX=<the Neuron pip repository
# URL from AWS's setup guide> when they come from there. Ends with the doctor report.
NEURON_PY = $(shell cat .neuron-venv 2>/dev/null)/bin/python
# After `make setup-neuron` these run in the Neuron venv it recorded (.neuron-venv), else in .venv.
HOST_PY = $(if $(wildcard .neuron-venv),$(NEURON_PY),$(PY))
HOST_DEPS = $(if $(wildcard .neuron-venv),,setup)

setup-neuron:
	$(PYTHON) -m qwen3_trainium.setup_neuron
	"$$(cat .neuron-venv)/bin/python" launch.py doctor=true device=neuron

# The on-device checks (pytest -m neuron / -m gpu): on a trn2 after `make setup-neuron` they run
# in the Neuron venv and write trn2_report.md; anywhere else every one is skipped with a reason.
test-neuron: $(HOST_DEPS)
	$(HOST_PY) -m pytest -m neuron -rs

test-gpu: setup
	$(PY) -m pytest -m gpu -rs

doctor: $(HOST_DEPS)
	$(HOST_PY) launch.py doctor=true

smoke: smoke-native

smoke-native: setup
	$(PY) launch.py model=native smoke=on

smoke-hf: setup
	$(PY) launch.py model=hf smoke=on

smoke-nki-moe: setup
	$(PY) launch.py model=nki_moe smoke=on

# Supervised fine-tuning on the shipped conversations (data=chat), with a preview of the rows.
smoke-chat: setup
	$(PY) launch.py model=native smoke=on data=chat data.preview=4

# Preference training (objective=dpo, docs/dpo.md) on the shipped pairs: rewards/accuracies in
# metrics.jsonl rises over the 10 steps; the reference log-probs are computed once, then reused.
smoke-dpo: setup
	$(PY) launch.py objective=dpo smoke=on

# The regime trn2 runs, on CPU: the three paths in bfloat16 over two FSDP ranks, each with an HF
# export and samples; the export and samples checks pass or fail the job as in float32.
smoke-bf16: setup
	$(PY) launch.py -m model=hf,native,nki_moe smoke=on parallel=cpu2 training.mixed_precision_param=bfloat16 checkpoint=hf_export eval=on

# The three training paths side by side: one summary table, summary.csv/md and loss.png.
sweep-paths: setup
	$(PY) launch.py -m model=hf,native,nki_moe smoke=on

# Upload offline W&B runs (needs WANDB_API_KEY and a network): every run under RUNS (default runs/).
RUNS ?= runs
wandb-sync: setup
	@found=$$(find $(RUNS) -type d -name 'offline-run-*' -path '*/wandb/*' 2>/dev/null | sort); \
	if [ -z "$$found" ]; then echo "no offline W&B runs under $(RUNS)/"; exit 0; fi; \
	echo "$$found" | xargs $(VENV)/bin/wandb sync

# Tests run in WORKERS pytest-xdist processes, a test file to each (its module fixtures built
# once): on 2 cores 21:47 against 28:29 one at a time (make test, 2026-12-07).
WORKERS ?= 2

# Everything but the multi-minute cases; CI runs both targets.
test: setup
	$(PY) -m pytest -m "not heavy" -n $(WORKERS) --dist loadfile

# The multi-minute cases: the local Slurm cluster (two-node sweep, requeue, cancel), SIGTERM and
# kill-and-resume against an uninterrupted run, the export round trip, the compiled smoke. The docs'
# trn2 lines' traces (one process each, one thread) are spread one test at a time.
test-heavy: setup
	$(PY) -m pytest -m heavy -n $(WORKERS) tests/parent/test_readme_trainium.py
	$(PY) -m pytest -m heavy -n $(WORKERS) --dist loadfile --ignore=tests/parent/test_readme_trainium.py

test-fast: setup
	$(PY) -m pytest -m "not slow"

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: setup
	$(PY) bench/launch_overhead.py
	$(PY) bench/compile.py
	$(PY) bench/paths.py
	$(PY) bench/kernels.py

# torch.compile against eager (CPU by default; DEVICE=cuda or neuron on such a host)
DEVICE ?= cpu
bench-compile: setup
	$(PY) bench/compile.py --device $(DEVICE)

bench-paths: setup
	$(PY) bench/paths.py

# The two MoE routes on the same job, interleaved: grouped_mm (model=native) against blockwise NKI
# (model=nki_moe); tokens/s, MFU, time to first iteration, peak memory; bench_moe.md/.json under
# runs/bench_moe/. CPU: the tiny MoE's smoke job. DEVICE=neuron on a trn2 (after make setup-neuron):
# Qwen3-30B-A3B, TP4 x FSDP16, seq 4096; refused in one line (exit 2) on a host without Neuron.
# More options: BENCH_MOE_ARGS='--rounds 3 --cold' (python bench/moe.py --help).
BENCH_MOE_ARGS ?=
bench-moe: $(HOST_DEPS)
	$(HOST_PY) bench/moe.py --device $(DEVICE) $(BENCH_MOE_ARGS)

# parallel=auto's step-time prediction against measured steps (bench/auto_calibration.py): CPU
# plans the smoke job and runs its 1-rank, FSDP2 and TP2 layouts; DEVICE=neuron on a trn2 plans
# the 30B-A3B job and runs its top three; auto_calibration.md/.json under runs/bench_auto/.
BENCH_AUTO_ARGS ?=
bench-auto: $(HOST_DEPS)
	$(HOST_PY) bench/auto_calibration.py --device $(DEVICE) $(BENCH_AUTO_ARGS)

assets: setup
	$(PY) -m qwen3_trainium.make_assets

clean:
	rm -rf runs outputs .pytest_cache .ruff_cache
