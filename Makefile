# Every target does its own set-up, only the set-up it needs, and is idempotent: on a fresh
# Debian machine (as root) `make demo` installs what the demo runs on, `make test` what the
# whole suite needs, `make test-unit` only the venv.
SHELL := /bin/bash
# Compiled modules and pytest's rewritten test modules are cached (__pycache__, ignored by git):
# with PYTHONDONTWRITEBYTECODE set, every pytest worker and every CLI process a test starts
# compiles the sources again (half of a `make test-unit` collection).
unexport PYTHONDONTWRITEBYTECODE
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (1: one process). The suite mostly waits on daemons:
# on 2 cores, 3 workers took the warm run from 917 s (one process) to 417-436 s with lint, the
# 25.11 and the docker tests after the rest (4 workers then: 468 s). With all of them in one run
# and the longest work units first (tests/xdist_groups.py): 4 workers 329, 332, 335 s at load
# 1.0-6.8 (3 workers, loadgroup's order: 401, 423 s). Tests sharing one cluster fixture stay on
# one worker (tests/xdist_groups.py).
TEST_WORKERS ?= 4

# Debian packages, per target. The demo runs on the host's Slurm 22.05 (devcluster): daemons,
# munge, the compiler and Slurm headers for the SPANK plugin and the fake NVML library, and Lua
# for job_submit.lua.
DEB_DEMO := slurmctld slurmd slurm-client slurmrestd slurm-wlm-basic-plugins munge \
	libslurm-dev gcc libc6-dev lua5.3 procps util-linux
# The suite on top: other Slurm versions (debootstrap roots, zstd cache), Alertmanager and
# promtool, shellcheck and systemd-analyze, PostgreSQL, the docker test cluster, the system
# browser and its driver for the status page's headless test, and /usr/bin/time (benchmarks
# measure one-shot runs with it).
DEB_TEST := $(DEB_DEMO) slurm-wlm-jwt-plugin make prometheus-alertmanager prometheus \
	shellcheck systemd debootstrap zstd postgresql docker.io docker-compose \
	chromium chromium-driver time
# `make package`: dpkg-deb comes with every Debian; rpmbuild (the .rpm packages) from `rpm`.
DEB_PACKAGE := rpm
# Build deps of Slurm 25.11 from source (devcluster --slurm 25.11) and of pyslurm against it.
DEB_SLURM_BUILD := make libmunge-dev libjson-c-dev libhttp-parser-dev libyaml-dev libjwt-dev \
	liblua5.3-dev pkg-config python3-dev
# torch CPU build: this exact version is on local disk here; an unpinned torch pulls CUDA (GBs).
TORCH_CPU ?= torch==2.13.0

.PHONY: setup venv venv-demo slurm2511 package test test-unit lint fmt demo bench reliability clean \
	docker-engine docker-image docker-up docker-down gpu-check

# Everything `make test` needs, installed up front (the test target builds the slow parts in
# the background itself).
setup: .make/deb-test .make/deb-slurm-build .make/deb-package venv slurm2511 docker-engine

# Installs the missing packages of a list (as root with apt), or says which to install.
define deb_install
	@mkdir -p .make
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	  if [ -n "$$missing" ]; then \
	    echo "installing Debian packages:" $$missing; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get update -q >/dev/null && \
	    apt-get install -y -q --no-install-recommends --no-upgrade $$missing >/dev/null; \
	  fi; \
	else echo "not root on Debian: install these yourself: $(1)"; fi
	@touch $@
endef

.make/deb-demo: Makefile
	$(call deb_install,$(DEB_DEMO))
.make/deb-test: Makefile
	$(call deb_install,$(DEB_TEST))
.make/deb-slurm-build: Makefile
	$(call deb_install,$(DEB_SLURM_BUILD))
.make/deb-package: Makefile
	$(call deb_install,$(DEB_PACKAGE))

# The demo's venv: the package and its runtime dependencies only (no torch, no pyslurm).
venv-demo: $(VENV)/.installed-demo
$(VENV)/.installed-demo: pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -e .
	@# bytecode, as a wheel install has it: a shell with PYTHONDONTWRITEBYTECODE set would
	@# otherwise compile every module on every `babysitter check` (it reads .pyc, only never
	@# writes them)
	$(PY) -m compileall -q babysitter >/dev/null
	@touch $@

