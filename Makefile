# Build plumbing for the LLM-pretraining benchmark suite (GNU make).
#
#   make venv    create/refresh $(VENV) from requirements.lock, or requirements-gpu.lock on a GPU node
#   make containers  build the images (docker/podman; a wheelhouse, no network in the build)
#   make bench   run the benchmark suite     (PLATFORM=cpu|h100|..., OUT=, ARGS=)
#   make tune    find the fastest configuration (PLATFORM=, WORKLOAD=, OUT=, ARGS=)
#   make test    run the test suite          (what .ci/run calls)
#   make help    list targets and variables  (default goal)
#
# Install order matters: torch is installed FIRST and pinned, on its own.
# Everything else is installed from requirements.lock with --require-hashes
# --no-deps (every download must match a sha256 of the lock; the lock is the
# complete closure) and a constraints file that pins torch, so no later
# resolution step can swap in the multi-GB CUDA build of torch.  DeepSpeed is
# installed with DS_BUILD_OPS=0; then the ops the suite's runs load (on the cpu
# accelerator: shm_comm, ~1 min on 2 cores) are built once, into
# $(VENV)/deepspeed-ops/ (python -m benchmarks.node.ops build; up to date: 0.1 s).
# Runs load them directly and never JIT-build or wait on torch's lock file.
#
# The GPU venv (containers/venv_choice.py says which and why, one line): VENV_KIND=gpu|cpu, else
# a GPU platform named for this make (PLATFORM=h100, ...), else an NVIDIA GPU on this host, take
# requirements-gpu.lock instead: PyPI's torch (the CUDA 13 build) with every nvidia-*, cuda-* and
# triton wheel it needs, liger-kernel, torchao, and the CPU lock's other pins, all hashed; one
# `pip install --require-hashes --no-deps` of it resolves nothing, so nothing can swap torch.
# $(VENV)/.venv-lock records the lock the venv is made from; a switch makes it again from scratch.

PYTHON ?= python3
VENV ?= .venv
PY = $(VENV)/bin/python
PLATFORM ?= cpu
# Empty LAUNCHER: the platform's own (local for cpu/h100/h200, slurm for the multi-node ones).
LAUNCHER ?=
ARGS ?=
# `make tune`: the workload to tune (empty: the config's default, llama-tiny).
WORKLOAD ?=
# Empty OUT: the harness picks results/<timestamp>-<platform>.
OUT ?=
# Result folders (or record files) for `make submit`.
RESULTS ?=
# `make cluster-up`: an emulated cluster on this machine (testbed/; root): nodes, link rate, name, and how far
# node K's monotonic clock runs ahead of node1's, (K-1) x CLOCK_SKEW seconds (0: the one kernel's clock).
NODES ?= 2
LINK ?= 1gbit
CLOCK_SKEW ?= 0
CLUSTER ?= default
export SUITE_CLUSTER := $(CLUSTER)
# Optional extra index for torch only, e.g. https://download.pytorch.org/whl/cpu
# on a CPU-only host whose pip has no local CPU wheel (empty: pip's defaults).
TORCH_INDEX_URL ?=
# `make containers`: force an engine (docker, podman; empty: the first that works) and choose the
# images (empty: every image whose base can be had here; one named that cannot be built fails).
# SIF_ROUTE: how the .sif is built (def: apptainer from the definition written from the Dockerfile;
# oci-archive: converted from the engine's image; empty: oci-archive where an engine works, else def).
CONTAINER_ENGINE ?=
CONTAINER_IMAGES ?=
SIF_ROUTE ?=
# `make bench CONTAINER=podman` (or docker, apptainer): the ranks run in CONTAINER_IMAGE, the
# checkout and the results bind-mounted; empty: the host venv (or the platform's container.* settings).
CONTAINER ?=
IMAGE_KIND = $(if $(filter cpu cpu-cluster,$(PLATFORM)),cpu,gpu)
CONTAINER_IMAGE ?= $(if $(filter apptainer,$(CONTAINER)),build/containers/llm-pretrain-bench-$(IMAGE_KIND).sif,llm-pretrain-bench:$(IMAGE_KIND))

