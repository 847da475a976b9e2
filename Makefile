# Two commands for a newcomer (see README):  make run  |  make test
# Both create .venv and install the lock requirements/dev.txt (every package pinned with its
# hash; torch is the CPU build, 2.13.0+cpu, from /opt/wheels), then the project itself.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.curvplan-installed
PYTEST_ARGS ?=

.PHONY: install run test test-fast lint openapi unasync lock bench clean-venv

install: $(STAMP)

# Re-run only when the dependency list changes (fast no-op otherwise). The set-up also
# installs Chromium (apt-get, when it is missing and we may) for the report-page tests.
$(STAMP): pyproject.toml setup.py requirements/dev.txt scripts/ensure_chromium.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes -r requirements/dev.txt
	$(PY) -m pip install --quiet --no-deps -e .
	bash scripts/ensure_chromium.sh
	touch $(STAMP)

run: install
	$(VENV)/bin/curvplan dev

# CI (.ci/run) runs this: the static checks first, then every test.
test: install lint
	CURVPLAN_TEST_ADMIN_URL="$$($(PY) scripts/ensure_postgres.py)" $(VENV)/bin/pytest -q $(PYTEST_ARGS)

# The fast loop: every test that starts no server/worker process and is not marked slow.
test-fast: install
	CURVPLAN_TEST_ADMIN_URL="$$($(PY) scripts/ensure_postgres.py)" $(VENV)/bin/pytest -q -m "not e2e and not slow" $(PYTEST_ARGS)

# ruff, the layering contracts (import-linter, pyproject.toml), mypy (pyproject.toml's
# files: the packages, the tests and the benchmarks) and the locks (against pyproject.toml
# and .venv; offline).
lint: install
	$(PY) scripts/lock.py --check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

openapi: install  # regenerate docs/openapi.json (the reviewed API contract)
	$(PY) scripts/openapi.py

unasync: install  # regenerate curvplan/client/sync.py from aio.py (the one implementation)
	$(PY) scripts/unasync.py

lock: install  # rewrite requirements/*.txt (after a dependency change; uv, needs PyPI)
	$(PY) scripts/lock.py

bench: install
	$(PY) benchmarks/bench_api.py

clean-venv:
	rm -rf $(VENV)
