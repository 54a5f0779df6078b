"""``gold.campaign_stats``' event-time watermark, kept in the table's own commits.

A batch's watermark is the latest event time of all *earlier* batches of its query minus
the configured delay (as in Spark), so a replayed batch applies the very same watermark and
makes the very same decisions. The MERGE that adds a batch's counts carries, in its
commit's user metadata, the latest event time up to and including that batch: the figure
commits atomically with the counts it governs and costs no write of its own (an ops table
append per batch was a quarter of a small gold batch, and a file more per batch).

A batch that commits no MERGE cannot have moved the latest event time: it had no event on
time, and a late event is older than the watermark, itself older than the latest. So the
newest commit of the query before a batch holds that batch's figure. A driver reads the log
for its first batch (or a replay) and then carries the figure from batch to batch; the
watermark each batch applied goes to ``ops.stream_progress`` beside Spark's own.

Delta drops commit files older than the log's retention (30 days) once a checkpoint follows
them. A query that committed nothing for that long starts again without a watermark: its
next batch counts every event into its window, none into the ledger, which keeps gold equal
to silver for those windows; what it cannot do is tell late from on time for that batch.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from spark_jobs import delta_reader
from spark_jobs.config import interval_micros

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import Column, SparkSession

USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
# Newest commits first: the query's latest one is nearly always among them (a rebuild or an
# OPTIMIZE may have committed since); the whole log only if not.
RECENT_COMMITS = 100
EPOCH = datetime(1970, 1, 1)
# Where lakes from before 25 November 2026 recorded it, a row per batch.
LEGACY_TABLE = "ops/event_time_watermarks"

# (table, query id) -> (the last batch this driver finished, the latest event time up to
# it, in microseconds since the epoch: unambiguous in any time zone).
_latest_through: dict[tuple[str, str], tuple[int, int | None]] = {}


def latest_before(table_path: str, query_id: str, batch_id: int,
                  legacy_table_path: str | None = None) -> int | None:
    """The latest event time of the query's batches before ``batch_id``, in microseconds
    since the epoch; None before any event was seen (or, see the module, when the commit
    carrying it is older than the log keeps). ``legacy_table_path``: the ops table a lake
    from before this design recorded it in, read until the query's first new commit."""
    remembered = _latest_through.get((table_path, query_id))
    if remembered is not None and remembered[0] == batch_id - 1:
        return remembered[1]
    latest = latest_committed(table_path, query_id, before_batch=batch_id)
    if latest is None and legacy_table_path and delta_reader.is_delta_table(legacy_table_path):
        recorded = [micros(row["max_event_time"]) for row in delta_reader.read_rows(
                        legacy_table_path, ["query_id", "batch_id", "max_event_time"])
                    if row["query_id"] == query_id and row["batch_id"] < batch_id
                    and row["max_event_time"] is not None]
        latest = max(recorded, default=None)
    return latest


def latest_committed(table_path: str, query_id: str | None = None, *,
                     before_batch: int | None = None, version: int | None = None
                     ) -> int | None:
    """The latest event time carried by the newest commit of the query (of any query if
    None; before ``before_batch``; up to table version ``version``); None if there is none.
    Read without Spark."""
    for limit in (RECENT_COMMITS, None):
        for text in delta_reader.user_metadata(table_path, version, limit):
            mark = _mark(text)
            if mark and query_id in (None, mark["query_id"]) and (
                    before_batch is None or mark["batch_id"] < before_batch):
                return mark["latest_event_time"]
    return None


def _mark(text: str | None) -> dict[str, Any] | None:
    """The figure a commit carries, if its user metadata is ours (other writers may set
    theirs)."""
    try:
        mark = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(mark, dict) or not {"query_id", "batch_id",
                                          "latest_event_time"} <= mark.keys():
        return None
    return mark


def micros(moment: datetime) -> int:
    """A timestamp delta-rs read (naive UTC or aware) as microseconds since the epoch."""
    naive = moment if moment.tzinfo is None else moment.astimezone(UTC).replace(tzinfo=None)
    return (naive - EPOCH) // timedelta(microseconds=1)


@contextmanager
def carried_by_commit(spark: SparkSession, query_id: str, batch_id: int,
                      latest_event_time: int) -> Iterator[None]:
    """Commits made inside carry the latest event time up to and including ``batch_id``.
    ``spark`` is the micro-batch's own session, as for ``idempotent_dml``."""
    spark.conf.set(USER_METADATA, json.dumps({
        "query_id": query_id, "batch_id": batch_id, "latest_event_time": latest_event_time}))
    try:
        yield
    finally:
        spark.conf.unset(USER_METADATA)


def applied(latest_before: int | None, delay: str) -> int | None:
    """The watermark a batch applies: the latest event time of the earlier batches minus
    ``delay``, in microseconds since the epoch; None before any event was seen."""
    if latest_before is None:
        return None
    return latest_before - interval_micros(delay)


def closed(window_end: Column, watermark: int | None) -> Column:
    """Whether an event is late: its window had ended by the applied ``watermark`` (none
    is, before the first watermark)."""
    if watermark is None:
        return F.lit(False)
    return window_end <= F.timestamp_micros(F.lit(watermark))


def naive_utc(micros: int) -> datetime:
    """Microseconds since the epoch as a naive UTC time, as Spark's rows hold timestamps."""
    return EPOCH + timedelta(microseconds=micros)


def remember(table_path: str, query_id: str, batch_id: int, latest_event_time: int | None
             ) -> None:
    """Batch ``batch_id`` is done: the next one's watermark needs no read."""
    _latest_through[(table_path, query_id)] = (batch_id, latest_event_time)