# `make venv`: gpu or cpu forces that lock; empty: a GPU platform or an NVIDIA GPU here picks the GPU lock.
VENV_KIND ?=

LOCK := requirements.lock
GPU_LOCK := requirements-gpu.lock
CONSTRAINTS := build/constraints.txt
STAMP := $(VENV)/.installed
# The lock this venv is made from (containers/venv_choice.py), and the lock chosen now: asked once,
# and only by a make that needs the venv.
VENV_RECORD := $(VENV)/.venv-lock
VENV_CHOICE_ARGS = --kind '$(VENV_KIND)' --platform '$(PLATFORM)' $(if $(filter file default undefined,$(origin PLATFORM)),,--platform-given)
VENV_LOCK = $(eval VENV_LOCK := $(shell $(PYTHON) -m containers.venv_choice $(VENV_CHOICE_ARGS) --query))$(VENV_LOCK)
# `make gpu-venv-check`: the throwaway venv (removed after) and its interpreter (empty: a Python 3.12 found here).
GPU_CHECK_VENV ?= build/gpu-venv-check
GPU_CHECK_PYTHON ?=
# `make test`: the integration tests that measure nothing, this many at a time.
INTEGRATION_WORKERS ?= 2
# The suite's own sources, compiled to bytecode by `make venv` (where PYTHONDONTWRITEBYTECODE is set, each
# `python -m harness` would otherwise compile what it imports, ~0.25 s a command on a 2-core box).
SOURCES := harness benchmarks contract testbed containers tests
# Single source of truth for the torch pin: the lock.
TORCH_VERSION := $(shell sed -n 's/^torch==\([^ ;]*\).*/\1/p' $(LOCK) 2>/dev/null)

# torch's JIT extension cache for the ranks.  The suite's runs JIT-build nothing
# (DeepSpeed's ops come from $(VENV)/deepspeed-ops/, see venv); the harness removes
# lock files left here by killed processes before it launches (harness/launch/preflight.py).
TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions
export TORCH_EXTENSIONS_DIR

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

.PHONY: help venv bench tune test perf submit nightly lock containers base-image clean distclean validate-model gpu-check \
	gpu-venv-check node-wheels cluster-up cluster-down cluster-shape cluster-status FORCE

