"""Idempotent Delta writes for ``foreachBatch``: a replayed micro-batch changes nothing.

Delta records (app id, version) in the table's log with each commit and skips a later write
that carries a version it has already seen. The app id is the streaming query's id, kept in
its checkpoint: a new checkpoint is a new query, whose batch 0 must not be mistaken for the
old query's batch 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


def query_id(checkpoint: str) -> str:
    """The id Spark gave the query the first time it ran on this checkpoint."""
    metadata = Path(checkpoint) / "metadata"
    return json.loads(metadata.read_text("utf-8").splitlines()[0])["id"]


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


def idempotent_append_options(app_id: str, version: int) -> dict[str, str]:
    return {"txnAppId": app_id, "txnVersion": str(version)}


BatchProcessor = Callable[["SparkSession", "DataFrame", str, int], None]


def exactly_once_batches(checkpoint: str, process: BatchProcessor
                         ) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function calling ``process(session, batch, app_id, batch_id)``,
    where (app_id, batch_id) is the transaction identifier for its idempotent writes."""
    app_id: list[str] = []  # read once the query has written its checkpoint metadata

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        if not app_id:
            app_id.append(query_id(checkpoint))
        process(batch.sparkSession, batch, app_id[0], batch_id)

    return write_batch
