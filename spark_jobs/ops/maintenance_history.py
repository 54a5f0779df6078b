"""``ops.maintenance_history``: what each maintenance pass did (``lakehouse maintain``).

Grain: one row per table and maintenance operation (OPTIMIZE, VACUUM), with the files and
bytes before and after and how long it took.
"""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.tables import TableSpec

SCHEMA = StructType([
    StructField("run_at", TimestampType(), False),
    StructField("table_name", StringType(), False),
    StructField("operation", StringType(), False),  # optimize | vacuum
    StructField("dry_run", BooleanType(), False),
    StructField("duration_seconds", DoubleType(), False),
    StructField("files_before", LongType(), False),
    StructField("files_after", LongType(), False),
    StructField("bytes_before", LongType(), False),
    StructField("bytes_after", LongType(), False),
    StructField("detail", StringType()),
])
TABLE = TableSpec.declared("ops.maintenance_history", SCHEMA)