help:
	@echo "Targets:"
	@echo "  venv       create $(VENV), install requirements.lock (torch $(TORCH_VERSION) first), build DeepSpeed's ops once"
	@echo "             (python -m benchmarks.node.ops build [--all]; runs never JIT-build them); on a node with an NVIDIA GPU,"
	@echo "             for a GPU PLATFORM or with VENV_KIND=gpu: $(GPU_LOCK) (CUDA torch, liger-kernel, torchao)"
	@echo "  gpu-venv-check  install $(GPU_LOCK) for real into a throwaway venv (Python 3.12), import torch, triton,"
	@echo "             liger_kernel, torchao; print versions, time and size; remove it (no GPU needed)"
	@echo "  bench      run the suite:  $(PY) -m harness bench platform=\$$PLATFORM [platform.launcher=\$$LAUNCHER] [out=\$$OUT] \$$ARGS"
	@echo "             (ARGS=--dry-run writes the Slurm batch scripts / rank commands and launches nothing)"
	@echo "  tune       three-step tuning: $(PY) -m harness tune platform=\$$PLATFORM [workload=\$$WORKLOAD] [out=\$$OUT] \$$ARGS"
	@echo "             (same OUT again: resumes; ARGS e.g. tune.strategy=grid tune.budget=6 tune.steps=[2,3])"
	@echo "  test       run the tests: tests/unit on every core (pytest -n auto), then the integration tests one at a time"
	@echo "  validate-model  the performance model against every published SC'25 PMBS cell (leave-one-out; exit 1 if a target is missed)"
	@echo "  gpu-check  on a node with NVIDIA GPUs: llama-440m under ZeRO 0-3 + nccl collectives, MFU, peak memory vs the model (~5 min)"
	@echo "  perf       the harness's own cost. First the benchmarks (python -m tests.benchmarks \$$PERF_ARGS, pytest-benchmark):"
	@echo "             training and the collective sweep vs plain loops, the probe and pulses; saved in .benchmarks/<machine"
	@echo "             class>, compared with its last run there; a missed bound fails make perf once the rest has run;"
	@echo "             then KD loss memory;"
	@echo "             the tuner's efficiency (cpu llama-tiny: exhaustive grid vs the default tuner, ~25 min);"
	@echo "             attribution (tests/perf/attribution.py); ZeRO-3's host cost per parameter fetch (~5 min)"
	@echo "             the compiled stack on cpu: compile seconds, compiled vs eager samples/s, loss parity (~4 min)"
	@echo "             the collective sweep on one host beside 0.5-1.5 CPUs of neighbour and the steal it met (~3 min)"
	@echo "  nightly    the nightly regression job: repeats, history store, reports; exit 1 on regression"
	@echo "  submit     add result records to reference_results/:  $(PY) -m harness submit \$$RESULTS \$$ARGS"
	@echo "  lock       regenerate requirements.lock from $(VENV): pip freeze + sha256 of every PyPI file (torch: no hash);"
	@echo "             then $(GPU_LOCK): pip's resolution of CUDA torch + liger-kernel + torchao, every file hashed"
	@echo "  containers build \$$CONTAINER_IMAGES with docker or podman from a hash-checked wheelhouse of the image's lock"
	@echo "             (cpu: $(LOCK), gpu: $(GPU_LOCK); no network in the build; base pinned by digest, else the"
	@echo "             local one of base-image); a .sif where apptainer exists; apptainer alone: each .sif built from"
	@echo "             build/containers/llm-pretrain-bench-<image>.def, written from the Dockerfile (route def)"
	@echo "  node-wheels  .whl/: what a GPU node without network lacks (deepspeed, hydra, ...; $(GPU_LOCK)'s pins, hashed)"
	@echo "             for its own Python 3.12: tests/gpu/*_node.sh install them there (docs/gpu-check.md)"
	@echo "  base-image as root: a local Debian bookworm base with debootstrap, for where no base can be pulled (~70 s)"
	@echo "  cluster-up     as root: an emulated cluster of \$$NODES nodes on this machine (network namespaces, links"
	@echo "                 shaped to \$$LINK, a real Slurm; CLOCK_SKEW=S: each node's monotonic clock S s ahead of the"
	@echo "                 last, as on separate machines); then make bench PLATFORM=cpu-cluster; stays up until cluster-down"
	@echo "  cluster-shape  set every node link of the running cluster to \$$LINK (e.g. LINK=250mbit)"
	@echo "  cluster-status its nodes, link and Slurm state;  cluster-down: stop it and remove everything it made"
	@echo "  clean      remove results/ and .cache/ (keeps $(VENV))"
	@echo "  distclean  clean, and also remove $(VENV) and build/"
	@echo "  help       this text (default goal)"
	@echo ""
	@echo "Variables (current value):"
	@echo "  PYTHON=$(PYTHON)   interpreter used to create the venv"
	@echo "  VENV=$(VENV)"
	@echo "  VENV_KIND=$(VENV_KIND)   gpu|cpu: the lock make venv installs; empty: $(GPU_LOCK) for a GPU PLATFORM or an NVIDIA GPU here"
	@echo "  PLATFORM=$(PLATFORM)   conf/platform/<name>.yaml"
	@echo "  LAUNCHER=$(LAUNCHER)   local|slurm; empty: the platform's (slurm for multi-node platforms)"
	@echo "  WORKLOAD=$(WORKLOAD)   conf/workload/<name>.yaml for tune; empty: llama-tiny"
	@echo "  OUT=$(OUT)   results directory; empty: results/<timestamp>-<platform>"
	@echo "  ARGS=$(ARGS)   extra Hydra overrides for bench, e.g. ARGS='suite=single'; submit options, e.g. ARGS='--replace --reason ...'"
	@echo "  RESULTS=$(RESULTS)   result folders (or record files) for submit"
	@echo "  NODES=$(NODES) LINK=$(LINK) CLUSTER=$(CLUSTER)   emulated cluster: nodes, link rate (tc: 1gbit, 250mbit, none), name"
	@echo "  TORCH_INDEX_URL=$(TORCH_INDEX_URL)   optional index for the torch install only"
	@echo "  CONTAINER_ENGINE=$(CONTAINER_ENGINE)   force a container engine for containers (fails if it does not work)"
	@echo "  CONTAINER_IMAGES=$(CONTAINER_IMAGES)   images for containers (empty: every image whose base can be had)"
	@echo "  SIF_ROUTE=$(SIF_ROUTE)   containers: def|oci-archive, how the .sif is built (empty: oci-archive where an engine works, else def)"
	@echo "  CONTAINER=$(CONTAINER)   bench/tune/nightly: run the ranks in CONTAINER_IMAGE with this runtime (podman, docker, apptainer)"
	@echo "  CONTAINER_IMAGE=$(CONTAINER_IMAGE)"
	@echo "  TORCH_EXTENSIONS_DIR=$(TORCH_EXTENSIONS_DIR)"
	@echo "  INTEGRATION_WORKERS=$(INTEGRATION_WORKERS)   test: the integration tests that measure nothing, this many at a time"

