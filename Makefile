# Build plumbing for the LLM-pretraining benchmark suite (GNU make).
#
#   make venv    create/refresh $(VENV) from requirements.lock
#   make bench   run the benchmark suite     (PLATFORM=cpu|h100|..., OUT=, ARGS=)
#   make test    run the test suite          (what .ci/run calls)
#   make help    list targets and variables  (default goal)
#
# Install order matters: torch is installed FIRST and pinned, on its own.
# Everything else is installed from requirements.lock with a constraints file
# that pins torch, so no later resolution step can swap in the multi-GB CUDA
# build of torch.  DeepSpeed is installed with DS_BUILD_OPS=0: its CPU ops are
# JIT-compiled on first use into TORCH_EXTENSIONS_DIR and reused afterwards.

PYTHON ?= python3
VENV ?= .venv
PY = $(VENV)/bin/python
PLATFORM ?= cpu
ARGS ?=
# Empty OUT: the harness picks results/<timestamp>-<platform>.
OUT ?=
# Result folders (or record files) for `make submit`.
RESULTS ?=
# Optional extra index for torch only, e.g. https://download.pytorch.org/whl/cpu
# on a CPU-only host whose pip has no local CPU wheel (empty: pip's defaults).
TORCH_INDEX_URL ?=

LOCK := requirements.lock
CONSTRAINTS := build/constraints.txt
STAMP := $(VENV)/.installed
# Single source of truth for the torch pin: the lock.
TORCH_VERSION := $(shell sed -n 's/^torch==\([^ ;]*\).*/\1/p' $(LOCK) 2>/dev/null)

# DeepSpeed's JIT-built CPU ops (cpu_adam, shm_comm, ...) compile once here.
TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions
export TORCH_EXTENSIONS_DIR

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

.PHONY: help venv bench test perf submit nightly lock clean distclean

help:
	@echo "Targets:"
	@echo "  venv       create $(VENV) and install requirements.lock (torch $(TORCH_VERSION) first)"
	@echo "  bench      run the suite:  $(PY) -m harness bench platform=\$$PLATFORM [out=\$$OUT] \$$ARGS"
	@echo "  test       run the tests:  $(PY) -m pytest -q tests"
	@echo "  perf       the harness's own cost: training vs a plain DeepSpeed loop, collective sweep vs a plain loop, KD loss memory"
	@echo "  nightly    the nightly regression job: repeats, history store, reports; exit 1 on regression"
	@echo "  submit     add result records to reference_results/:  $(PY) -m harness submit \$$RESULTS \$$ARGS"
	@echo "  lock       regenerate requirements.lock from $(VENV) (pip freeze)"
	@echo "  clean      remove results/ and .cache/ (keeps $(VENV))"
	@echo "  distclean  clean, and also remove $(VENV) and build/"
	@echo "  help       this text (default goal)"
	@echo ""
	@echo "Variables (current value):"
	@echo "  PYTHON=$(PYTHON)   interpreter used to create the venv"
	@echo "  VENV=$(VENV)"
	@echo "  PLATFORM=$(PLATFORM)   conf/platform/<name>.yaml"
	@echo "  OUT=$(OUT)   results directory; empty: results/<timestamp>-<platform>"
	@echo "  ARGS=$(ARGS)   extra Hydra overrides for bench, e.g. ARGS='suite=single'; submit options, e.g. ARGS='--replace --reason ...'"
	@echo "  RESULTS=$(RESULTS)   result folders (or record files) for submit"
	@echo "  TORCH_INDEX_URL=$(TORCH_INDEX_URL)   optional index for the torch install only"
	@echo "  TORCH_EXTENSIONS_DIR=$(TORCH_EXTENSIONS_DIR)"

