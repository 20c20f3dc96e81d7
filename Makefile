# Developer and CI entry points. `make test` builds .venv, installs what the tests need from
# Debian when it is missing (redis-server, chromium), then runs pytest.

SHELL := /bin/bash
.DEFAULT_GOAL := test

# First interpreter found; the venv target checks it is >= 3.11.
PYTHON ?= $(firstword $(shell command -v python3.11 python3 2>/dev/null))
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed  # rsched and what running it needs (`make demo`)
TEST_STAMP := $(VENV)/.installed-test  # plus the test extras (pytest, Playwright, mypy...)
DOCS_STAMP := $(VENV)/.installed-docs  # plus the docs site's tools (MkDocs, Material...)
# `make demo PORT=8700` or `PORT=8700 make demo`: the API and dashboard port (default 8600).
PORT ?=
# The lowest redis-py that pyproject.toml allows (a test holds the two equal), and the tests that
# `make test` runs on it too: the ones that drive redis-py's connections, pools and pipelines,
# raw round trips included.
REDIS_PY_FLOOR := 6.0.0
FLOOR_VENV := .venv-redis-floor
FLOOR_TESTS := tests/unit/test_runner.py \
	tests/redis/test_scripts.py tests/redis/test_intake.py tests/redis/test_worker_outcomes.py \
	tests/redis/test_worker_reclaims.py tests/redis/test_worker_control.py \
	tests/redis/test_flusher.py tests/redis/test_membership.py tests/redis/test_dispatch.py \
	tests/redis/test_client.py \
	tests/processes/test_connections.py tests/processes/test_startup.py \
	tests/processes/test_scripts_cluster.py \
	tests/processes/test_cluster.py tests/processes/test_stale_worker.py \
	tests/processes/test_failover.py
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export NO_MKDOCS_2_WARNING := 1  # Material's notice about its successor, on every build

# $(call need,COMMAND,DEBIAN_PACKAGE): install the package from Debian when COMMAND is missing,
# as root or with password-less sudo; otherwise stop with one line saying what to install.
# A temporary policy-rc.d (exit 101) keeps the package's postinst from starting any service.
define need
@command -v $(1) >/dev/null 2>&1 || { \
	if [ "$$(id -u)" = 0 ]; then sudo=; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; else sudo=no; fi; \
	if [ "$$sudo" = no ] || ! command -v apt-get >/dev/null 2>&1; then \
		echo "install $(2) (Debian: apt-get install $(2))"; exit 1; \
	fi; \
	guard=; \
	if [ ! -e /usr/sbin/policy-rc.d ]; then \
		printf '#!/bin/sh\nexit 101\n' | $$sudo tee /usr/sbin/policy-rc.d >/dev/null; \
		$$sudo chmod 755 /usr/sbin/policy-rc.d; guard=1; \
	fi; \
	echo "$(1) not found: installing Debian package $(2)"; \
	rc=0; \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
		&& $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) </dev/null || rc=$$?; \
	if [ -n "$$guard" ]; then $$sudo rm -f /usr/sbin/policy-rc.d; fi; \
	[ "$$rc" = 0 ] || { echo "install $(2) (Debian: apt-get install $(2))"; exit 1; }; \
	command -v $(1) >/dev/null 2>&1 || { echo "$(2) installed but $(1) is not on PATH"; exit 1; }; \
}
endef

.PHONY: venv test-venv redis chromium test test-fast test-redis-floor bench demo lint clean chaos \
	docs docs-serve

venv: $(STAMP)
test-venv: $(TEST_STAMP)