# The stamp is newer than the lock and pyproject.toml once the venv matches
# them; then `make venv` does nothing.  When out of date, pip re-checks the
# pins (seconds if already satisfied) and installs only what differs.
# torch goes in alone (--no-deps): its own dependencies (filelock, sympy, ...)
# are in the lock and come in at the locked versions in the second step.
# Second step: --require-hashes, so every file pip downloads must match a hash
# in the lock; torch's line has none (host-specific source), which pip accepts
# only because the torch installed first satisfies it.  --no-deps: the lock is
# the complete closure (`make lock` checks), nothing is resolved.
# The torch pin goes to pip through PIP_CONSTRAINT (not just -c) so that the
# isolated build environments of sdists (DeepSpeed is one) obey it too.
define CPU_INSTALL
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --no-deps $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) "torch==$(TORCH_VERSION)"
	@mkdir -p $(dir $(CONSTRAINTS))
	@echo "torch==$(TORCH_VERSION)" > $(CONSTRAINTS)
	PIP_CONSTRAINT=$(abspath $(CONSTRAINTS)) DS_BUILD_OPS=0 $(PY) -m pip install --require-hashes --no-deps -r $(LOCK)
endef
# The GPU lock hashes torch too (PyPI's CUDA build), so everything goes in at once: every file
# checked, nothing resolved (TORCH_INDEX_URL does not apply: another index's torch has other hashes).
define GPU_INSTALL
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@mkdir -p $(dir $(CONSTRAINTS))
	@echo "torch==$(TORCH_VERSION)" > $(CONSTRAINTS)
	PIP_CONSTRAINT=$(abspath $(CONSTRAINTS)) DS_BUILD_OPS=0 $(PY) -m pip install --require-hashes --no-deps -r $(GPU_LOCK)
endef
# The record names the lock chosen now (rewritten, and the venv removed, only when that changes).
$(VENV_RECORD): FORCE
	@$(PYTHON) -m containers.venv_choice $(VENV_CHOICE_ARGS) --record $@

FORCE:

