"""Delta tables of the lakehouse: how each is declared, created and registered by name.

Each dataset module declares one :class:`TableSpec`. Tables live by path under
``<root>/tables`` (readable by any Delta reader) and are registered by name in every
session the project builds. The registration is also written to ``<root>/catalog.sql``, so a
plain ``spark-sql -i <root>/catalog.sql`` sees the same names: the catalog persists with
the data instead of in a single-process Derby metastore that concurrent streaming drivers
could not share.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_jobs import delta_reader, registry, storage
from spark_jobs.config import Settings
from spark_jobs.delta_writes import retry_on_conflict
from spark_jobs.registry import Table

if TYPE_CHECKING:
    from delta.tables import DeltaTableBuilder
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructField, StructType

# A table another job is creating exists within moments; this many looks, 0.5 s apart and
# growing, before its folder is reported as foreign.
CREATE_ATTEMPTS = 5
# A log folder without a commit, unchanged for this long, is a creation killed, not one under
# way (which renames its first commit into place within a second or two of making the folder).
TORN_AFTER_SECONDS = 30
# What a table being created by another job looks like before its first commit.
CREATING = frozenset({"DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION", "DELTA_TABLE_NOT_FOUND"})


@dataclass(frozen=True, kw_only=True)
class TableSpec(Table):
    """A table of the registry with its schema, as its own module declares it."""

    schema: StructType

    @classmethod
    def declared(cls, name: str, schema: StructType) -> TableSpec:
        return cls(**registry.TABLES[name].fields(), schema=schema)


def create_statement(spec: TableSpec, settings: Settings) -> str:
    database = spec.name.split(".")[0]
    return (f"CREATE DATABASE IF NOT EXISTS {database};\n"
            f"CREATE TABLE IF NOT EXISTS {spec.name} USING DELTA LOCATION '{spec.path(settings)}';")


# (Spark application, table name) -> the path this process last created or found the table
# at and pointed the name to. Jobs ensure a table before each use (the stream runner before
# every progress flush, a rebuild before every read): after the first, that costs nothing.
_ENSURED: dict[tuple[str, str], str] = {}
# Threads of one driver (a gold rebuild's tables side by side) may ask for the same table at
# once: one creates it, the others then find it.
_CREATING = threading.Lock()


def ensure_table(spark: SparkSession, settings: Settings, spec: TableSpec) -> None:
    """Create the Delta table at its path if it is missing, and register its name.

    Once per Spark application and path: creating, or finding, a table loads its log, and
    re-pointing its name is three catalog statements; together about a second on an idle
    laptop, several beside the streams. A table whose log has gone from the local disk since
    (a test's root wiped, a bench's root reused) is created again."""
    path = spec.path(settings)
    ensured = (spark.sparkContext.applicationId, spec.name)
    if _ENSURED.get(ensured) == path and _log_present(path):
        return
    with _CREATING:
        if _ENSURED.get(ensured) == path and _log_present(path):
            return
        _create_and_register(spark, settings, spec)
        _ENSURED[ensured] = path


def _local_log(path: str) -> str | None:
    """The table's log folder on this machine's disk; None for a path with a scheme (an
    object store), which is not looked at."""
    return None if "://" in path else os.path.join(path, "_delta_log")


def _log_present(path: str) -> bool:
    """Whether the table's log is still there (an object store's is taken to be)."""
    log = _local_log(path)
    return log is None or os.path.isdir(log)


def _create_and_register(spark: SparkSession, settings: Settings, spec: TableSpec) -> None:
    from delta.tables import DeltaTable

    builder = (DeltaTable.createIfNotExists(spark)
               .location(spec.path(settings))
               .addColumns(spec.schema)
               .partitionedBy(*spec.partitioned_by))
    for key, value in spec.table_properties.items():
        builder = builder.property(key, value)
    _create_once(builder, spec, spec.path(settings))
    _register(spark, settings, spec)
    _remember(settings, spec)


def _create_once(builder: DeltaTableBuilder, spec: TableSpec, path: str) -> None:
    """Jobs starting together (the streams and a validation) race to create a table: the
    loser sees the winner's first commit as a conflict, or the winner's folder before that
    commit, as "not empty and not a Delta table" or as a log without a table. Each way, a
    moment later its retry finds the winner's table and writes nothing; a folder that stays
    foreign is still refused.

    A log folder that stays without a commit is a creation killed between making the folder
    and writing the first commit (the chaos battery SIGKILLed a driver there): Delta then
    calls the table missing and will not create it, for every process after. Such a folder
    holds nothing of the table, so it is removed once it is old enough not to be a creation
    under way (``_clear_torn_log``), and the table created."""
    from pyspark.errors import AnalysisException

    for attempt in range(1, CREATE_ATTEMPTS + 1):
        try:
            retry_on_conflict(builder.execute, f"create {spec.name}")
            return
        except AnalysisException as error:
            if error.getCondition() not in CREATING:
                raise
            if attempt == CREATE_ATTEMPTS:
                _clear_torn_log(path)
                # Removed here or by another job meanwhile, or foreign after all (refused
                # again, as it should be): one last try says which.
                retry_on_conflict(builder.execute, f"create {spec.name}")
                return
            time.sleep(0.5 * attempt)


def _clear_torn_log(path: str) -> None:
    """Remove the table's log if a killed creation left it (``_remove_torn_log``), waiting
    at most ``TORN_AFTER_SECONDS`` for one killed a moment ago to be old enough to tell from
    a creation under way."""
    log = _local_log(path)
    if log is None:
        return
    deadline = time.monotonic() + TORN_AFTER_SECONDS
    while (age := _torn_age(log)) is not None and not _remove_torn_log(path):
        if time.monotonic() >= deadline:
            return
        time.sleep(min(1.0, max(0.1, TORN_AFTER_SECONDS - age)))


def _torn_age(log: str) -> float | None:
    """Seconds since a log folder that holds nothing of a table (only empty folders and
    hidden files) last changed; None for anything else: no folder, a commit, a checkpoint,
    a folder with something in it, or a folder changing as it is read."""
    try:
        newest = os.stat(log).st_mtime
        for entry in os.scandir(log):
            if entry.is_dir(follow_symlinks=False):
                if os.listdir(entry.path):
                    return None
            elif not entry.name.startswith("."):
                return None
            newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    except OSError:
        return None
    return time.time() - newest


def _remove_torn_log(path: str) -> bool:
    """Remove the table's ``_delta_log`` if it is a local folder a killed creation left
    behind; whether it was.

    Delta 4.4 makes the log folder together with its ``_staged_commits`` folder, then
    writes commit 0 to a hidden temporary file (with Hadoop's hidden checksum beside it) and
    renames it into place. Killed before the rename, it leaves empty folders and hidden
    files, never a commit: that is torn. One that changed within ``TORN_AFTER_SECONDS``
    may be a creation under way, and anything else (a commit, a checkpoint) is a table, so
    neither is touched. The folders go with ``rmdir``, which fails, changing nothing, if a
    commit landed meanwhile."""
    log = _local_log(path)
    if log is None:
        return False
    age = _torn_age(log)
    if age is None or age < TORN_AFTER_SECONDS:
        return False
    try:
        entries = list(os.scandir(log))
        for entry in entries:
            # Hidden files only: a commit that landed since the look above stays, and the
            # folder's removal below then fails.
            if not entry.is_dir(follow_symlinks=False) and entry.name.startswith("."):
                os.remove(entry.path)
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                os.rmdir(entry.path)
        os.rmdir(log)
    except OSError:
        return False
    return True


def register_existing(spark: SparkSession, settings: Settings) -> list[str]:
    """Register by name every table recorded in ``<root>/catalog.sql`` (on the object store,
    which keeps no such file: every table of the registry that is there); return the
    names."""
    if storage.is_object_store(settings.root):
        from spark_jobs.datasets import TABLES  # the table modules import this one

        existing = [spec for spec in TABLES.values()
                    if delta_reader.is_delta_table(spec.path(settings))]
        for spec in existing:
            _register(spark, settings, spec)
        return [spec.name for spec in existing]
    catalog = settings.root / "catalog.sql"
    if not catalog.exists():
        return []
    names = []
    for statement in catalog.read_text("utf-8").split(";"):
        if statement.strip():
            spark.sql(statement)
            if "CREATE TABLE" in statement:
                names.append(statement.split("EXISTS ")[1].split(" ")[0])
    return names


def local_rows(spark: SparkSession, rows: Sequence[Sequence[object]], schema: StructType
               ) -> DataFrame:
    """Rows the driver holds as a DataFrame of literals.

    ``spark.createDataFrame(list)`` ships the rows through Python worker processes (one
    pickling round trip, and a daemon per core); literals need none, which matters for the
    few rows the streams record every micro-batch.
    """
    from pyspark.sql import functions as F

    def value(item: object, field: StructField) -> Column:
        return F.lit(item).cast(field.dataType).alias(field.name)

    if not rows:
        return spark.range(0).select(*[value(None, field) for field in schema.fields])
    return spark.range(1).select(F.inline(F.array(*[
        F.struct(*[value(item, field) for item, field in zip(row, schema.fields, strict=True)])
        for row in rows])))


def read(spark: SparkSession, settings: Settings, spec: TableSpec) -> DataFrame:
    return spark.read.format("delta").load(spec.path(settings))


# The driver's threads (its streams' batches, a job's workers) share one session catalog,
# in which re-pointing a name is two statements.
_CATALOG_LOCK = threading.Lock()


def _register(spark: SparkSession, settings: Settings, spec: TableSpec) -> None:
    """(Re)point the name at this root's table. The registration is external: dropping it
    forgets the name, never the data."""
    with _CATALOG_LOCK:
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {spec.name.split('.')[0]}")
        spark.sql(f"DROP TABLE IF EXISTS {spec.name}")
        spark.sql(f"CREATE TABLE {spec.name} USING DELTA LOCATION '{spec.path(settings)}'")


def _remember(settings: Settings, spec: TableSpec) -> None:
    if storage.is_object_store(settings.root):
        # The file is for ``spark-sql -i``, which reads a local file, and an object cannot
        # be appended to: a lake on the store keeps no such file (``register_existing``
        # registers the registry's tables found there instead).
        return
    catalog = settings.root / "catalog.sql"
    known = catalog.read_text("utf-8") if catalog.exists() else ""
    statement = create_statement(spec, settings)
    if statement not in known:
        # Several drivers may create tables at once: append is atomic enough for one line
        # each, and duplicates are harmless (IF NOT EXISTS).
        with catalog.open("a", encoding="utf-8") as out:
            out.write(statement + "\n")