$(STAMP): pyproject.toml
	@[ -n "$(PYTHON)" ] || { echo "install python3 (>= 3.11)"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
		|| { echo "need Python >= 3.11, $(PYTHON) is $$($(PYTHON) --version 2>&1)"; exit 1; }
	[ -x $(VPY) ] || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet -e .
	touch $@

$(TEST_STAMP): $(STAMP) constraints-test.txt
	$(VPY) -m pip install --quiet -e '.[test]' -c constraints-test.txt
	touch $@

# The docs site's tools (also among the test extras): what `make docs` needs on a fresh clone.
$(DOCS_STAMP): $(STAMP) constraints-test.txt
	$(VPY) -m pip install --quiet -e '.[docs]' -c constraints-test.txt
	touch $@

redis:
	$(call need,redis-server,redis-server)

chromium:
	$(call need,chromium,chromium)

test: test-venv redis chromium lint docs
	$(VPY) -m pytest $(PYTEST_ARGS)
	$(MAKE) test-redis-floor

# While working: tests/unit (no Redis) and tests/redis (one redis-server), not the fleets,
# clusters, Sentinel and browser of tests/processes. `make test` is the whole suite CI runs.
test-fast: test-venv redis
	$(VPY) -m pytest -p no:cacheprovider tests/unit tests/redis $(PYTEST_ARGS)

# The Redis-facing tests again with the oldest redis-py allowed, in a venv of its own.
$(FLOOR_VENV)/.installed-$(REDIS_PY_FLOOR): pyproject.toml constraints-test.txt
	@[ -n "$(PYTHON)" ] || { echo "install python3 (>= 3.11)"; exit 1; }
	[ -x $(FLOOR_VENV)/bin/python ] || $(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install --quiet -e '.[test]' -c constraints-test.txt \
		'redis[hiredis]==$(REDIS_PY_FLOOR)'
	touch $@

test-redis-floor: $(FLOOR_VENV)/.installed-$(REDIS_PY_FLOOR) redis
	$(FLOOR_VENV)/bin/python -m pytest -p no:cacheprovider $(FLOOR_TESTS)

# One Redis and a 3-master Redis Cluster, alternated, and the cost of WAIT (~3 min).
bench: test-venv redis
	$(VPY) loadtest/bench_engine.py --cluster

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link, an unknown
# anchor or a page left out of the nav fails.  `make test` runs it (a few seconds).
docs: $(DOCS_STAMP)
	$(VENV)/bin/mkdocs build --strict  # not --quiet: it hides the warnings --strict counts

docs-serve: $(DOCS_STAMP)
	$(VENV)/bin/mkdocs serve

demo: venv redis
	$(VENV)/bin/rsched dev $(if $(PORT),--port $(PORT))

# The long fault-checker run (docs/internals/fault-checker.md): CHAOS_SEEDS one after another, each
# CHAOS_DURATION seconds of load and faults, then draining and analysis (4 x 150 s: ~12 min),
# then CHAOS_CLUSTER_SEEDS on a 3-master + 3-replica Redis Cluster with master kills (~3 min).
# JSON reports on stdout and in tests/artifacts/chaos-report.json and chaos-cluster-report.json,
# each run's logs beside them; exits non-zero on any failure.  A 45-second run with a fixed seed
# and a 30-second cluster run are part of `make test`.
CHAOS_SEEDS ?= 1,2,3,4
CHAOS_CLUSTER_SEEDS ?= 5
CHAOS_DURATION ?= 150
chaos: test-venv redis
	mkdir -p tests/artifacts
	set -o pipefail; $(VPY) -m chaos suite --seeds $(CHAOS_SEEDS) --duration $(CHAOS_DURATION) \
		--out tests/artifacts/chaos | tee tests/artifacts/chaos-report.json
	set -o pipefail; $(VPY) -m chaos suite --redis cluster --seeds $(CHAOS_CLUSTER_SEEDS) \
		--duration $(CHAOS_DURATION) --out tests/artifacts/chaos \
		| tee tests/artifacts/chaos-cluster-report.json

lint: test-venv
	$(VENV)/bin/ruff check rsched tests loadtest chaos docs/hooks.py
	$(VENV)/bin/mypy
	MYPYPATH=tests $(VENV)/bin/mypy chaos

clean:
	rm -rf $(VENV) $(FLOOR_VENV) build dist site *.egg-info .pytest_cache .mypy_cache .ruff_cache tests/artifacts
	find . -name __pycache__ -type d -prune -not -path './.git/*' -exec rm -rf {} +
