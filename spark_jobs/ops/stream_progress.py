"""``ops.stream_progress``: one row per completed micro-batch of every stream.

Grain: one row per (query run, batch id). Written from a StreamingQueryListener's buffer by
the stream runner between batches (a Spark job inside the listener callback would hold up
the listener bus), and read by the audit and the stream health view.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import TYPE_CHECKING

from pyspark.sql.streaming import StreamingQueryListener
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


class ProgressRecorder(StreamingQueryListener):
    """Buffers every micro-batch's progress until ``flush`` writes it."""

    def __init__(self) -> None:
        self._rows: list[tuple[object, ...]] = []
        self._lock = threading.Lock()

    def onQueryStarted(self, event: object) -> None:  # noqa: N802 (Spark's names)
        pass

    def onQueryIdle(self, event: object) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: object) -> None:  # noqa: N802
        pass

    def onQueryProgress(self, event: object) -> None:  # noqa: N802
        progress = event.progress  # type: ignore[attr-defined]
        operators = progress.stateOperators or []
        row = (
            progress.name or str(progress.id), str(progress.runId), progress.batchId,
            _utc(progress.timestamp), progress.numInputRows,
            _finite(progress.inputRowsPerSecond), _finite(progress.processedRowsPerSecond),
            progress.batchDuration, _utc((progress.eventTime or {}).get("watermark")),
            sum(op.numRowsTotal for op in operators) if operators else None,
            sum(op.numRowsDroppedByWatermark for op in operators) if operators else None,
        )
        with self._lock:
            self._rows.append(row)

    def flush(self, spark: SparkSession, settings: Settings) -> int:
        with self._lock:
            rows, self._rows = self._rows, []
        if rows:
            (spark.createDataFrame(rows, SCHEMA).write.format("delta").mode("append")
                .save(TABLE.path(settings)))
        return len(rows)


def _finite(value: float | None) -> float | None:
    return value if value is not None and value == value and value != float("inf") else None


def install(spark: SparkSession, settings: Settings) -> ProgressRecorder:
    ensure_table(spark, settings, TABLE)
    recorder = ProgressRecorder()
    spark.streams.addListener(recorder)
    return recorder


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
