"""``ops.gold_rebuilds``: which silver snapshot each reprocessed gold date was rebuilt from.

Grain: one row per (event date, silver version) a reprocess rebuilt gold from.
``campaign_stats`` is additive in the stream, so a live gold stream that is behind
silver would add again an event the rebuild already counted. The stream therefore drops
from each micro-batch the events of a rebuilt date that were in silver at the rebuild's
version: the rebuild counted them, the stream counts only what came after.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import reduce
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.types import DateType, LongType, StructField, StructType, TimestampType

from spark_jobs import delta_reader
from spark_jobs.config import Settings
from spark_jobs.tables import TableSpec, local_rows

if TYPE_CHECKING:
    from datetime import date

    from pyspark.sql import DataFrame, SparkSession

SCHEMA = StructType([
    StructField("event_date", DateType(), False),
    StructField("silver_version", LongType(), False),
    StructField("rebuilt_at", TimestampType(), False),
])

TABLE = TableSpec.declared("ops.gold_rebuilds", SCHEMA)


def record(spark: SparkSession, settings: Settings, days: list[date], silver_version: int
           ) -> None:
    """Recorded before gold is replaced; gold's batches wait for the whole rebuild
    (``gold.writer``), so every batch after it sees the record."""
    now = datetime.now(UTC).replace(tzinfo=None)
    (local_rows(spark, [(day, silver_version, now) for day in days], SCHEMA)
        .write.format("delta").mode("append").save(TABLE.path(settings)))


def not_yet_counted(spark: SparkSession, settings: Settings, silver_path: str,
                    events: DataFrame) -> DataFrame:
    """``events`` without those a rebuild of their date already counted."""
    # A few rows, read in the driver without a Spark job: most gold batches (all, on a lake
    # never reprocessed) have no rebuilt date to look for.
    rebuilt: dict[date, int] = {}
    for row in delta_reader.read_rows(TABLE.path(settings), ["event_date", "silver_version"]):
        rebuilt[row["event_date"]] = max(row["silver_version"],
                                         rebuilt.get(row["event_date"], -1))
    if not rebuilt:
        return events
    batch_dates = [row.event_date for row in events.select("event_date").distinct().collect()]
    latest_rebuilds = [(day, rebuilt[day]) for day in batch_dates if day in rebuilt]
    if not latest_rebuilds:
        return events
    counted = reduce(lambda left, right: left.unionByName(right), [
        spark.read.format("delta").option("versionAsOf", version).load(silver_path)
        .where(F.col("event_date") == F.lit(day)).select("event_id")
        for day, version in latest_rebuilds])
    return events.join(counted, "event_id", "left_anti")
