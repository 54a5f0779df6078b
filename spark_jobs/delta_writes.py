"""Idempotent Delta writes for ``foreachBatch``: a replayed micro-batch changes nothing.

Delta records (app id, version) in the table's log with each commit and skips a later write
that carries a version it has already seen. The app id is the streaming query's id, kept in
its checkpoint: a new checkpoint is a new query, whose batch 0 must not be mistaken for the
old query's batch 0.

Delta answers that check from the table's whole state, rebuilt for every new version (for
an append, the only reason to rebuild it). So appends that happen every batch
(:func:`append_once`) ask only where a replay is possible: the first batch a run of the
query processes is the only one an earlier run can have begun.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from pyspark.sql import functions as F

from spark_jobs import delta_reader
from spark_jobs.faults import crash_point
from spark_jobs.storage import lake_path

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from spark_jobs.config import Settings

log = logging.getLogger(__name__)
Result = TypeVar("Result")

# Compaction, reprocessing and several streams commit to the same tables; a conflicting
# commit is retried from a fresh snapshot this many times before it is an error.
CONFLICT_ATTEMPTS = 6

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


# Per checkpoint, the last micro-batch the current run of its query completed in this process.
_completed_in_run: dict[str, int] = {}


def may_be_replay(checkpoint: str, batch_id: int) -> bool:
    """Whether an earlier run of the query may have written part of batch ``batch_id``.

    Spark plans a batch again only when a query starts (the batch its last run planned and
    did not commit), so only the first batch of a run, or one after a failed attempt in
    this process, can be such a replay."""
    return _completed_in_run.get(checkpoint) != batch_id - 1


# A commit's own clock and the batch's planning time come from one driver; this much slack
# covers a clock stepped back between the two.
CLOCK_SLACK_MS = 10 * 60 * 1000


def append_once(rows: DataFrame, path: str, checkpoint: str, batch_id: int, *, app_id: str,
                stamp_column: str, key_column: str) -> bool:
    """Append micro-batch ``batch_id``'s ``rows`` of query ``app_id``, unless an earlier run
    committed them already; whether it appended.

    The commit names the batch in its user metadata. Only where a replay is possible
    (:func:`may_be_replay`: once a run, where Delta's transaction check rebuilds the
    table's state for every batch) are the table's commits since the batch was planned read
    back for that name, or for the transaction identifier of a write made before this way
    of writing. Should the log no longer reach back to the batch's planning (a driver down
    for longer than the table keeps its log), the rows themselves answer: ``stamp_column``
    holds the batch's own time (the time Spark gave the batch when it planned it, kept in
    its offset log: ``current_timestamp()`` in the streaming query, or
    :func:`planned_time`; the same in a replay), and any of the batch's
    ``key_column`` values found with it proves the commit.
    """
    if not may_be_replay(checkpoint, batch_id):
        return _append(rows, path, app_id, batch_id)
    planned_ms = _planned_ms(rows, stamp_column, checkpoint, batch_id)
    last = last_batch_committed(path, app_id, since_ms=planned_ms - CLOCK_SLACK_MS)
    if last is not None:
        return _append(rows, path, app_id, batch_id) if last < batch_id else _skipped(
            checkpoint, batch_id, path)
    # Read once for the look and the append: observed metrics (bronze's record count)
    # would count a batch read twice.
    rows = rows.persist()
    try:
        if _rows_committed(rows, path, stamp_column, key_column, planned_ms):
            return _skipped(checkpoint, batch_id, path)
        return _append(rows, path, app_id, batch_id)
    finally:
        rows.unpersist()


def _append(rows: DataFrame, path: str, app_id: str, batch_id: int) -> bool:
    (rows.write.format("delta").mode("append")
        .option("userMetadata", json.dumps({BATCH_MARKER: [app_id, batch_id]}))
        .save(path))
    return True


def _skipped(checkpoint: str, batch_id: int, path: str) -> bool:
    log.info("batch %d of %s was committed to %s by an earlier run: not again", batch_id,
             lake_path(checkpoint).name, path)
    return False


# The key of a commit's user metadata naming the (query id, batch id) it appended.
BATCH_MARKER = "appended_batch"


def last_batch_committed(path: str, app_id: str, since_ms: int) -> int | None:
    """The last batch of query ``app_id`` committed to the table since ``since_ms`` (epoch
    milliseconds of the commit), named by :func:`append_once` or by a Delta transaction
    identifier; -1 for none; None when the table's log no longer reaches back that far."""
    for version in range(delta_reader.latest_version(path), -1, -1):
        try:
            actions = delta_reader.commit_actions(path, version)
        except FileNotFoundError:  # removed by the log's clean-up
            return None
        for action in actions:
            if action.get("txn", {}).get("appId") == app_id:
                return int(action["txn"]["version"])
        info = delta_reader.info_among(actions)
        named = _named_batch(info.get("userMetadata"))
        if named is not None and named[0] == app_id:
            return named[1]
        # When the commit landed (its entry is written aside, then renamed into place), not
        # its commitInfo time: that is when its first attempt began, and a commit retried
        # after conflicts lands above later ones.
        if _landed_ms(path, version) < since_ms:
            return -1
    return -1


