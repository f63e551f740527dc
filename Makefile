# Resident: `make run` sets everything up and starts it; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# CPU machines get the CPU build of torch first, so nothing pulls a CUDA build.
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install -q torch==2.13.0; fi
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)
	$(BIN)/resident models pull

run: setup
	$(BIN)/resident

test: setup
	# One torch thread per test process: small ops stall badly when OpenMP
	# threads wait on a core something else holds, and the suite gains nothing.
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache
