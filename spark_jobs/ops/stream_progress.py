"""``ops.stream_progress``: one row per completed micro-batch of every stream.

Grain: one row per (query run, batch id). Written by the stream runner every few seconds
and when a stream ends; read by the audit and the stream health view.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.config import Settings
from spark_jobs.tables import TableSpec, ensure_table

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.streaming.listener import StreamingQueryProgress

SCHEMA = StructType([
    StructField("query_name", StringType(), False),
    StructField("run_id", StringType(), False),
    StructField("batch_id", LongType(), False),
    StructField("batch_at", TimestampType(), False),
    StructField("num_input_rows", LongType(), False),
    StructField("input_rows_per_second", DoubleType()),
    StructField("processed_rows_per_second", DoubleType()),
    StructField("batch_duration_ms", LongType()),
    StructField("watermark", TimestampType()),
    StructField("state_rows", LongType()),
    StructField("rows_dropped_by_watermark", LongType()),
])

TABLE = TableSpec("ops.stream_progress", SCHEMA)


def _utc(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).replace(tzinfo=None)


class ProgressRecorder:
    """Collects each query's completed micro-batches until ``flush`` writes them.

    It reads ``query.recentProgress`` rather than listening: the listener bus is
    asynchronous, and a query's last batches could arrive after the runner moved on.
    """

    def __init__(self) -> None:
        self._rows: list[tuple[object, ...]] = []
        self._seen: set[tuple[str, int]] = set()

    def collect(self, queries: Iterable[StreamingQuery]) -> None:
        for query in queries:
            for progress in query.recentProgress:
                key = (str(progress.runId), progress.batchId)
                if key not in self._seen:
                    self._seen.add(key)
                    self._rows.append(_row(progress))

    def flush(self, spark: SparkSession, settings: Settings,
              queries: Iterable[StreamingQuery]) -> int:
        self.collect(queries)
        rows, self._rows = self._rows, []
        if rows:
            ensure_table(spark, settings, TABLE)
            (spark.createDataFrame(rows, SCHEMA).write.format("delta").mode("append")
                .save(TABLE.path(settings)))
        return len(rows)


def _row(progress: StreamingQueryProgress) -> tuple[object, ...]:
    operators = progress.stateOperators or []
    return (
        progress.name or str(progress.id), str(progress.runId), progress.batchId,
        _utc(progress.timestamp), progress.numInputRows,
        _finite(progress.inputRowsPerSecond), _finite(progress.processedRowsPerSecond),
        progress.batchDuration, _utc((progress.eventTime or {}).get("watermark")),
        sum(op.numRowsTotal for op in operators) if operators else None,
        sum(op.numRowsDroppedByWatermark for op in operators) if operators else None,
    )


def _finite(value: float | None) -> float | None:
    return value if value is not None and value == value and value != float("inf") else None


def latest_per_stream(spark: SparkSession, settings: Settings) -> list[dict[str, object]]:
    """The last recorded batch of each stream, newest first."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    path = TABLE.path(settings)
    if not (settings.tables_dir / TABLE.relative_path / "_delta_log").exists():
        return []
    newest = Window.partitionBy("query_name").orderBy(F.desc("batch_at"), F.desc("batch_id"))
    rows = (spark.read.format("delta").load(path)
            .withColumn("_rank", F.row_number().over(newest)).where("_rank = 1").drop("_rank")
            .orderBy(F.desc("batch_at")).collect())
    return [row.asDict() for row in rows]