def _landed_ms(path: str, version: int) -> int:
    try:
        return delta_reader.commit_entry(path, version).stat().st_mtime_ns // 1_000_000
    except FileNotFoundError:  # cleaned up since it was read: long ago
        return 0


def _named_batch(user_metadata: str | None) -> tuple[str, int] | None:
    """The (query id, batch id) a commit's user metadata names, if it is
    :func:`append_once`'s (other writers keep other things there: gold's watermark, text)."""
    try:
        named = json.loads(user_metadata or "null")
    except ValueError:
        return None
    marker = named.get(BATCH_MARKER) if isinstance(named, dict) else None
    if (isinstance(marker, list) and len(marker) == 2 and isinstance(marker[0], str)
            and isinstance(marker[1], int)):
        return marker[0], marker[1]
    return None


def planned_time(checkpoint: str, batch_id: int) -> datetime:
    """The time Spark gave micro-batch ``batch_id`` of the query checkpointed at
    ``checkpoint`` when it planned it, kept in its offset log: ``current_timestamp()``
    inside the query, the same in a replay."""
    return datetime.fromtimestamp(0, UTC) + timedelta(
        milliseconds=_offset_log_time_ms(checkpoint, batch_id))


def batch_time(checkpoint: str, batch_id: int) -> datetime:
    """:func:`planned_time` of a stream's batch; for a batch run outside a stream (tests,
    benches: it has no offset log), now."""
    if _planned_by_stream(checkpoint, batch_id):
        return planned_time(checkpoint, batch_id)
    return datetime.now(UTC)


def _planned_by_stream(checkpoint: str, batch_id: int) -> bool:
    return (lake_path(checkpoint) / "offsets" / str(batch_id)).exists()


def _offset_log_time_ms(checkpoint: str, batch_id: int) -> int:
    return int(json.loads(_offset_log(checkpoint, batch_id)[1])["batchTimestampMs"])


def _planned_ms(rows: DataFrame, stamp_column: str, checkpoint: str, batch_id: int) -> int:
    """The time Spark gave batch ``batch_id`` when it planned it (:func:`planned_time`); for
    a batch run outside a stream (tests, benches), the time its rows are stamped with."""
    if _planned_by_stream(checkpoint, batch_id):
        return _offset_log_time_ms(checkpoint, batch_id)
    stamped = rows.select(F.unix_millis(F.min(stamp_column)).alias("ms")).first()
    return int(stamped.ms) if stamped.ms is not None else 0


def _rows_committed(rows: DataFrame, path: str, stamp_column: str, key_column: str,
                    planned_ms: int) -> bool:
    """Whether the table holds any of ``rows``' keys stamped with the batch's time."""
    log.warning("the log of %s no longer reaches back to a batch planned at %d ms: looking "
                "for its rows instead", path, planned_ms)
    stamped = rows.sparkSession.read.format("delta").load(path).where(
        F.col(stamp_column) == F.timestamp_millis(F.lit(planned_ms)))  # files skipped
    return not stamped.join(rows.select(key_column), key_column, "left_semi").isEmpty()


