"""Table maintenance: compaction, clustering and VACUUM, safe beside the live streams.

Streams write a few files per micro-batch; analysts filter by campaign, ad and date.
``OPTIMIZE`` bin-packs the small files and Z-orders each table on the columns its queries
filter on. Z-ORDER rather than liquid clustering: the tables stay on the plain Delta
protocol (no clustering or domain-metadata table features), so any Delta reader, delta-rs
included, keeps reading them; and date partitions already prune the date filters.

``VACUUM`` keeps at least the configured time-travel window and, beyond it, the longest
time any stream has not read plus a safety margin, because a stream resuming after a pause
reads files committed while it was away. A shorter retention is refused, not run.

Each run appends before/after figures per table to ``ops.maintenance_history``. A
conflicting concurrent commit (a stream's MERGE) is retried a bounded number of times;
the streams retry their side too.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from spark_jobs import registry
from spark_jobs.config import Settings, interval_seconds, parse_choices
from spark_jobs.datasets import DATA_TABLES
from spark_jobs.delta_writes import fully_read_before, retry_on_conflict
from spark_jobs.ops import maintenance_history, stream_progress
from spark_jobs.progress import SILENT, Steps
from spark_jobs.tables import TableSpec, ensure_table, local_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class MaintenanceError(ValueError):
    """A request refused as unsafe or unknown; the message is meant for the user."""


# What maintenance compacts (each table's layout is its ``zorder_by``) and vacuums.
TABLES = DATA_TABLES


@dataclass
class Outcome:
    table: str
    operation: str
    dry_run: bool
    duration_seconds: float
    files_before: int
    files_after: int
    bytes_before: int
    bytes_after: int
    detail: str = ""

    def row(self, run_at: datetime) -> tuple[object, ...]:
        return (run_at, self.table, self.operation, self.dry_run, self.duration_seconds,
                self.files_before, self.files_after, self.bytes_before, self.bytes_after,
                self.detail)

    def as_json(self) -> dict[str, object]:
        return dict(zip(maintenance_history.SCHEMA.fieldNames()[1:], self.row(datetime.now())[1:],
                        strict=True))


def parse_tables(text: str | None) -> list[str]:
    return parse_choices(text, list(TABLES), "table(s)")


def _size(spark: SparkSession, path: str) -> tuple[int, int]:
    from delta.tables import DeltaTable

    detail = DeltaTable.forPath(spark, path).detail().first()
    return int(detail.numFiles), int(detail.sizeInBytes)


def optimize(spark: SparkSession, settings: Settings, name: str, dry_run: bool) -> Outcome:
    from delta.tables import DeltaTable

    spec = TABLES[name]
    path = spec.path(settings)
    files, size = _size(spark, path)
    columns = TABLES[name].zorder_by
    detail = f"zorder by {', '.join(columns)}" if columns else "bin-packing"
    started = time.monotonic()
    if not dry_run:
        def run() -> None:
            builder = DeltaTable.forPath(spark, path).optimize()
            if columns:
                builder.executeZOrderBy(*columns)
            else:
                builder.executeCompaction()

        retry_on_conflict(run, f"OPTIMIZE {name}")
    files_after, size_after = _size(spark, path)
    return Outcome(name, "optimize", dry_run, time.monotonic() - started, files, files_after,
                   size, size_after, detail)


def minimum_retention(spark: SparkSession, settings: Settings,
                      now: datetime | None = None) -> timedelta:
    """The shortest retention VACUUM may use: the time-travel window, the safety margin, or
    the longest a stream has not read plus the margin, whichever is longest."""
    now = now or datetime.now(UTC).replace(tzinfo=None)
    lags = [now - row["batch_at"] for row in stream_progress.latest_per_stream(spark, settings)]
    margin = timedelta(seconds=interval_seconds(settings.vacuum_safety_margin))
    window = timedelta(seconds=interval_seconds(settings.time_travel_window))
    # Never under the margin, whatever the window: VACUUM also deletes files no commit names
    # yet, which is what a write under way has written so far.
    return max([window, margin,
                *[lag + margin for lag in [*lags, *unread_ages(spark, settings, now)]]])


def unread_ages(spark: SparkSession, settings: Settings, now: datetime) -> list[timedelta]:
    """For each stream reading a Delta table, the age of the oldest commit of it the stream
    has not fully read. A stream far behind its source runs a batch every few seconds, so the
    time since its last batch says nothing of the files it has yet to read: a file the
    commit (or a later one) added, which OPTIMIZE may since have removed, must outlive
    VACUUM until the stream has read it."""
    import importlib

    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    ages = []
    for table in registry.streams():
        stream = importlib.import_module(table.module)
        source: TableSpec | None = getattr(stream, "SOURCE_TABLE", None)
        # A stream that never ran starts from the source as it is then: it needs no old file.
        unread = (None if source is None
                  else fully_read_before(settings.checkpoint(stream.QUERY_NAME)))
        if source is None or unread is None:
            continue
        # Commit times as epoch milliseconds: no time zone between Spark and Python. (A
        # commit older than the log keeps counts as the oldest the log still holds.)
        oldest = (DeltaTable.forPath(spark, source.path(settings)).history()
                  .where(F.col("version") >= unread)
                  .agg(F.min(F.unix_millis("timestamp"))).first()[0])
        if oldest is not None:
            ages.append(now - datetime.fromtimestamp(oldest / 1000, UTC).replace(tzinfo=None))
    return ages


def vacuum(spark: SparkSession, settings: Settings, name: str, retention: timedelta,
           dry_run: bool) -> Outcome:
    from delta.tables import DeltaTable

    path = TABLES[name].path(settings)
    files, size = _size(spark, path)
    started = time.monotonic()
    # Delta counts a VACUUM's retention in whole hours, rounded to the nearest: 5 minutes
    # became 0 and deleted every file removed from the table, those a stream behind still
    # had to read and those of a write under way (found by the chaos battery). Rounded up
    # here, so the retention is never less than asked.
    hours = math.ceil(retention.total_seconds() / 3600)
    if dry_run:
        doomed = spark.sql(f"VACUUM delta.`{path}` RETAIN {hours} HOURS DRY RUN").count()
        detail = f"would delete {doomed} unreferenced files older than {retention}"
    else:
        # Delta's own check refuses any retention under 7 days, whatever the streams need;
        # ``maintain`` has already refused one under this project's floor (the time-travel
        # window, the streams' lag plus a margin), which is the check that knows them.
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
        DeltaTable.forPath(spark, path).vacuum(hours)
        detail = f"retention {retention} (Delta: {hours} h)"
    files_after, size_after = _size(spark, path)
    return Outcome(name, "vacuum", dry_run, time.monotonic() - started, files, files_after,
                   size, size_after, detail)


def maintain(spark: SparkSession, settings: Settings, tables: list[str], *, run_optimize: bool,
             run_vacuum: bool, retention: timedelta | None, dry_run: bool,
             steps: Steps = SILENT) -> list[Outcome]:
    """Optimize and/or vacuum ``tables``; append the figures to the history table."""
    if run_vacuum:
        floor = minimum_retention(spark, settings)
        retention = retention or floor
        if retention < floor:
            raise MaintenanceError(
                f"refusing VACUUM with retention {retention}: the minimum is {floor} (the "
                f"time-travel window, or the longest any stream has not read plus "
                f"{settings.vacuum_safety_margin}); a shorter one could delete files a "
                f"stream or a time-travel query still needs")
    outcomes: list[Outcome] = []
    steps.start("maintenance" + (" (dry run)" if dry_run else ""),
                len(tables) * (run_optimize + run_vacuum))
    for name in tables:
        ensure_table(spark, settings, TABLES[name])
        if run_optimize:
            steps.advance(0, f"OPTIMIZE {name}")
            outcomes.append(optimize(spark, settings, name, dry_run))
            steps.advance()
        if run_vacuum:
            assert retention is not None
            steps.advance(0, f"VACUUM {name}")
            outcomes.append(vacuum(spark, settings, name, retention, dry_run))
            steps.advance()
    if outcomes:
        ensure_table(spark, settings, maintenance_history.TABLE)
        run_at = datetime.now(UTC).replace(tzinfo=None)
        (local_rows(spark, [o.row(run_at) for o in outcomes], maintenance_history.SCHEMA)
            .write.format("delta").mode("append").save(maintenance_history.TABLE.path(settings)))
    return outcomes


def render(outcomes: list[Outcome]) -> str:
    lines = [f"{'table':<22} {'operation':<9} {'files':>15} {'avg file KiB':>17} {'seconds':>8}"
             "  detail"]
    for o in outcomes:
        average = (o.bytes_before / max(o.files_before, 1) / 1024,
                   o.bytes_after / max(o.files_after, 1) / 1024)
        lines.append(f"{o.table:<22} {o.operation:<9} {o.files_before:>6} -> "
                     f"{o.files_after:<6} {average[0]:>7.1f} -> {average[1]:<7.1f} "
                     f"{o.duration_seconds:>8.1f}  {o.detail}"
                     + ("  (dry run)" if o.dry_run else ""))
    return "\n".join(lines)
