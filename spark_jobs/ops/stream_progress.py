"""``ops.stream_progress``: one row per completed micro-batch of every stream.

Grain: one row per (query run, batch id). Written by the stream runner every few seconds
and when a stream ends; read by the audit, the validation's cut of gold and the stream
health view. What a batch read up to is Spark's own report (its sources' end offsets), not
the checkpoint's files.
"""

from __future__ import annotations

import json
import threading
import uuid
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

from spark_jobs import delta_reader
from spark_jobs.bronze.ad_events import RECORDS_METRIC
from spark_jobs.config import Settings
from spark_jobs.delta_writes import delta_source_read_before
from spark_jobs.tables import TableSpec, ensure_table, local_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.streaming.listener import SourceProgress, StreamingQueryProgress

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
    # Added later: NULL in rows recorded before. The query's id, which its checkpoint keeps
    # across runs (batch ids restart from 0 only with a new checkpoint, and a new id).
    StructField("query_id", StringType()),
    # The version of its Delta source the batch had read up to, exclusive (its sources' end
    # offset as Spark reports it); NULL for the landing zone or Kafka.
    StructField("source_read_before", LongType()),
    # Added later: what the batch's event-time timers closed (a stream of
    # transformWithState: gold_user_sessions counts a session a timer; NULL for the
    # others), and the events it counted late in ops.late_data (NULL for a stream without
    # a ledger).
    StructField("timers_fired", LongType()),
    StructField("late_rows", LongType()),
])

TABLE = TableSpec.declared("ops.stream_progress", SCHEMA)
# The state operators' metric of timers fired (Spark's transformWithState in Scala).
TIMERS_FIRED = "numExpiredTimers"

# (query id, batch id) -> what a batch reported of itself from ``foreachBatch`` (the
# event-time watermark it applied, where Spark reports none; the events it counted late),
# kept until its progress row is written. Written by the streams' threads, read by the
# runner's.
_reported: dict[tuple[str, int], dict[str, object]] = {}
_reported_lock = threading.Lock()
_REPORTS_KEPT = 1000  # a driver that records no progress must not grow this for ever


def _report(query_id: str, batch_id: int, key: str, value: object) -> None:
    with _reported_lock:
        _reported.setdefault((query_id, batch_id), {})[key] = value
        while len(_reported) > _REPORTS_KEPT:
            del _reported[next(iter(_reported))]


def report_watermark(query_id: str, batch_id: int, watermark: datetime) -> None:
    """The watermark (naive UTC) a micro-batch applied, for its progress row."""
    _report(query_id, batch_id, "watermark", watermark)


def report_late_rows(query_id: str, batch_id: int, late_rows: int) -> None:
    """How many events a micro-batch counted late in the ledger, for its progress row."""
    _report(query_id, batch_id, "late_rows", late_rows)


def report_timers_fired(query_id: str, batch_id: int, timers: int) -> None:
    """What a micro-batch's event-time timers closed (sessions, one a timer): Spark counts
    a Python processor's timers in none of its metrics, so the stream says."""
    _report(query_id, batch_id, "timers_fired", timers)


def _reported_by(progress: StreamingQueryProgress) -> dict[str, object]:
    with _reported_lock:
        return _reported.pop((str(progress.id), progress.batchId), {})


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
                if not ran_a_batch(progress):
                    continue
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
            # A table recorded before the later columns gains them.
            (local_rows(spark, rows, SCHEMA).write.format("delta").mode("append")
                .option("mergeSchema", "true").save(TABLE.path(settings)))
        return len(rows)


def ran_a_batch(progress: StreamingQueryProgress) -> bool:
    """Whether the report is of a micro-batch. A trigger that found nothing to read reports
    too (the first of a run, then one every 10 s while idle), under the id of the batch
    still to come and where the last one stopped: kept, it would stand for that batch."""
    return "addBatch" in (progress.durationMs or {})


def input_records(progress: StreamingQueryProgress) -> int:
    """Records a micro-batch read. A stream that observes ``records`` (the landing zone,
    read a file at a time) says so itself; a join reads the same table once per side, so
    the widest source counts, not their sum."""
    observed = (progress.observedMetrics or {}).get(RECORDS_METRIC)
    if observed is not None:
        return int(observed["rows"])
    return max((source.numInputRows for source in progress.sources), default=0)


def _row(progress: StreamingQueryProgress) -> tuple[object, ...]:
    operators = progress.stateOperators or []
    records = input_records(progress)
    seconds = (progress.batchDuration or 0) / 1000
    reported = _reported_by(progress)
    timers = reported.get("timers_fired", sum(
        op.customMetrics[TIMERS_FIRED] for op in operators
        if TIMERS_FIRED in (op.customMetrics or {})) or None)
    return (
        progress.name or str(progress.id), str(progress.runId), progress.batchId,
        _utc(progress.timestamp), records,
        _rescaled(progress.inputRowsPerSecond, records, progress.numInputRows),
        records / seconds if seconds > 0 else None,
        progress.batchDuration,
        _utc((progress.eventTime or {}).get("watermark")) or reported.get("watermark"),
        sum(op.numRowsTotal for op in operators) if operators else None,
        sum(op.numRowsDroppedByWatermark for op in operators) if operators else None,
        str(progress.id),
        _source_read_before(progress),
        timers,
        reported.get("late_rows"),
    )


def _source_read_before(progress: StreamingQueryProgress) -> int | None:
    """Where the batch's Delta source stood after it; a join reads one table on both sides,
    and only what the side behind has reached was read by both."""
    positions = [position for position in map(_read_before, progress.sources)
                 if position is not None]
    return min(positions, default=None)


def _read_before(source: SourceProgress) -> int | None:
    """The version read up to, exclusive, from the end offset Spark reported for a Delta
    source; None for another kind of source."""
    try:
        offset = json.loads(source.endOffset or "null")
    except ValueError:
        return None
    if not isinstance(offset, dict) or "reservoirVersion" not in offset:
        return None
    return delta_source_read_before(offset)


def read_position(settings: Settings, query_id: str, batch_id: int) -> int | None:
    """The version of its Delta source the query ``query_id`` had read up to (exclusive)
    after batch ``batch_id``; None until the runner has recorded that batch."""
    path = TABLE.path(settings)
    if not delta_reader.is_delta_table(path) or "source_read_before" not in \
            delta_reader.column_names(path):
        return None
    # query_id is Spark's UUID, batch_id an int: nothing a user typed reaches the SQL.
    rows = delta_reader.read_arrow_sql(path, f"""
        SELECT source_read_before FROM snapshot
        WHERE query_id = '{uuid.UUID(query_id)}' AND batch_id = {int(batch_id)}
        LIMIT 1""").to_pylist()
    return rows[0]["source_read_before"] if rows else None


def _rescaled(rate: float | None, records: int, counted: int) -> float | None:
    """Spark's input rate over what it counted, as a rate of ``records``."""
    rate = _finite(rate)
    if rate is None or counted <= 0:
        return rate if records == counted else None
    return rate * records / counted


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
