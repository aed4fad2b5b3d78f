# servesweep: the README's two commands are `make sweep` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ARGS   ?=

.PHONY: venv sweep test test-all ui contract-env clean-store

# (Re)create the virtualenv whenever pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

sweep: $(STAMP)
	$(PY) run_sweep.py $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

ui: $(STAMP)
	$(PY) -m sweeps.ui