# $$(VENV_LOCK): the chosen lock, asked only when the venv is needed (secondary expansion).
.SECONDEXPANSION:
$(STAMP): $(VENV_RECORD) $$(VENV_LOCK) pyproject.toml
	@test -n "$(TORCH_VERSION)" || { echo "error: no torch==<version> line in $(LOCK)" >&2; exit 1; }
	$(if $(filter $(GPU_LOCK),$(VENV_LOCK)),$(GPU_INSTALL),$(CPU_INSTALL))
	@echo $(VENV_LOCK) > $@

# DeepSpeed's ops for this venv (benchmarks/node/ops.py): built when missing or built
# for other torch/deepspeed versions, else nothing to do (0.1 s).  No stamp: the
# op folder's own manifests say what is built.
venv: $(STAMP)
	$(PY) -m benchmarks.node.ops build
	@$(PY) -m compileall -q $(SOURCES)

# DS_ACCELERATOR is cleared: the harness sets it per platform.
bench: venv
	env -u DS_ACCELERATOR $(PY) -m harness bench platform=$(PLATFORM) $(if $(CONTAINER),platform.container.runtime=$(CONTAINER) platform.container.image=$(CONTAINER_IMAGE)) $(if $(LAUNCHER),platform.launcher=$(LAUNCHER)) $(if $(OUT),out=$(OUT)) $(ARGS)

# The three-step tuning method; the same OUT resumes an interrupted tune (python -m harness tune --help).
tune: venv
	env -u DS_ACCELERATOR $(PY) -m harness tune platform=$(PLATFORM) $(if $(CONTAINER),platform.container.runtime=$(CONTAINER) platform.container.image=$(CONTAINER_IMAGE)) $(if $(WORKLOAD),workload=$(WORKLOAD)) $(if $(LAUNCHER),platform.launcher=$(LAUNCHER)) $(if $(OUT),out=$(OUT)) $(ARGS)

# The performance model against every published SC'25 PMBS cell (harness/model/validation.py).
validate-model: venv
	$(PY) -m harness model --validate $(ARGS)

# Non-zero pytest exit (including 5, "no tests collected") fails the target. tests/unit on every
# core (pytest-xdist: they start no ranks and measure nothing; 11 min -> 6 on 2 cores), then the
# integration tests in two phases. First those whose assertions read what the box measured (marker
# `measuring`), one at a time: a neighbour on the box's cores would move what they measure. Then the others,
# INTEGRATION_WORKERS at a time (pytest-xdist; tests/integration/units.py makes each module a unit of work,
# the real-Slurm modules and the image's tests one unit on one worker, the image's first build in its
# background): they fill the cores that a bench's single-threaded phases leave idle (docs/tests.md).
# A test that fails beside another worker runs again alone (its failure stays above in the log): the phase
# fails only if it fails alone too. A failing phase still lets the next run, so one run shows every failure;
# the first failure's status is kept.
FAILED_BESIDE := .cache/failed-beside.txt
test: venv
	unit=0; $(PY) -m pytest -q -n auto --durations=10 tests/unit || unit=$$?; \
	alone=0; $(PY) -m pytest -q --durations=30 -m measuring tests --ignore=tests/unit || alone=$$?; \
	beside=0; $(PY) -m pytest -q --durations=30 -m "not measuring" -n $(INTEGRATION_WORKERS) --dist loadfile \
		-p tests.integration.units --failed-to $(FAILED_BESIDE) --no-loadscope-reorder tests --ignore=tests/unit \
		|| beside=$$?; \
	if [ $$beside -eq 1 ] && [ -s $(FAILED_BESIDE) ]; then \
		echo "make test: $$(wc -l < $(FAILED_BESIDE)) test(s) above failed beside another worker; each runs again alone," \
			"and fails make test only if it fails alone too ($(FAILED_BESIDE))"; \
		beside=0; $(PY) -m pytest -q -m "not measuring" -p tests.integration.units --only-from $(FAILED_BESIDE) \
			tests --ignore=tests/unit || beside=$$?; fi; \
	for rc in $$unit $$alone $$beside; do test $$rc -eq 0 || exit $$rc; done

