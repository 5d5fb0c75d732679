# Every target creates or updates .venv first, so a fresh clone needs only Python 3.11+ and PyPI.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint format bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,server,openai]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/workflow-engine demo handoff $(ARGS)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -n 2

# The inner loop (under a minute): everything but the tests marked slow (crash sweeps, real
# SIGKILLs, CLI and server subprocesses), with 100 simulation seeds instead of 1,000 and half
# the examples of the slowest properties (tests/unit/test_properties.py), on two processes
# (pytest-xdist; CI's machine has two cores), as `make test` and CI do.
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	SIM_SEEDS=100 PROPERTY_EXAMPLES=half $(BIN)/python -m pytest -m "not slow" -q -n 2

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	for f in benchmarks/bench_*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
