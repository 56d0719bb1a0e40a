# Two commands on a fresh machine: `make demo` and `make test` (see README).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch 2.13.0 lies on disk on the project's machines; an unpinned torch
# would pull a multi-GB CUDA build. Override on machines with other needs: make TORCH=torch
TORCH ?= torch==2.13.0
# Each target installs what it needs: the package alone for the demo, pdoc for the API docs,
# the test and lint tools plus Ray and devinterp (tested against) for test, lint and bench.
BASE_STAMP := $(VENV)/.installed-base
DOCS_STAMP := $(VENV)/.installed-docs
STAMP := $(VENV)/.installed

.PHONY: install demo test test-all lint bench docs clean

$(BASE_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e .
	touch $(BASE_STAMP)

$(DOCS_STAMP): $(BASE_STAMP)
	$(BIN)/python -m pip install -q -e ".[docs]"
	touch $(DOCS_STAMP)

$(STAMP): $(BASE_STAMP)
	$(BIN)/python -m pip install -q -e ".[dev,ray,compare]"
	touch $(STAMP)

install: $(STAMP)

demo: $(BASE_STAMP)
	$(BIN)/interp-toolkit demo

test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -q

test-all: $(STAMP)
	$(BIN)/python -m pytest -q

# ruff, then types (mypy) and the layer contract (lint-imports, [tool.importlinter] in
# pyproject.toml). Both read folders, not the editable install's import hook, so they run in
# build/lint, where tools/lint_tree.py links interp_toolkit, tasks/ and analyses/ into one tree.
lint: $(STAMP)
	$(BIN)/ruff check interp_toolkit tasks analyses tests examples benchmarks tools
	$(BIN)/python tools/lint_tree.py build/lint
	cd build/lint && $(abspath $(BIN))/mypy --config-file $(CURDIR)/pyproject.toml
	cd build/lint && $(abspath $(BIN))/lint-imports $(CURDIR)/pyproject.toml

bench: $(STAMP)
	for f in benchmarks/bench_*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

# API reference from the docstrings (pdoc) -> build/api/index.html
docs: $(DOCS_STAMP)
	$(BIN)/python docs/build_api.py build/api

clean:
	rm -rf $(VENV) build dist *.egg-info
