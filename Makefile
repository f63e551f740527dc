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

# llama.cpp's own GGUF converter, vendored in the llama-cpp-python sdist: the tests
# convert tiny checkpoints with it to check the engine's GGUF reader. Fetched once, by
# `make test` (running Resident does not need it);
# only the converter's Python sources are kept (tests find them here, or at
# $$RESIDENT_LLAMA_CPP).
LLAMA_CPP_PYTHON := 0.3.36
PEERS := $(VENV)/peers
LLAMA_CPP := $(PEERS)/llama.cpp-$(LLAMA_CPP_PYTHON)
LLAMA_CPP_SDIST := llama_cpp_python-$(LLAMA_CPP_PYTHON)

$(LLAMA_CPP)/convert_hf_to_gguf.py: | $(STAMP)
	rm -rf $(PEERS)/download $(LLAMA_CPP).partial
	$(BIN)/pip download -q --disable-pip-version-check --no-binary :all: --no-deps \
		-d $(PEERS)/download llama-cpp-python==$(LLAMA_CPP_PYTHON)
	mkdir -p $(LLAMA_CPP).partial
	tar -xzf $(PEERS)/download/$(LLAMA_CPP_SDIST).tar.gz -C $(LLAMA_CPP).partial \
		--strip-components=3 $(addprefix $(LLAMA_CPP_SDIST)/vendor/llama.cpp/, \
		convert_hf_to_gguf.py conversion gguf-py/gguf gguf-py/pyproject.toml gguf-py/LICENSE LICENSE)
	rm -rf $(PEERS)/download $(LLAMA_CPP)
	mv $(LLAMA_CPP).partial $(LLAMA_CPP)

setup: $(STAMP)
	# The project's bytecode, as a wheel's install writes it: where Python may not write
	# it itself (PYTHONDONTWRITEBYTECODE, a read-only checkout) every start compiled the
	# sources again, 0.2 s of a server's 1.8 s start. Files already current are skipped.
	$(BIN)/python -m compileall -q engine agent tools prompts
	$(BIN)/resident models pull

run: setup
	$(BIN)/resident

test: setup $(LLAMA_CPP)/convert_hf_to_gguf.py
	# One torch thread per test process: small ops stall badly when OpenMP
	# threads wait on a core something else holds. Instead, one test process per
	# core (up to 4), each taking whole files so module fixtures load once: on 2
	# cores the suite takes 11 minutes instead of 20.
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache
