# The two set-up commands of the README:
#   make run   - install DrumsBench and run the main job (`drumsbench run` on the embedded default)
#   make test  - install everything the tests need (system packages, services, images) and pass them
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test install system lint

# `make run` installs only what the main job needs; the test extras (Ray, torch, OpenEnv, linters)
# belong to `make test`.
$(VENV)/.installed-run: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@ $(VENV)/.installed-run

install: $(VENV)/.installed-test

system:
	bash scripts/setup.sh

run: $(VENV)/.installed-run
	$(BIN)/drumsbench run

test: system $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -p no:cacheprovider --timeout=900 --durations=30 tests

lint: install
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy src
	$(BIN)/mypy --strict src/drumsbench/substrates/base.py src/drumsbench/envs src/drumsbench/executors \
		src/drumsbench/rollout/attempt.py src/drumsbench/ledger.py src/drumsbench/measure src/drumsbench/core \
		src/drumsbench/taskgen
