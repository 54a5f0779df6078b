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
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pyspark.sql import functions as F

from spark_jobs.faults import crash_point

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


def append_once(rows: DataFrame, path: str, checkpoint: str, batch_id: int, *,
                stamp_column: str, key_column: str) -> bool:
    """Append micro-batch ``batch_id``'s ``rows``, whose ``stamp_column`` holds the batch's
    own time, unless an earlier run committed them already; whether it appended.

    The time is ``current_timestamp()`` within the streaming query, which Spark fixes when
    it plans the batch and keeps in its offset log, so a replay carries it again. An append
    commits all of a batch's rows or none, so any one of them (its ``key_column``, unique
    to the row's record, with the stamp: another query's batch may share the millisecond)
    proves the batch's commit. Looked for only where a replay is possible
    (:func:`may_be_replay`): once a run, where Delta's transaction check rebuilds the
    table's state for every batch.
    """
    if not may_be_replay(checkpoint, batch_id):
        rows.write.format("delta").mode("append").save(path)
        return True
    rows = rows.persist()  # computed once for the look and the append (metrics count once)
    try:
        first = rows.select(F.unix_micros(stamp_column).alias("stamp"), key_column).first()
        if first is None:
            return False
        # Literals, so files are skipped by their statistics.
        committed = rows.sparkSession.read.format("delta").load(path).where(
            (F.col(stamp_column) == F.timestamp_micros(F.lit(first.stamp)))
            & (F.col(key_column) == F.lit(first[key_column])))
        if not committed.isEmpty():
            log.info("batch %d of %s was committed to %s by an earlier run: not again",
                     batch_id, Path(checkpoint).name, path)
            return False
        rows.write.format("delta").mode("append").save(path)
        return True
    finally:
        rows.unpersist()


def query_id(checkpoint: str) -> str:
    """The id Spark gave the query the first time it ran on this checkpoint."""
    metadata = Path(checkpoint) / "metadata"
    return json.loads(metadata.read_text("utf-8").splitlines()[0])["id"]


def _source_offset(checkpoint: str, batch_id: int | None) -> dict[str, Any] | None:
    """The Delta source offset a query reached with batch ``batch_id`` (default: its last
    committed batch); None if it has committed none."""
    if batch_id is None:
        commits = [int(p.name) for p in (Path(checkpoint) / "commits").glob("[0-9]*")]
        if not commits:
            return None
        batch_id = max(commits)
    offset = (Path(checkpoint) / "offsets" / str(batch_id)).read_text("utf-8")
    return json.loads(offset.splitlines()[-1])


def read_position(checkpoint: str, batch_id: int | None = None) -> int | None:
    """The version of its Delta source that a query has read up to (exclusive), after batch
    ``batch_id`` (default: its last committed batch); None if it has committed none."""
    position = _source_offset(checkpoint, batch_id)
    if position is None:
        return None
    return position["reservoirVersion"] + (1 if position["index"] >= 0 else 0)


def fully_read_before(checkpoint: str) -> int | None:
    """The version of its Delta source before which a query has processed every row in
    committed batches (exclusive); None when it has no checkpoint. A version it has read in
    part counts as unread, and so does everything while it still reads its starting snapshot
    (which holds the rows of all earlier versions): 0, as before its first batch."""
    if not (Path(checkpoint) / "offsets").is_dir():
        return None
    position = _source_offset(checkpoint, None)
    if position is None or position.get("isStartingVersion"):
        return 0
    return position["reservoirVersion"]


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


# A timestamp as SQL literal text with its offset: without one, a literal is read in the
# session time zone, and a time in an hour that a zone repeats in autumn could come back an
# hour off.
_SHOWN = "yyyy-MM-dd HH:mm:ss.SSSSSSXXX"


def time_bounds(column: str) -> list[Column]:
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
    query_name = Path(checkpoint).name
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


def start_exactly_once(source: DataFrame, settings: Settings, query_name: str,
                       process: Callable[..., None], trigger: dict[str, object]
                       ) -> StreamingQuery:
    """Start ``source`` into ``process(session, batch, app_id, batch_id, settings=…)``, one
    micro-batch at a time, checkpointed under the query's name."""
    checkpoint = settings.checkpoint(query_name)
    return (source.writeStream
            .queryName(query_name)
            .foreachBatch(exactly_once_batches(checkpoint, partial(process, settings=settings)))
            .option("checkpointLocation", checkpoint)
            .trigger(**trigger)
            .start())


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
