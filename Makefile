# Every target does its own set-up and is idempotent: `make test` on a fresh Debian machine
# (as root) installs the system packages and the venv it needs.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# Debian packages the tests need (real Slurm, munge, Alertmanager, promtool, shellcheck, ...)
DEB_PACKAGES := slurmctld slurmd slurm-client slurmrestd slurm-wlm-jwt-plugin \
	slurm-wlm-basic-plugins munge libslurm-dev gcc libc6-dev make lua5.3 \
	prometheus-alertmanager prometheus shellcheck systemd debootstrap zstd \
	postgresql util-linux procps docker.io docker-compose \
	libmunge-dev libjson-c-dev libhttp-parser-dev libyaml-dev libjwt-dev liblua5.3-dev \
	pkg-config python3-dev
# ^ the last two lines: build deps of Slurm 25.11 from source (devcluster --slurm 25.11, pyslurm)
# torch CPU build: this exact version is on local disk here; an unpinned torch pulls CUDA (GBs).
TORCH_CPU ?= torch==2.13.0

.PHONY: setup system-packages venv pyslurm test lint fmt demo bench reliability clean \
	docker-engine docker-image docker-up docker-down

setup: system-packages venv pyslurm docker-engine

# The docker test cluster (docker/README.md). docker-engine starts our own dockerd when none
# answers (data root /var/lib/babysitter-docker); docker-down stops only what it started.
docker-engine: system-packages
	@if [ "$$(id -u)" = 0 ] && command -v dockerd >/dev/null; then python3 docker/cluster.py daemon-up; \
	else echo "not root or no dockerd: the docker test cluster cannot run here"; fi

docker-image: setup
	$(PY) docker/cluster.py image

docker-up: setup
	$(PY) docker/cluster.py up

docker-down:
	python3 docker/cluster.py daemon-down

system-packages: .make/system-packages
.make/system-packages: Makefile
	@mkdir -p .make
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	  if [ -n "$$missing" ]; then \
	    echo "installing Debian packages: $$missing"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends --no-upgrade $$missing >/dev/null; \
	  fi; \
	else echo "not root on Debian: install these yourself: $(DEB_PACKAGES)"; fi
	@touch $@

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,postgres]'
	$(PY) -m pip install -q '$(TORCH_CPU)' || echo "warning: torch CPU build not installed; SDC torch backend untested"
	@touch $@

# Slurm 25.11 built from ../shared/vendor's source (once per machine, cached by its sha256) and
# the real pyslurm built against it into the venv (cached wheel). Without the source: one line
# saying where to put it, and the 25.11 tests skip with that line.
pyslurm: system-packages venv
	@$(PY) -m babysitter.devcluster.source --pyslurm || true

lint: venv
	$(VENV)/bin/ruff check babysitter tests bench
	$(VENV)/bin/ruff format --check babysitter tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

fmt: venv
	$(VENV)/bin/ruff format babysitter tests bench
	$(VENV)/bin/ruff check --fix babysitter tests bench

test: setup lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/babysitter demo

reliability: setup
	BABYSITTER_RELIABILITY=full $(VENV)/bin/pytest -m reliability -s -v

bench: setup
	$(PY) -m bench.run

clean:
	rm -rf .make build *.egg-info .pytest_cache .mypy_cache .ruff_cache
