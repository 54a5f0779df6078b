"""``ops.event_time_watermarks``: the event-time watermark of each gold micro-batch.

Grain: one row per (query, micro-batch): the latest event time the batch saw and the
watermark it applied. A batch's watermark is the latest event time of all *earlier*
batches of its query minus the configured delay (as in Spark), so a replayed batch applies
the very same watermark and makes the very same decisions.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from spark_jobs.config import Settings
from spark_jobs.delta_writes import idempotent_append_options
from spark_jobs.tables import TableSpec, local_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SCHEMA = StructType([
    StructField("query_name", StringType(), False),
    StructField("query_id", StringType(), False),
    StructField("batch_id", LongType(), False),
    StructField("max_event_time", TimestampType()),
    StructField("watermark", TimestampType()),
])

TABLE = TableSpec("ops.event_time_watermarks", SCHEMA)


# query id -> (the last batch recorded by this driver, the latest event time up to it). The
# table gains a file per micro-batch and is never compacted, so reading it every batch made
# gold slower with uptime; a driver reads it once, for its first batch (or a replay), and
# then carries the figure from batch to batch.
_latest_through: dict[str, tuple[int, datetime | None]] = {}


def _latest_before(spark: SparkSession, settings: Settings, query_id: str,
                   batch_id: int) -> datetime | None:
    remembered = _latest_through.get(query_id)
    if remembered is not None and remembered[0] == batch_id - 1:
        return remembered[1]
    return (spark.read.format("delta").load(TABLE.path(settings))
            .where((F.col("query_id") == query_id) & (F.col("batch_id") < batch_id))
            .agg(F.max("max_event_time").alias("latest")).first().latest)


def watermark_before(spark: SparkSession, settings: Settings, query_id: str, batch_id: int,
                     delay: timedelta) -> datetime | None:
    """The watermark batch ``batch_id`` applies: NULL before any event was seen."""
    latest = _latest_before(spark, settings, query_id, batch_id)
    return None if latest is None else latest - delay


def record(spark: SparkSession, settings: Settings, query_name: str, query_id: str,
           batch_id: int, max_event_time: datetime | None, watermark: datetime | None) -> None:
    latest = _latest_before(spark, settings, query_id, batch_id)
    (local_rows(spark, [(query_name, query_id, batch_id, max_event_time, watermark)], SCHEMA)
        .write.format("delta").mode("append")
        .options(**idempotent_append_options(query_id, batch_id))
        .save(TABLE.path(settings)))
    seen = [moment for moment in (latest, max_event_time) if moment is not None]
    _latest_through[query_id] = (batch_id, max(seen) if seen else None)
