# Two commands set everything up from a bare clone: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | cksum | cut -d' ' -f1)
UV      := uv==0.13.8

.PHONY: setup demo demo-lakehouse test test-slow smoke bench lock clean airflow chaos lint format docs

$(STAMP): requirements.lock pyproject.toml infra/system-deps.sh infra/check_install.py infra/web-assets/package-lock.json
	bash infra/system-deps.sh
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(UV)
	# An older lock's pyspark-client owned pyspark's files too, and removing it deletes them: both go, and
	# the sync puts pyspark back from uv's cache. (--reinstall-package would also refresh the cache, and so
	# rebuild pyspark's sdist, 1.4 GB more of cache, at every setup.)
	if $(BIN)/uv pip show -q --python $(BIN)/python pyspark-client > /dev/null 2>&1; then \
	  $(BIN)/uv pip uninstall -q --python $(BIN)/python pyspark-client pyspark; fi
	$(BIN)/uv pip sync -q --python $(BIN)/python requirements.lock
	$(BIN)/uv pip install -q --python $(BIN)/python --no-deps -e .
	# Bytecode now, not at every start: uv does not compile by default, and where the environment
	# forbids writing it (PYTHONDONTWRITEBYTECODE) every process compiles all it imports (a CLI call
	# took 12-14 s instead of 2.5-3 s on a busy machine).
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib storage pipelines validations dags icelog infra > /dev/null
	$(BIN)/python -m infra.check_install   # two distributions owning one file: fail here, not at import time
	cd infra/web-assets && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error   # Data Docs assets, offline
	rm -f $(VENV)/.installed-*; touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/python -m infra.demo

# The same job on the lakehouse profile: a PostgreSQL catalog with an S3 warehouse (SeaweedFS), both
# servers started under .icelog/lakehouse and stopped at the end.
demo-lakehouse: setup
	$(BIN)/python -m infra.demo --lakehouse

# Two pytest-xdist workers (the machines have 2 cores; most tests wait on processes, JVMs and Airflow):
# about 32 minutes here at load 4-8. Each test file on one worker (--dist loadfile): a module's fixtures (an
# Airflow home, a DAG run) start once. Every server a test starts picks free ports and a directory of its
# own. TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile

# The wheel as a team installs it: built from the checkout, installed with no extra into fresh venvs on
# Python 3.12 and 3.13 (and with [airflow] on 3.13), then used (infra/wheel_smoke.py). CI runs it after make test.
smoke: setup
	$(BIN)/python -m infra.wheel_smoke

# ruff, configured in pyproject.toml as pyiceberg configures it; CI runs `make lint`.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The documentation site (docs/, mkdocs.yml) into site/: offline, warnings are errors.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The long versions of the slowest scenarios (minutes each on 2 cores).
test-slow: setup
	$(BIN)/python -m pytest -m slow

# A full run prints one table (figure, reference, ratio, target, met) and rewrites BENCHMARKS.md's generated
# section. BENCH_ARGS="--quick" is CI's smoke run (small sizes, JSON only: the runner cannot rot); --only NAME,...
BENCH_ARGS ?=
bench: setup
	$(BIN)/python -m tests.bench.run $(BENCH_ARGS)

CHAOS_ARGS ?= --duration 600 --catalog all
chaos: setup
	$(BIN)/python -m tests.chaos.run $(CHAOS_ARGS)

# Re-resolve the pinned lock after changing dependencies in pyproject.toml: every extra, for the
# Python `make test` runs on (3.11). The existing pins are kept where the ranges still allow them.
lock:
	$(BIN)/uv pip compile -q pyproject.toml --all-extras --python-version 3.11 --excludes infra/lock-excludes.txt -o requirements.lock

clean:
	rm -rf $(VENV) .icelog site

# The Airflow UI (standalone: scheduler, API server, DAG processor) on the icelog DAGs.
airflow: setup
	$(BIN)/python -m infra.airflow standalone
