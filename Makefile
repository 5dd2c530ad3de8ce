# Rentune: `make run` starts the app, `make test` runs every check. Both set up what they need first and
# reuse what is already installed on later runs.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
# Tests run in parallel workers (pytest-xdist): most of a test's time is spent waiting on sshd, the payload and the
# event loop, so even 2 cores finish sooner. PYTEST_WORKERS=0 runs them in this process (for debugging).
PYTEST_WORKERS ?= auto
# Build llama.cpp portably (no -march=native), so the cached wheel runs on any x86-64 machine.
export CMAKE_ARGS ?= -DGGML_NATIVE=off

.PHONY: run test lint typecheck imports pytest bench soak dist install-local gpu-wheels gpu-install gpu-check clean help

help:
	@echo "make run            set up and start the desktop app"
	@echo "make test           set up and run linters, type checks, import contracts and the tests"
	@echo "make bench          run the benchmarks in tests/benchmarks"
	@echo "make soak           the money soak: 60 seeded fault schedules over the fake clouds (SOAK_SEEDS=N for more)"
	@echo "make dist           build the double-clickable app for this platform into dist/ (see installers/README.md)"
	@echo "make install-local  add the optional libraries (transformers for exact token counts, pyarrow for Parquet, MLX)"
	@echo "make gpu-wheels     download the wheels a network-less GPU machine lacks into .whl/1, .whl/2 (run here)"
	@echo "make gpu-install    on the GPU machine: install the carried .whl/N the image lacks into .gpu-site"
	@echo "make gpu-check      on the GPU machine: install, then train real-shape models with the payload beside"
	@echo "                    rentune plan's prediction, force an OOM; writes \$$OUT/gpu_check.md (needs a GPU;"
	@echo "                    GPU_CHECK_ARGS='--smoke' or '--models qwen2.5-0.5b' for a shorter run)"

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Rentune needs Python 3.11 or newer: install it and run make again, or set PYTHON=python3.12")'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.base-installed: pyproject.toml | $(PY)
	$(PIP) install --quiet -e .
	@touch $@

# torch==2.13.0 first: any other torch request pulls a multi-GB CUDA build on Linux.
$(VENV)/.test-installed: pyproject.toml trainer_payload/requirements.txt | $(PY)
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[dev,local,mlx]' -r trainer_payload/requirements.txt
	@touch $@ $(VENV)/.base-installed $(VENV)/.local-installed

$(VENV)/.local-installed: pyproject.toml | $(PY)
	$(PIP) install --quiet -e '.[local,mlx]'
	@touch $@

run: $(VENV)/.base-installed
	@bash installers/system-deps.sh run
	$(VENV)/bin/rentune

install-local: $(VENV)/.local-installed

lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check .

typecheck: $(VENV)/.test-installed
	$(VENV)/bin/mypy desktop trainer_payload

imports: $(VENV)/.test-installed
	$(VENV)/bin/lint-imports --no-cache

pytest: $(VENV)/.test-installed
	@bash installers/system-deps.sh test
	@$(PY) -m pytest -n $(PYTEST_WORKERS); status=$$?; \
	  if [ $$status -eq 5 ]; then echo "pytest collected no tests: that is a failure" >&2; fi; exit $$status

test: lint typecheck imports pytest

# The bundle is built from its own venv holding the base app only, so no torch or CUDA can slip into it.
DIST_VENV := build/dist-venv
DIST_PY   := $(DIST_VENV)/bin/python
PYINSTALLER := pyinstaller==6.22.3

$(DIST_PY):
	$(PYTHON) -m venv $(DIST_VENV)
	$(DIST_PY) -m pip install --quiet --disable-pip-version-check --upgrade pip

$(DIST_VENV)/.installed: pyproject.toml | $(DIST_PY)
	$(DIST_PY) -m pip install --quiet --disable-pip-version-check '$(PYINSTALLER)' .
	@touch $@

dist: $(DIST_VENV)/.installed
	@bash installers/system-deps.sh run
	$(DIST_PY) -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps .
	$(DIST_PY) installers/build_dist.py

bench: $(VENV)/.test-installed
	@bash installers/system-deps.sh test
	$(PY) -m tests.benchmarks

# The money soak (tests/soak/): seeded random fault schedules over the three fake clouds, 200+ rentals in all.
SOAK_SEEDS ?= 60
soak: $(VENV)/.test-installed
	$(PY) -m tests.soak --seeds $(SOAK_SEEDS)

# The GPU check (tests/gpu/): wheels are fetched here, carried to a GPU machine without network, installed there
# next to the image's own torch, transformers and peft (never replaced), then the check runs with the image's Python.
GPU_PYTHON ?= python3
GPU_CHECK_ARGS ?=

gpu-wheels: $(VENV)/.test-installed
	$(PY) -m tests.gpu.wheels download

gpu-install:
	$(GPU_PYTHON) -m tests.gpu.wheels install

gpu-check: gpu-install
	$(GPU_PYTHON) -m tests.gpu.gpu_check $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) build dist .mypy_cache .pytest_cache .ruff_cache
