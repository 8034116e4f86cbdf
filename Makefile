# The two set-up commands of the README:
#   make run   - install DrumsBench and run the main job (`drumsbench run` on the embedded default)
#   make test  - install everything the tests need (system packages, services, images) and pass them
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test install system lint

$(BIN)/drumsbench: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(BIN)/drumsbench

system:
	bash scripts/setup.sh

run: install
	$(BIN)/drumsbench run

test: system install
	$(BIN)/python -m pytest -q -p no:cacheprovider --timeout=900 tests

lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy src
