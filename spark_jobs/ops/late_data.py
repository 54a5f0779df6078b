"""``ops.late_data``: the late-data ledger.

Grain: one row per (layer, event date, window, micro-batch) with events that arrived after
the layer's watermark had passed their window, so streaming could not include them. The
dates listed here are exactly what reprocessing must rebuild; ``repaired_at`` is set when
it has.
"""

from __future__ import annotations

from pyspark.sql.types import (
    DateType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.tables import TableSpec

SCHEMA = StructType([
    StructField("layer", StringType(), False),  # the table that missed the events
    StructField("event_date", DateType(), False),
    StructField("window_start", TimestampType()),
    StructField("late_rows", LongType(), False),
    StructField("watermark", TimestampType(), False),
    StructField("query_id", StringType(), False),
    StructField("batch_id", LongType(), False),
    StructField("recorded_at", TimestampType(), False),
    StructField("repaired_at", TimestampType()),
])

TABLE = TableSpec.declared("ops.late_data", SCHEMA)