def query_id(checkpoint: str) -> str:
    """The id Spark gave the query the first time it ran on this checkpoint."""
    metadata = lake_path(checkpoint) / "metadata"
    return json.loads(metadata.read_text("utf-8").splitlines()[0])["id"]


def _source_offset(checkpoint: str, batch_id: int | None) -> dict[str, Any] | None:
    """The Delta source offset a query reached with batch ``batch_id`` (default: its last
    committed batch); None if it has committed none."""
    if batch_id is None:
        commits = [int(p.name) for p in (lake_path(checkpoint) / "commits").glob("[0-9]*")]
        if not commits:
            return None
        batch_id = max(commits)
    return json.loads(_offset_log(checkpoint, batch_id)[-1])


def committed_source_offset(checkpoint: str) -> dict[str, Any] | None:
    """The offset a single-source query's last committed batch reached (as its source
    writes it: ``{"logOffset": n}`` for files); None before any."""
    return _source_offset(checkpoint, None)


def _offset_log(checkpoint: str, batch_id: int) -> list[str]:
    """The lines of a query's offset log entry for ``batch_id``: its format's version, the
    batch's metadata (``batchTimestampMs``, the watermark, settings), then a line per
    source's offset."""
    return (lake_path(checkpoint) / "offsets" / str(batch_id)).read_text("utf-8").splitlines()


def read_position(checkpoint: str, batch_id: int | None = None) -> int | None:
    """The version of its Delta source that a query has read up to (exclusive), after batch
    ``batch_id`` (default: its last committed batch); None if it has committed none."""
    position = _source_offset(checkpoint, batch_id)
    return None if position is None else delta_source_read_before(position)


def delta_source_read_before(offset: dict[str, Any]) -> int:
    """The version a Delta source's offset has read up to, exclusive: ``reservoirVersion``
    with the ``index`` of the last file read in it (-1 for none; a version is counted read
    once any of its files is)."""
    return int(offset["reservoirVersion"]) + (1 if offset["index"] >= 0 else 0)


def fully_read_before(checkpoint: str) -> int | None:
    """The version of its Delta source before which a query has processed every row in
    committed batches (exclusive); None when it has no checkpoint, or reads no Delta source
    (the alert stream reading Kafka). A version it has read in part counts as unread, and so
    does everything while it still reads its starting snapshot (which holds the rows of all
    earlier versions): 0, as before its first batch."""
    if not (lake_path(checkpoint) / "offsets").is_dir():
        return None
    position = _source_offset(checkpoint, None)
    if position is None or position.get("isStartingVersion"):
        return 0
    if "reservoirVersion" in position:
        return position["reservoirVersion"]
    if position and all(isinstance(partitions, dict) for partitions in position.values()):
        return None  # Kafka's: {topic: {partition: offset}}
    raise ValueError(f"{checkpoint}: an offset of no known source: {position}")


@contextmanager
def idempotent_dml(spark: SparkSession, app_id: str, version: int) -> Iterator[None]:
    """MERGE, UPDATE and DELETE inside are applied at most once per (app id, version).

    ``spark`` must be the micro-batch's own session (``batch_df.sparkSession``): each
    streaming query has a session of its own, so concurrent queries do not see each
    other's settings.
    """
    spark.conf.set(TXN_APP_ID, app_id)
    spark.conf.set(TXN_VERSION, str(version))
    try:
        yield
    finally:
        spark.conf.unset(TXN_APP_ID)
        spark.conf.unset(TXN_VERSION)