# On a node with NVIDIA GPUs: the paper's Model 1 under ZeRO 0-3 on this node's GPUs, every collective
# through nccl, MFU, measured vs predicted peak memory, the instrument's cost (harness/gpu_check.py).
gpu-check: venv
	$(PY) -m harness gpu-check $(if $(OUT),out=$(OUT)) $(ARGS)

# The benchmarks first (tests/benchmarks: harness_cost.py's and collective_cost.py's runs, the probe):
# pytest-benchmark's table, the comparison with the last saved run of this machine class, each figure
# against its bound. Their exit status is kept until every script below has printed.
perf: venv
	bench=0; $(PY) -m tests.benchmarks $(PERF_ARGS) || bench=$$?; \
	$(PY) tests/perf/kd_loss_memory.py; \
	$(PY) tests/perf/tune_efficiency.py; \
	$(PY) tests/perf/attribution.py; \
	$(PY) tests/perf/zero3_fetch_cost.py; \
	$(PY) tests/perf/compile_cost.py; \
	$(PY) tests/perf/gpu_noise.py; \
	$(PY) tests/perf/host_floor.py; \
	$(PY) tests/perf/busy_host.py; \
	mkdir -p .cache && $(PY) tests/perf/exchange_spells.py --rounds 30 --out .cache/exchange_spells.jsonl; \
	if [ $$bench -ne 0 ]; then echo "make perf: the benchmarks failed (exit $$bench): see MISS, REGRESSION or FAILED above" >&2; fi; \
	exit $$bench

# Records of RESULTS (folders or files) -> reference_results/<platform>.json; ARGS: --replace --reason ...
submit: venv
	$(PY) -m harness submit $(RESULTS) $(ARGS)

# The nightly regression job: exit status 1 when something regressed (see python -m harness nightly --help).
nightly: venv
	$(PY) -m harness nightly platform=$(PLATFORM) $(if $(CONTAINER),platform.container.runtime=$(CONTAINER) platform.container.image=$(CONTAINER_IMAGE)) $(if $(LAUNCHER),platform.launcher=$(LAUNCHER)) $(if $(OUT),out=$(OUT)) $(ARGS)

# An emulated multi-node cluster on this one machine (testbed/, standard library only, as root):
# a network namespace per node with its own hostname, a routed switch, tc-shaped links, munged +
# slurmctld + one slurmd per node. The cpu-cluster platform reaches its Slurm through
# the client script `testbed up` writes into the cluster's folder (platform.slurm.client_prefix; it does
# what `python3 -m testbed exec` does, in sh); CLUSTER picks a cluster by name.
cluster-up:
	$(PYTHON) -m testbed up --name $(CLUSTER) --nodes $(NODES) --link $(LINK) --clock-skew $(CLOCK_SKEW)

cluster-down:
	$(PYTHON) -m testbed down --name $(CLUSTER)

cluster-shape:
	$(PYTHON) -m testbed shape --name $(CLUSTER) --link $(LINK)

cluster-status:
	$(PYTHON) -m testbed status --name $(CLUSTER)

