# Everything a fresh machine needs, from nothing: a virtual environment, the pinned Python
# packages, and the JVM jars cached under .cache/jars (no network needed afterwards).
PYTHON    ?= python3.11
VENV      := .venv
BIN       := $(VENV)/bin
INSTALLED := $(VENV)/.installed
JARS      := .cache/jars/.complete
BROKER    := .cache/jars/kafka-broker/.complete
CLASSES   := .cache/jars/classes.jsa
LOGSTORE  := .cache/jars/lakehouse-logstore.jar
LOCALFS   := .cache/jars/lakehouse-localfs.jar
VALIDATION := .cache/jars/lakehouse-validation.jar
DEBIAN    := .cache/.debian-packages
MAVEN     := .cache/.maven-resolved
S3SERVER  := .cache/s3-server/.complete
ROOT      ?= data

.PHONY: setup setup-parts test lint run run-once bench chaos clean

# The parts are mostly downloads that do not wait for each other (PyPI, Maven Central,
# Debian's archive): make fetches them side by side, each part's output kept together.
setup:
	@$(MAKE) --no-print-directory --jobs=4 --output-sync=target setup-parts

setup-parts: $(INSTALLED) $(JARS) $(LOGSTORE) $(LOCALFS) $(VALIDATION) $(BROKER) $(CLASSES) $(DEBIAN) \
	$(S3SERVER)

$(INSTALLED): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --constraint constraints.txt --editable '.[dev]'
	touch $@

# Maven's own cache filled first, without waiting for the venv: the copies below then
# download nothing.
$(MAVEN): jars/pom.xml jars/kafka-broker/pom.xml
	mvn -q -B -f jars/pom.xml dependency:resolve
	mvn -q -B -f jars/kafka-broker/pom.xml dependency:resolve
	mkdir -p $(dir $@) && touch $@
$(JARS): jars/pom.xml $(INSTALLED) $(MAVEN)
	scripts/fetch-jars.sh jars/pom.xml .cache/jars $(BIN)/python

# The project's Java, each folder of jars/ with a src/ into lakehouse-<folder>.jar: Delta's
# log store for local disk with a listing that does not grow with the log's folder
# (jars/logstore), Hadoop's local file system without a process per rename (jars/localfs)
# and silver's record reader (jars/validation). Built into the jar cache,
# so the refresh above removes them and this builds them again.
.SECONDEXPANSION:
.cache/jars/lakehouse-%.jar: $(JARS) $$(wildcard jars/$$*/src/lakehouse/*.java) \
		scripts/build-jar.sh
	scripts/build-jar.sh $* .cache/jars $(BIN)/python

# The Kafka broker of `lakehouse services start kafka`, in a folder of the jar cache: the
# Spark jars' refresh above empties the cache, and this follows it.
$(BROKER): jars/kafka-broker/pom.xml $(JARS)
	scripts/fetch-jars.sh jars/kafka-broker/pom.xml .cache/jars/kafka-broker

# The S3-compatible server of `lakehouse services start s3` (moto's, from PyPI), in a
# virtual environment of its own: boto's botocore needs python-dateutil 2, Airflow pins 4.
$(S3SERVER): scripts/s3-server-requirements.txt scripts/s3-server-constraints.txt
	rm -rf $(dir $@) && $(PYTHON) -m venv $(dir $@)
	$(dir $@)bin/pip install --quiet --requirement scripts/s3-server-requirements.txt \
		--constraint scripts/s3-server-constraints.txt
	touch $@

# The Spark driver's class-data archive (spark_jobs/class_archive.py): a cold Spark command
# takes about a fifth less time. Built again whenever the venv, the jars or the JDK change.
JAVA_BINARY := $(realpath $(shell command -v java))
$(CLASSES): $(INSTALLED) $(JARS) $(LOGSTORE) $(LOCALFS) $(VALIDATION) $(JAVA_BINARY)
	$(BIN)/python -m spark_jobs.class_archive

# Debian's packages, in one install: chromium (the data quality report and the Airflow UI are
# tested in a real headless browser), PostgreSQL's server (`lakehouse services start
# postgres`: Airflow's database in production; the Airflow DAG tests run on it) and
# docker-compose (checks docker/compose.yaml against Compose's schema without a Docker
# engine, tests/test_docker.py; nothing runs a container).
$(DEBIAN): scripts/install-debian.sh
	scripts/install-debian.sh chromium /usr/bin/chromium \
		postgresql '/usr/lib/postgresql/*/bin/postgres' docker-compose /usr/bin/docker-compose
	mkdir -p $(dir $@) && touch $@

lint: $(INSTALLED)
	$(BIN)/ruff check .

test: setup lint
	$(BIN)/pytest

# The lakehouse on the embedded default, under real Airflow: airflow standalone with the
# DAGs unpaused, a live feed of messy events, the streams running. Ctrl-C stops it all.
run: setup
	$(BIN)/lakehouse demo --root $(ROOT)

# The same pipeline once, without Airflow: messy events into the landing zone, streamed
# through every layer, then the accounting.
run-once: setup
	$(BIN)/lakehouse generate --root $(ROOT) --events 20000
	$(BIN)/lakehouse stream --root $(ROOT) --available-now
	$(BIN)/lakehouse audit --root $(ROOT) --expected

# The parts issue 13 asks of every run by default; BENCH_PARTS=all (or a list) for more.
bench: setup
	$(BIN)/python -m spark_jobs.bench --root .cache/bench --results bench/results \
		$(if $(BENCH_PARTS),--parts $(BENCH_PARTS))

# The chaos battery: the streaming driver SIGKILLed 20 times while events land, then drained
# and checked (nothing lost, nothing duplicated). make test runs a short one (3 kills).
chaos: setup
	rm -rf .cache/chaos
	$(BIN)/lakehouse chaos --root .cache/chaos --faults 20

clean:
	rm -rf $(VENV) .cache $(ROOT)