@contextmanager
def session_setting(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    """``key`` set to ``value`` in ``spark`` (a micro-batch's own session, as above) for
    the work inside, then as it was."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


# A timestamp as SQL literal text with its offset: without one, a literal is read in the
# session time zone, and a time in an hour that a zone repeats in autumn could come back an
# hour off.
_SHOWN = "yyyy-MM-dd HH:mm:ss.SSSSSSXXX"


def time_bounds(column: str | Column) -> list[Column]:
    """Aggregates ``first`` and ``last``: the column's min and max as timestamp literal
    text for a predicate Delta skips files with, widened by a millisecond because Delta keeps
    timestamp statistics to the millisecond."""
    margin = F.expr("INTERVAL 1 MILLISECOND")
    return [F.date_format(F.min(column) - margin, _SHOWN).alias("first"),
            F.date_format(F.max(column) + margin, _SHOWN).alias("last")]


def idempotent_append_options(app_id: str, version: int) -> dict[str, str]:
    return {"txnAppId": app_id, "txnVersion": str(version)}


BatchProcessor = Callable[["SparkSession", "DataFrame", str, int], None]


def exactly_once_batches(checkpoint: str, process: BatchProcessor
                         ) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function calling ``process(session, batch, app_id, batch_id)``,
    where (app_id, batch_id) is the transaction identifier for its idempotent writes."""
    app_id: list[str] = []  # read once the query has written its checkpoint metadata
    query_name = lake_path(checkpoint).name
    _completed_in_run.pop(checkpoint, None)  # a new run: its first batch may be a replay

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        if not app_id:
            app_id.append(query_id(checkpoint))
        crash_point(f"{query_name}.before_batch")

        def attempt() -> None:
            try:
                process(batch.sparkSession, batch, app_id[0], batch_id)
            except BaseException:
                _completed_in_run.pop(checkpoint, None)  # it may have written part
                raise

        # The writes inside are idempotent, so a retry re-applies only what did not commit.
        retry_on_conflict(attempt, f"micro-batch {batch_id} of {query_name}")
        _completed_in_run[checkpoint] = batch_id
        crash_point(f"{query_name}.after_batch")  # written, not in the commit log yet

    return write_batch


# Spark's setting for running a micro-batch without new data when the watermark has moved.
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


def start_exactly_once(source: DataFrame, settings: Settings, query_name: str,
                       process: Callable[..., None], trigger: dict[str, object],
                       output_mode: str = "append", *, batches_without_data: bool = True
                       ) -> StreamingQuery:
    """Start ``source`` into ``process(session, batch, app_id, batch_id, settings=…)``, one
    micro-batch at a time, checkpointed under the query's name. Without
    ``batches_without_data``, Spark runs no batch only to move the watermark on (and drop
    expired state): for a query none of whose rows wait for one."""
    checkpoint = settings.checkpoint(query_name)
    batches = exactly_once_batches(checkpoint, partial(process, settings=settings))
    writer = (source.writeStream
              .queryName(query_name)
              .outputMode(output_mode)
              .foreachBatch(batches)
              .option("checkpointLocation", checkpoint)
              .trigger(**trigger))
    if batches_without_data:  # Spark's default, or the session's own setting
        return writer.start()
    with session_setting(source.sparkSession, NO_DATA_BATCHES, "false"):  # read at start
        return writer.start()


def retry_on_conflict(action: Callable[[], Result], what: str,
                      attempts: int = CONFLICT_ATTEMPTS) -> Result:
    """``action()``, retried with jittered backoff when a concurrent Delta commit conflicts
    with it; the last conflict propagates."""
    from delta import exceptions

    # Delta's Python conflict exceptions are siblings, not subclasses of one another.
    conflicts = tuple(getattr(exceptions, name) for name in exceptions.__all__)
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except conflicts as conflict:
            if attempt == attempts:
                raise
            pause = min(0.5 * 2 ** attempt, 15.0) * random.uniform(0.5, 1.0)
            log.warning("%s: concurrent Delta commit (%s); retry %d of %d in %.1fs", what,
                        type(conflict).__name__, attempt, attempts - 1, pause)
            time.sleep(pause)
    raise AssertionError("unreachable")
