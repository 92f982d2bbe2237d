# torchstep — the README's two commands (`make demo`, `make test`) bootstrap everything.
# Needs only Python 3.11, pip, git and make. Re-running with the environment in place
# reinstalls nothing: the stamp below only goes stale when the lock or a pyproject changes.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.torchstep-installed
UV_VERSION := 0.13.8
ADAPTERS := core airflow kfp prefect
PYPROJECTS := $(foreach a,$(ADAPTERS),adapters/$(a)/pyproject.toml)
export PYTHONDONTWRITEBYTECODE := 1
export NO_MKDOCS_2_WARNING := 1  # Material for MkDocs: a banner about its successor on every build

.PHONY: env bytecode demo test lint typecheck unit dist test-wheels docs docs-serve docs-examples bench bench-user-torch soak system-deps lock clean \
	test-torch torch-matrix-env gpu-wheels gpu-check

env: $(STAMP)

$(STAMP): requirements/dev.lock $(PYPROJECTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	# byte code compiled once here: uv writes none by default, and PYTHONDONTWRITEBYTECODE (the
	# checkout stays clean) kept every process from caching it, so each import of Prefect, KFP
	# or the Kubernetes client compiled it anew (3-4 CPU-s each, the suite's processes by the
	# thousand; docs/contributing.md)
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -r requirements/dev.lock
	# torch through pip: pip's own configuration may point at a local CPU build (see the README).
	$(BIN)/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps $(foreach a,$(ADAPTERS),-e adapters/$(a))
	touch $@

system-deps:
	@bash tools/system-deps.sh

# The working tree's byte code, for the processes that run it (the agent of every step, the
# pods of the test cluster, the orchestrators' task processes): PYTHONDONTWRITEBYTECODE keeps
# them from caching it, and each compiled torchstep anew (about 0.1 CPU-s per agent, ~1,100
# agents in `make test`). compileall writes only what is stale, into ignored __pycache__/.
SOURCES := $(foreach a,$(ADAPTERS),adapters/$(a)/src) tests dags
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 $(SOURCES)

demo: bytecode
	$(BIN)/python dags/demo.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/python tools/import_cycles.py

typecheck: $(STAMP)
	$(BIN)/mypy adapters

# The suite waits on real servers and processes more than it computes: a few more workers
# than cores (each with its own servers, ports and TMPDIR). A module is one work unit (its
# deployment or cluster starts once), but for tests/conftest.py's SPREAD_MODULES; the longest
# units go first.
TEST_WORKERS ?= 4
unit: bytecode system-deps torch-matrix-env
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder --durations=40

# The torch matrix (issue 32; docs/contributing.md): the agent's compatibility suite
# (tests/torchmatrix) against each supported (Python, torch), each in a virtualenv of PyPI's
# own wheels cached in ~/.cache/torchstep/torch-matrix. `make test` runs the oldest and the
# newest rows inside `unit` (their virtualenvs built or checked first, here); `make test-torch`
# runs every row and the dev pin and prints the table. TORCH_ROWS=py3.12-torch2.11.0 picks rows.
TORCH_ROWS ?= all
torch-matrix-env: $(STAMP)
	$(BIN)/python tools/torch_matrix.py ensure ends

test-torch: bytecode
	$(BIN)/python tools/torch_matrix.py run $(TORCH_ROWS)

# The GPU check (bench/gpu.sh): the wheels it installs on a GPU machine without network, in the
# git-ignored bench/gpu-wheels/ that travels with the working tree; then, on that machine,
# `bench/gpu.sh` (or `make gpu-check`). Its dry mode runs in `make test`.
gpu-wheels: $(STAMP)
	bash bench/gpu.sh --build-wheels

gpu-check:
	bash bench/gpu.sh

test: lint typecheck unit test-wheels docs-examples

# An sdist and a wheel of each distribution in dist/, checked as PyPI would check them.
dist: $(STAMP)
	rm -rf dist
	for a in $(ADAPTERS); do out=$$($(BIN)/python -m build --installer uv --outdir dist adapters/$$a 2>&1) || { echo "$$out"; exit 1; }; done
	ls dist
	$(BIN)/twine check --strict dist/*
	$(BIN)/check-wheel-contents dist/*.whl

# Each adapter's wheel (with core's) in a fresh venv with the newest versions its ranges
# allow, its unit tests and its example run from outside the repository; core against a
# pinned torchx-nightly too, and on Python 3.10 (requires-python's floor).
test-wheels: dist
	$(BIN)/python tools/test_wheels.py airflow kfp prefect core core-nightly core-py310

# The documentation site in site/ (strict: no broken link, anchor or reference), and served.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

docs-serve: $(STAMP)
	$(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

# Every code block of README.md and docs/*.md that claims to run, run as written (those that
# cannot run here are marked in the source; the listing says how many and why).
docs-examples: bytecode
	$(BIN)/python tools/doc_blocks.py

bench: bytecode
	$(BIN)/python bench/run_all.py

# The agent's startup and recovery on the torch users' images carry (issue 32): PyPI's CUDA
# builds, the oldest and the newest rows of the torch matrix (figures N@<row>).
BENCH_TORCH_ROWS ?= py3.10-torch2.4.1 py3.13-torch2.15.0
bench-user-torch: bytecode
	for row in $(BENCH_TORCH_ROWS); do \
	  BENCH_TORCH_ROW=$$row $(BIN)/python bench/agent_startup.py || exit 1; \
	  BENCH_TORCH_ROW=$$row $(BIN)/python bench/agent_recovery.py || exit 1; \
	done
	$(BIN)/python bench/report.py

# A seeded fault campaign (issue 27): SOAK_FAULTS runs (default 100), each a surface x fault
# class x moment drawn from SOAK_SEED (printed first; the same seed replays the same campaign),
# every invariant checked after each run; writes docs/reliability.md, fails on any violation.
# One run again: .venv/bin/python -m tools.soak --seed SEED --only INDEX
# SOAK_SURFACE="kubernetes ..." draws from those surfaces only (real pods: needs root, as tests/cluster)
# and rewrites only its part of the page.
SOAK_FAULTS ?= 100
soak: bytecode
	SOAK_FAULTS=$(SOAK_FAULTS) SOAK_SEED=$(SOAK_SEED) $(BIN)/python -m tools.soak $(foreach s,$(SOAK_SURFACE),--surface $(s))

# Regenerate the pinned dependency set after editing requirements/dev.in.
lock: $(STAMP)
	$(BIN)/uv pip compile -q --python-version 3.11 requirements/dev.in -o requirements/dev.lock

clean:
	rm -rf $(VENV) .venv-isolated dist site .pytest_cache .mypy_cache .ruff_cache