# containers/lock.py: pip list --format=freeze of the venv (never `@ file://`),
# local version tags (+cpu, +cu128) stripped so the lock is portable, the venv's
# own tooling (pip, wheel) left out (setuptools is kept: torch needs >=77); the
# closure checked for --no-deps (Python 3.11 and 3.12); then the sha256 of every
# file PyPI has for each pinned version (pypi.org JSON API), except torch.  A
# package not on PyPI fails the target and the old lock stays.
# Then containers/gpu_lock.py: requirements-gpu.lock from the new requirements.lock (pip's dry-run
# resolution of torch, liger-kernel and torchao for manylinux_2_28_x86_64 and CPython 3.11/3.12 from
# PyPI alone, every other version held to the CPU lock's; each pin's Requires-Dist kept as comments
# for the offline closure check; every PyPI file hashed).  Both are written to build/lock/ first and
# moved together, so a failure leaves both old locks.  The venv must be the CPU one: it is frozen.
lock:
	@test -x $(PY) || { echo "error: $(PY) not found; run 'make venv' first" >&2; exit 1; }
	@if [ "$$(cat $(VENV_RECORD) 2>/dev/null)" = "$(GPU_LOCK)" ]; then echo "error: $(VENV) holds $(GPU_LOCK); make lock freezes the CPU venv: make venv VENV_KIND=cpu (or VENV=<another folder> VENV_KIND=cpu) first" >&2; exit 1; fi
	@mkdir -p build/lock
	$(PY) -m containers.lock --out build/lock/$(LOCK)
	$(PY) -m containers.gpu_lock --cpu-lock build/lock/$(LOCK) --out build/lock/$(GPU_LOCK)
	mv build/lock/$(LOCK) build/lock/$(GPU_LOCK) .
	@# The venv is by construction what the new lock says.
	@if [ -e $(STAMP) ]; then touch $(STAMP); fi

# The GPU lock installed for real (containers/gpu_venv_check.py): a Python 3.12 venv at $(GPU_CHECK_VENV)
# made by `make venv`'s own GPU recipe from PyPI alone (this host's pip configuration set aside),
# then torch, triton, liger_kernel and torchao imported and their versions, the time and the size
# printed; the venv is removed.  No GPU needed (cuDNN's version is read from its library).
gpu-venv-check:
	@test -x $(PY) || { echo "error: $(PY) not found; run 'make venv' first" >&2; exit 1; }
	$(PY) -m containers.gpu_venv_check --venv $(GPU_CHECK_VENV) --make "$(MAKE)" $(if $(GPU_CHECK_PYTHON),--python $(GPU_CHECK_PYTHON))

# For a GPU node without network access (its own Python 3.12 with torch, CUDA and triton): the wheels
# it lacks, from $(GPU_LOCK) with every hash checked, the sdist-only ones built here, into .whl/
# (containers/node_wheels.py); tests/gpu/*_node.sh install them on the node.
node-wheels: venv
	$(PY) -m containers.node_wheels

# The images, built for real (containers/recipes.py): the engine that works (runc on hybrid
# cgroups, explicit ulimits), the Dockerfile's base pinned by digest or, where it cannot be pulled,
# the local one of base-image, the wheelhouse of the image's lock, the one make venv installs for
# that kind (cpu: $(LOCK), gpu: $(GPU_LOCK); containers/wheelhouse.py, every hash checked on the host;
# the build installs with --no-index and is labelled with that lock's sha256), then a smoke run of the
# image and, where apptainer exists, a .sif converted from the same image (route oci-archive).  The
# Apptainer definitions are written from the Dockerfiles first (containers/apptainer_def.py, spython's
# conversion: build/containers/llm-pretrain-bench-<image>.def); with apptainer and no engine, each .sif
# is built from its definition (route def).  The route is printed first; neither engine nor apptainer: exit 2.
containers: venv
	$(PY) -m containers.image_check
	$(PY) -m containers.apptainer_def
	$(PY) -m containers.recipes $(addprefix --image ,$(CONTAINER_IMAGES)) $(if $(CONTAINER_ENGINE),--engine $(CONTAINER_ENGINE)) $(if $(SIF_ROUTE),--route $(SIF_ROUTE))

base-image: venv
	$(PY) -m containers.base_image $(if $(CONTAINER_ENGINE),--engine $(CONTAINER_ENGINE)) $(if $(FORCE),--force)

clean:
	rm -rf results/ .cache/

distclean: clean
	rm -rf $(VENV) build/