# The developer's venv: dev tools, the Postgres driver, and torch's CPU build (the SDC check's
# torch backend is tested; a failed install fails here, it never turns into skipped tests).
venv: $(VENV)/.installed
$(VENV)/.installed: $(VENV)/.installed-demo
	$(PY) -m pip install -q -e '.[dev,postgres]'
	$(PY) -m pip install -q '$(TORCH_CPU)'
	@touch $@

# Slurm 25.11 built from ../shared/vendor's source (once per machine, cached by its sha256) and
# the real pyslurm built against it into the venv (cached wheel). A missing source or a failed
# build fails this target with the line that says why.
slurm2511: .make/deb-test .make/deb-slurm-build venv
	$(PY) -m babysitter.devcluster.source --pyslurm

# The docker test cluster (docker/README.md). docker-engine starts our own dockerd when none
# answers (data root /var/lib/babysitter-docker); docker-down stops only what it started.
docker-engine: .make/deb-test venv
	@if [ "$$(id -u)" = 0 ] && command -v dockerd >/dev/null; then $(PY) docker/cluster.py daemon-up; \
	else echo "not root or no dockerd: the docker test cluster cannot run here"; exit 1; fi

docker-image: docker-engine
	$(PY) docker/cluster.py image

docker-up: docker-engine
	$(PY) docker/cluster.py up

docker-down:
	python3 docker/cluster.py daemon-down

# dist/: babysitter, babysitter-agent and babysitter-controller as .deb (and .rpm with rpmbuild):
# a venv under /opt/babysitter built with Debian 12's Python 3.11, the units, the user, the
# example config (packaging/build.py says why the venv is built here, not on the node).
package: .make/deb-package venv
	$(PY) packaging/build.py --out dist

lint: venv
	$(VENV)/bin/ruff check babysitter tests bench
	$(VENV)/bin/ruff format --check babysitter tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

fmt: venv
	$(VENV)/bin/ruff format babysitter tests bench
	$(VENV)/bin/ruff check --fix babysitter tests bench

# The whole suite, none skipped (tests/run-suite.sh: lint and the builds in the background, the
# suite on xdist workers; the 25.11 and docker tests after it only while their build still runs).
test: .make/deb-test .make/deb-slurm-build .make/deb-package venv
	VENV=$(VENV) TEST_WORKERS=$(TEST_WORKERS) tests/run-suite.sh $(PYTEST_ARGS)

# In-process tests: no Slurm, no Postgres, no docker, no program started (their tier comes
# from their fixtures and code, tests/conftest.py). Two xdist workers, the longest work first
# (tests/xdist_groups.py): idle, 23.4 s against 34.6 s in one process (each worker collects
# the suite again, but a third of the unit tier's wall time is tests waiting on a loop).
UNIT_WORKERS ?= 2
test-unit: venv
	$(VENV)/bin/pytest -m unit -q -n $(UNIT_WORKERS) $(PYTEST_ARGS)

demo: .make/deb-demo venv-demo
	$(VENV)/bin/babysitter demo

reliability: setup
	BABYSITTER_RELIABILITY=full $(VENV)/bin/pytest -m reliability -s -v

bench: setup
	$(PY) -m bench.run

# babysitter against a real NVIDIA GPU and driver (bench/gpu_check.py; README "Limits"). Without a
# GPU it stops at once with one line, before any set-up (the preflight is standard library only).
# On a GPU machine torch must be a CUDA build: the venv's CPU build is replaced by TORCH_GPU;
# CUPY (e.g. cupy-cuda12x) adds the cupy backend.
TORCH_GPU ?= torch
CUPY ?=
gpu-check:
	@python3 bench/gpu_check.py --preflight
	@$(MAKE) --no-print-directory venv
	@$(PY) -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null || \
	  { $(PY) -m pip uninstall -q -y torch && $(PY) -m pip install -q '$(TORCH_GPU)'; }
	@if [ -n '$(CUPY)' ]; then $(PY) -m pip install -q '$(CUPY)'; fi
	$(PY) -m bench.gpu_check

clean:
	rm -rf .make build *.egg-info .pytest_cache .mypy_cache .ruff_cache
