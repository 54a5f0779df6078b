"""Idempotent Delta writes for ``foreachBatch``: a replayed micro-batch changes nothing.

Delta records (app id, version) in the table's log with each commit and skips a later write
that carries a version it has already seen. The app id is the streaming query's id, kept in
its checkpoint: a new checkpoint is a new query, whose batch 0 must not be mistaken for the
old query's batch 0.
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

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        if not app_id:
            app_id.append(query_id(checkpoint))
        crash_point(f"{query_name}.before_batch")
        # The writes inside are idempotent, so a retry re-applies only what did not commit.
        retry_on_conflict(lambda: process(batch.sparkSession, batch, app_id[0], batch_id),
                          f"micro-batch {batch_id} of {query_name}")
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
