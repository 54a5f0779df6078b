"""``ops.late_data``: the late-data ledger.

Grain: one row per (layer, event date, window, micro-batch) with events that arrived after
the layer's watermark had passed their window, so streaming could not include them. The
dates listed here are exactly what reprocessing must rebuild; ``repaired_at`` is set when
it has.

A stream builds its late events' rows with ``entries`` and appends them with ``append``; a
gold rebuild marks what it covered with ``repair``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.types import (
    DateType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs import delta_reader
from spark_jobs.config import Settings
from spark_jobs.delta_writes import append_once
from spark_jobs.range_rebuild import Change, read_current, rows_per_date
from spark_jobs.tables import TableSpec

if TYPE_CHECKING:
    from datetime import date, datetime

    from pyspark.sql import Column, DataFrame, SparkSession

    from spark_jobs.dates import DateRange

SCHEMA = StructType([
    StructField("layer", StringType(), False),  # the table that missed the events
    StructField("event_date", DateType(), False),
    StructField("window_start", TimestampType()),
    StructField("late_rows", LongType(), False),
    StructField("watermark", TimestampType(), False),
    StructField("query_id", StringType(), False),
    StructField("batch_id", LongType(), False),
    # When the stream planned the batch (the same in a replay): its events were in the
    # layer's input by then, so a rebuild that read its input later counted them.
    StructField("recorded_at", TimestampType(), False),
    StructField("repaired_at", TimestampType()),
])

TABLE = TableSpec.declared("ops.late_data", SCHEMA)


def entries(late: DataFrame, layer: str, watermark: int, query_id: str, batch_id: int,
            recorded_at: datetime) -> DataFrame:
    """A micro-batch's late events (``event_date``, ``window_start``) as ledger rows, one
    per date and window; ``watermark``: the one applied, in microseconds since the epoch;
    ``recorded_at``: the batch's time (``delta_writes.batch_time``)."""
    return (late.groupBy("event_date", "window_start")
            .agg(F.count("*").alias("late_rows"))
            .select(F.lit(layer).alias("layer"), "event_date", "window_start", "late_rows",
                    F.timestamp_micros(F.lit(watermark)).alias("watermark"),
                    F.lit(query_id).alias("query_id"),
                    F.lit(batch_id).cast("long").alias("batch_id"),
                    F.lit(recorded_at).alias("recorded_at"),
                    F.lit(None).cast("timestamp").alias("repaired_at")))


def append(settings: Settings, rows: DataFrame, checkpoint: str, query_id: str, batch_id: int
           ) -> None:
    """Append a micro-batch's ledger rows (``entries``) of the query checkpointed at
    ``checkpoint``; a replay of the batch appends nothing again.

    Once: the commit names the batch (``delta_writes.append_once``), and only a run's first
    batch reads the log back, where Delta's transaction check would rebuild the ledger's
    state for every batch with a late event (about a second more, warm)."""
    append_once(rows, TABLE.path(settings), checkpoint, batch_id, app_id=query_id,
                stamp_column="recorded_at", key_column="batch_id")


def repair(spark: SparkSession, settings: Settings, days: DateRange, recorded_before: datetime,
           dry_run: bool) -> Change:
    """Mark repaired the open entries of ``days`` recorded before ``recorded_before``, when a
    gold rebuild read silver: it covered them; later ones are events it did not see, and
    stay open."""
    from delta.tables import DeltaTable

    open_entries: Column = (F.col("repaired_at").isNull() & days.holds("event_date")
                            & (F.col("recorded_at") < F.lit(recorded_before)))
    repaired = rows_per_date(read_current(spark, settings, TABLE).where(open_entries),
                             F.col("event_date"))
    change = Change(TABLE.name, rows_after=repaired,
                    note=f"{sum(repaired.values())} ledger entries marked repaired")
    if repaired and not dry_run:
        (DeltaTable.forPath(spark, TABLE.path(settings))
            .update(open_entries, {"repaired_at": F.current_timestamp()}))
        change.written = True
    return change


def unrepaired_dates(settings: Settings) -> list[date]:
    """The event dates the ledger lists as not repaired yet (read without Spark)."""
    rows = delta_reader.read_rows(TABLE.path(settings), ["event_date", "repaired_at"])
    return sorted({row["event_date"] for row in rows if row["repaired_at"] is None})
