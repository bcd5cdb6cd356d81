# statetable: `make run` to try it, `make test` to prove it.
# Every install step lives here; nothing needs to be installed by hand beyond
# Python 3.11, Java 17 and Maven.

PYTHON      ?= python3
UV_VERSION  := 0.13.8
UV          := .tools/bin/uv
VENV        := .venv
STATETABLE  := $(VENV)/bin/statetable
export UV_PROJECT_ENVIRONMENT := $(VENV)
export UV_LINK_MODE := copy
# Bytecode compiled at install: every Spark worker daemon and job process starts from .pyc, also
# where PYTHONDONTWRITEBYTECODE keeps Python from caching it (a cold batch compiled pandas,
# numpy and pyspark from source in each process).
export UV_COMPILE_BYTECODE := 1

.PHONY: setup run test stack-down bench bench-peers bench-nexmark clean chromium jvm-archive

setup: $(VENV)/.synced .cache/jars/.fetched

$(UV):
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

$(VENV)/.synced: uv.lock pyproject.toml | $(UV)
	$(UV) sync --frozen --extra stack
	$(VENV)/bin/python -m compileall -q -j 0 state catalog spark_jobs ops serving plugins deploy dags
	touch $@

.cache/jars/.fetched: deploy/maven/kafka-broker.pom.xml deploy/maven/spark-extras.pom.xml deploy/maven/schema-registry.pom.xml deploy/maven/kafka-connect.pom.xml deploy/jars.py $(VENV)/.synced
	$(VENV)/bin/python -m deploy.jars fetch
	touch $@

# A class-data archive of the jobs' driver JVMs (spark_jobs/engine/jvm_archive.py): a job whose driver
# runs here (a local session, spark-submit) starts from it with ~5 CPU s less. Building it costs
# ~80 s and ~110 CPU s on 2 cores, so `make test` (hundreds of local jobs) builds it and `make run`
# does not: on the stack every job runs on the Spark Connect server, and a newcomer's first run
# waited 80 s for an archive nothing of it used. `make jvm-archive` builds it on its own.
.cache/jvm/.built: .cache/jars/.fetched spark_jobs/engine/jvm_archive.py
	$(VENV)/bin/python -m spark_jobs.engine.jvm_archive
	touch $@

jvm-archive: setup .cache/jvm/.built

run: setup
	$(STATETABLE) stack up --cdc
	$(STATETABLE) smoke
	$(STATETABLE) demo

# Headless Chromium for the UI screenshot test, from Debian's packages.
chromium:
	@command -v chromium >/dev/null || apt-get install -y --no-install-recommends chromium \
		|| (apt-get update && apt-get install -y --no-install-recommends chromium)

# Three pytest-xdist workers, each with a stack of its own (tests/conftest.py), whole modules each,
# in the order tests/conftest.py gives them (longest first), not xdist's (most tests first).
# On 2 cores a third worker runs while the others' processes start and wait (two left ~10% idle).
# The 30 slowest steps are printed at the end: where the run's time goes.
PYTEST_ARGS ?= -n 3 --dist loadfile --no-loadscope-reorder --durations=30

test: setup .cache/jvm/.built chromium
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

stack-down:
	$(STATETABLE) stack down

# Each benchmark peer gets its own venv from its own lock file (Flink pins old
# pyarrow and numpy), plus Flink's Kafka connector jar from Maven Central.
BENCH_PEERS := quix flink

bench-peers: setup
	@for peer in $(BENCH_PEERS); do \
		UV_PROJECT_ENVIRONMENT=$(CURDIR)/.bench/venvs/$$peer $(UV) sync --frozen --quiet --project bench/peers/$$peer || exit 1; \
	done
	$(VENV)/bin/python -m deploy.jars fetch flink

bench: bench-peers
	$(VENV)/bin/python -m bench.run_all $(BENCH_ARGS)

# Nexmark over Kafka beside Flink SQL and Spark Structured Streaming, every answer checked against pandas (bench/nexmark).
bench-nexmark: bench-peers
	$(VENV)/bin/python -m bench.nexmark --out docs/benchmarks/nexmark.json $(NEXMARK_ARGS)

clean:
	rm -rf $(VENV) .tools .cache .stack .bench
