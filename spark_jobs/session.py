"""The one SparkSession factory: tests, the CLI and spark-submitted jobs all come here."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from spark_jobs import class_archive
from spark_jobs.config import LOOPBACK, LOOPBACK_NAMES, ConfigError, Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


# Compiled classes Spark keeps for reuse (its default 100); each holds some tens of KB.
CODEGEN_CACHE_ENTRIES = 2_000


def spark_conf(settings: Settings) -> dict[str, str]:
    """Every Spark setting of the project, in one place (also used for ``spark-submit``)."""
    jars = sorted(settings.jars_dir.glob("*.jar"))
    if not jars:
        raise ConfigError(
            f"no Delta jars in {settings.jars_dir}: run 'make setup' once in the checkout (it "
            f"caches them), or set jars_dir (LAKEHOUSE_JARS_DIR) to a folder holding them")
    if not any(jar.name == VALIDATION_JAR for jar in jars):
        raise ConfigError(
            f"no {VALIDATION_JAR} in {settings.jars_dir} (silver's record reader, "
            f"jars/validation): run 'make setup' once in the checkout, or build it into that "
            f"folder with scripts/build-jar.sh validation {settings.jars_dir} PYTHON")
    return _class_path(jars, settings) | {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # Event time is UTC by contract; event_date must not depend on the machine's zone.
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.sql.sources.parallelPartitionDiscovery.parallelism":
            str(settings.file_listing_parallelism),
        # A record with a repeated key ({"a":1,"a":2}) must not fail a whole batch.
        "spark.sql.mapKeyDedupPolicy": "LAST_WIN",
        # RocksDB keeps streaming state off the JVM heap and checkpoints it incrementally.
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # The project caches a micro-batch, a rebuild's range or an audit's pass, each read a
        # few times and dropped: encoding the cached columns cost more than it saved
        # (validating and caching a million records: 16.5 s, 13 s without).
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        # Each of the project's row_number() = 1 windows (an event's first delivery, a
        # click's latest view) ranks groups of a few rows: Spark's partial top-k before the
        # shuffle (WindowGroupLimit) sorted every row once more and dropped almost none. The
        # first deliveries of a million records: 2.7-3.0 s without it, 3.3-3.4 s with it.
        "spark.sql.optimizer.windowGroupLimitThreshold": "-1",
        # The streams' micro-batches plan the same generated code again and again, more of it
        # than Spark's cache of 100 compiled classes holds: under a feed of 1,600 events a
        # second the driver compiled 4,177 classes in 150 s (20 ms each in Janino, then the
        # JIT's work on each new class), 762 with room for 2,000 (p99 latency 61.8 -> 42.3
        # s, one trial each). A static setting: it holds for the session's life.
        "spark.sql.codegen.cache.maxEntries": str(CODEGEN_CACHE_ENTRIES),
        # The streams share the driver (six since the alert stream), each in a pool of its
        # own (``streaming``): FAIR lets the short jobs of one run beside another's long one
        # instead of queueing behind it (five streams, a feed of 2,000 events/s on 2 cores:
        # latency p50 22 s, p99 29 s, against 31 s and 37 s under FIFO, side by side).
        "spark.scheduler.mode": "FAIR",
        # Progress goes to the project's own table; the UI would only cost a port and memory.
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Delta's state of a table version, rebuilt for each new version: see the setting.
        "spark.databricks.delta.snapshotPartitions": str(settings.delta_snapshot_partitions),
        "spark.sql.warehouse.dir": str(settings.root / "warehouse"),
        "spark.driver.memory": settings.spark_driver_memory,
        # Python on the executors (a UDF, a stateful function) runs this interpreter, with
        # the project's packages, rather than the first python3 on the PATH.
        "spark.pyspark.python": executor_python(settings),
    } | _log_store(jars) | _local_file_system(jars, settings) | _object_store(settings) \
      | _java_options(settings) | _driver_address(settings) | _shipped_code(settings)


def _master_on_loopback(settings: Settings) -> bool:
    """A local master, or a cluster on this machine's loopback (`lakehouse services start
    spark`), whose executors reach a driver listening on loopback."""
    from urllib.parse import urlparse

    master = settings.spark_master
    return master.startswith("local") or urlparse(master).hostname in LOOPBACK_NAMES


LOG_STORE_JAR = "lakehouse-logstore.jar"
# Hadoop's local file system without its processes (``_local_file_system``).
LOCAL_FS_JAR = "lakehouse-localfs.jar"
# Silver's validation reads each record with a function of its own (jars/validation).
VALIDATION_JAR = "lakehouse-validation.jar"


def _log_store(jars: list[Path]) -> dict[str, str]:
    """Delta's log store for local disk (``jars/logstore``, built by ``make setup``): a
    streaming table gains a commit every few seconds and Delta keeps 30 days of them; Hadoop's
    own listing of the log's folder, which Delta makes on every snapshot update and commit,
    took 0.11-0.18 s at 10,000 entries, where this one reads the names and looks up only the
    newest (``gold_growth`` part of ``make bench``).

    On S3 (s3a://), the project's store commits with a conditional PUT, so that several
    drivers (a stream, a reprocess) may commit to one table: Delta's own S3 store is safe
    for one driver only."""
    if not any(jar.name == LOG_STORE_JAR for jar in jars):
        return {}
    return {"spark.delta.logStore.file.impl": "lakehouse.FolderListingLogStore",
            "spark.delta.logStore.s3a.impl": "lakehouse.ConditionalPutS3LogStore"}


def _runs_in_the_driver(settings: Settings) -> bool:
    """Whether the executors are threads of the driver's JVM (a local master)."""
    return settings.spark_master.startswith("local")


def _class_path(jars: list[Path], settings: Settings) -> dict[str, str]:
    """Where the jars are loaded from. A cluster's executors get them as ``spark.jars``,
    which Spark ships. A local master's executors share the driver's JVM, so the jars go on
    its class path from the start: Spark would otherwise copy each of ``spark.jars`` into a
    folder of the executor's at every start (55 files, 36 MB), and the local file system
    below must be there before Spark adds them (Hadoop looks it up while the session
    starts). A cold `lakehouse sql` took 8.4-8.6 s against 9.0-9.6 s, a cold `lakehouse
    stream --available-now` of 600 events 36.9-37.7 s against 37.7-38.7 s (alternated, each
    with its own class archive)."""
    if _runs_in_the_driver(settings):
        return {"spark.driver.extraClassPath": os.pathsep.join(str(jar) for jar in jars)}
    return {"spark.jars": ",".join(str(jar) for jar in jars)}


def _local_file_system(jars: list[Path], settings: Settings) -> dict[str, str]:
    """Hadoop's local file system without a process per rename and per file created
    (``jars/localfs``): without Hadoop's native library, which Spark does not ship, it runs
    ``readlink`` for both sides of every rename (each checkpoint file and Delta commit is
    renamed into place) and ``chmod`` for each file and folder it creates, 1,136 processes
    in a cold ``lakehouse stream --available-now`` of 600 events (Java Flight Recorder),
    2-3 ms each on the committing thread: 37.9-38.4 s against 39.1-40.6 s (alternated).
    For a local master only: on the driver's class path (``_class_path``), where Hadoop
    finds it; a cluster's executors would look it up before they have the jars."""
    if not _runs_in_the_driver(settings) or not any(jar.name == LOCAL_FS_JAR for jar in jars):
        return {}
    return {"spark.hadoop.fs.file.impl": "lakehouse.ForklessLocalFileSystem",
            "spark.hadoop.fs.AbstractFileSystem.file.impl": "lakehouse.ForklessLocalFs"}


def _object_store(settings: Settings) -> dict[str, str]:
    """Hadoop's S3A connector for an S3-compatible store at ``s3_endpoint`` (none for AWS's
    own, which the SDK finds with the region). Credentials are never settings: S3A takes
    them from the AWS SDK's chain (environment, profile, instance role)."""
    if not settings.s3_endpoint:
        return {}
    return {"spark.hadoop.fs.s3a.endpoint": settings.s3_endpoint,
            # Such stores serve buckets under the host's path, not as host names.
            "spark.hadoop.fs.s3a.path.style.access": "true",
            # Their region whatever they are asked (MinIO's and moto's default); without
            # one S3A would look for the region as it does for AWS.
            "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
            "spark.hadoop.fs.s3a.connection.ssl.enabled":
                str(settings.s3_endpoint.startswith("https:")).lower(),
            # RocksDB uploads its state files with copyFromLocalFile, which S3A sends by
            # its transfer manager's async client; moto's server answered those uploads
            # (gold_user_sessions' first state snapshot) with a bare "100 Continue" that
            # the client took for a failed request. Written as any other file (the
            # blocking client, without asking to continue), every store takes them.
            "spark.hadoop.fs.s3a.optimized.copy.from.local.enabled": "false",
            "spark.hadoop.fs.s3a.connection.expect.continue": "false"}


def executor_python(settings: Settings) -> str:
    return settings.executor_python or sys.executable


def _shipped_code(settings: Settings) -> dict[str, str]:
    """A cluster's executors get the driver's code (``--py-files`` under spark-submit); a
    local master's run in the driver's own environment, which has it."""
    if _runs_in_the_driver(settings):
        return {}
    from spark_jobs.code_archive import code_archive

    return {"spark.submit.pyFiles": str(code_archive())}


def _java_options(settings: Settings) -> dict[str, str]:
    """The driver's and executors' JVM options, when configured (they replace what
    ``spark-defaults.conf`` sets for these keys, so an empty setting leaves those alone).
    The driver also maps the class archive ``make setup`` built, when there is one: it is
    on the driver's disk, not an executor's."""
    options = settings.spark_java_options
    if not options:
        return {}
    return {"spark.driver.extraJavaOptions":
            f"{options} {class_archive.use_options(settings)}".strip(),
            "spark.executor.extraJavaOptions": options}


def _driver_address(settings: Settings) -> dict[str, str]:
    """Where the driver's ports bind: not to whatever address the machine's name resolves
    to when nothing outside this machine needs to reach them."""
    host = settings.spark_driver_host or (LOOPBACK if _master_on_loopback(settings) else "")
    return {"spark.driver.host": host, "spark.driver.bindAddress": host} if host else {}


@contextmanager
def spark_session(settings: Settings, app_name: str = "lakehouse") -> Iterator[SparkSession]:
    """A session for one command: built as ``build_spark`` builds it, and stopped however
    the command ends."""
    with spark_session_on_demand(settings, app_name) as spark:
        yield spark()


@contextmanager
def spark_session_on_demand(settings: Settings, app_name: str = "lakehouse"
                            ) -> Iterator[Callable[[], SparkSession]]:
    """A session for a command that may need none: built on the first call of what this
    yields, as ``build_spark`` builds it, and stopped however the command ends."""
    started: list[SparkSession] = []

    def spark() -> SparkSession:
        if not started:
            started.append(build_spark(settings, app_name))
        return started[0]

    try:
        yield spark
    finally:
        for session in started:
            session.stop()


def build_spark(settings: Settings, app_name: str = "lakehouse",
                extra_driver_options: str = "") -> SparkSession:
    """A SparkSession with Delta, RocksDB state and the project's defaults;
    ``extra_driver_options`` are added to the driver JVM's (when this call starts it)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        # Not under spark-submit, whose --master (Airflow's Spark connection) and --name
        # (the task's: lakehouse-<task id>) must win.
        builder = builder.master(settings.spark_master).appName(app_name)
    conf = spark_conf(settings)
    if extra_driver_options:
        driver = conf.get("spark.driver.extraJavaOptions", "")
        conf["spark.driver.extraJavaOptions"] = f"{driver} {extra_driver_options}".strip()
    for key, value in conf.items():
        builder = builder.config(key, value)
    # spark-submit turns spark.pyspark.python into the variable PySpark reads when it starts
    # its context; a session built here must set it itself.
    os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