# The stamp is newer than the lock and pyproject.toml once the venv matches
# them; then `make venv` does nothing.  When out of date, pip re-checks the
# pins (seconds if already satisfied) and installs only what differs.
# torch goes in alone (--no-deps): its own dependencies (filelock, sympy, ...)
# are in the lock and come in at the locked versions in the second step.
# The torch pin goes to pip through PIP_CONSTRAINT (not just -c) so that the
# isolated build environments of sdists (DeepSpeed is one) obey it too.
$(STAMP): $(LOCK) pyproject.toml
	@test -n "$(TORCH_VERSION)" || { echo "error: no torch==<version> line in $(LOCK)" >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --no-deps $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) "torch==$(TORCH_VERSION)"
	@mkdir -p $(dir $(CONSTRAINTS))
	@echo "torch==$(TORCH_VERSION)" > $(CONSTRAINTS)
	PIP_CONSTRAINT=$(abspath $(CONSTRAINTS)) DS_BUILD_OPS=0 $(PY) -m pip install -r $(LOCK)
	touch $@

venv: $(STAMP)

# DS_ACCELERATOR is cleared: the harness sets it per platform.
bench: venv
	env -u DS_ACCELERATOR $(PY) -m harness bench platform=$(PLATFORM) $(if $(OUT),out=$(OUT)) $(ARGS)

# Non-zero pytest exit (including 5, "no tests collected") fails the target.
test: venv
	$(PY) -m pytest -q tests

perf: venv
	$(PY) tests/perf/harness_cost.py
	$(PY) tests/perf/collective_cost.py
	$(PY) tests/perf/kd_loss_memory.py

# Records of RESULTS (folders or files) -> reference_results/<platform>.json; ARGS: --replace --reason ...
submit: venv
	$(PY) -m harness submit $(RESULTS) $(ARGS)

# The nightly regression job: exit status 1 when something regressed (see python -m harness nightly --help).
nightly: venv
	$(PY) -m harness nightly platform=$(PLATFORM) $(if $(OUT),out=$(OUT)) $(ARGS)

# pip list --format=freeze always prints name==version (never `@ file://`),
# local version tags (+cpu, +cu128) are stripped so the lock is portable, and
# the venv's own tooling (pip, wheel) is left out; setuptools is kept (torch needs >=77).
lock:
	@test -x $(PY) || { echo "error: $(PY) not found; run 'make venv' first" >&2; exit 1; }
	@{ \
	  echo "# requirements.lock -- the ONE lock for this suite: used by the venv that"; \
	  echo "# 'make bench' / 'make venv' creates and by both container images"; \
	  echo "# (containers/Dockerfile.cpu, containers/Dockerfile.gpu)."; \
	  echo "#"; \
	  echo "# Regenerate with 'make lock': pip freeze of the venv, local version tags"; \
	  echo "# such as +cpu stripped, pip/wheel left out.       Do not edit by"; \
	  echo "# hand: install or upgrade in the venv, update pyproject.toml, then"; \
	  echo "# 'make lock'."; \
	  echo "#"; \
	  echo "# Install torch FIRST and pinned (torch==<version below>), then this file with"; \
	  echo "# a constraints file pinning torch and DS_BUILD_OPS=0; see the Makefile."; \
	  echo "#"; \
	  echo "# No hashes (yet): torch comes from a host-specific source (a local CPU"; \
	  echo "# wheel via find-links, the PyTorch CPU index, or the GPU base image), so"; \
	  echo "# pip --require-hashes would break that path.  Exact versions only."; \
	  $(PY) -m pip list --format=freeze --exclude-editable --disable-pip-version-check \
	    | grep -Eiv '^(pip|wheel|distribute)==' \
	    | sed -E 's/^([^=]+==[^+]+)\+.*$$/\1/'; \
	} > $(LOCK).tmp
	mv $(LOCK).tmp $(LOCK)
	@# The venv is by construction what the new lock says.
	@if [ -e $(STAMP) ]; then touch $(STAMP); fi
	@echo "wrote $(LOCK) ($$(grep -vc '^#' $(LOCK)) packages)"

clean:
	rm -rf results/ .cache/

distclean: clean
	rm -rf $(VENV) build/
