"""``silver.quarantine``: one row per rejected record.

Grain: one row per bronze record that broke a rule of contract section 3, with its raw text
exactly as in bronze, a machine-readable ``reason`` (``spark_jobs.reasons``), a
human-readable ``detail`` and the bronze ingestion metadata, so it can be replayed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from spark_jobs.bronze import ad_events as bronze
from spark_jobs.config import Settings
from spark_jobs.delta_writes import append_once, may_be_replay
from spark_jobs.tables import TableSpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

SCHEMA = StructType([
    *bronze.SCHEMA.fields,
    StructField("reason", StringType(), False),
    StructField("detail", StringType()),
    StructField("quarantined_at", TimestampType(), False),
])

TABLE = TableSpec.declared("silver.quarantine", SCHEMA)


def rejected(validated: DataFrame, quarantined_at: Column | None = None) -> DataFrame:
    """The validated records that broke a rule, as quarantine rows (quarantined now, unless
    ``quarantined_at`` says when)."""
    at = F.current_timestamp() if quarantined_at is None else quarantined_at
    return validated.where(F.col("reason").isNotNull()).select(
        *bronze.SCHEMA.fieldNames(), "reason", "detail", at.alias("quarantined_at"))


def append(validated: DataFrame, settings: Settings, app_id: str, batch_id: int, *,
           checkpoint: str, quarantined_at: Column,
           decided_before: Callable[[], bool] = lambda: False) -> None:
    """Quarantine the rejected records of micro-batch ``batch_id`` of query ``app_id``
    (checkpointed at ``checkpoint``) at most once
    (:func:`~spark_jobs.delta_writes.append_once`); ``quarantined_at`` is the batch's own
    time.

    A batch with none writes no commit: a commit that adds nothing costs a micro-batch
    about a second, and most batches of a clean feed reject nothing. So a replay cannot
    rely on finding its batch's commit; ``decided_before``, asked only when the batch may be
    a replay and there is something to append, says whether an earlier attempt at this
    batch got past this step, whose verdict then stands (rules changed across the restart
    must not put a record in quarantine that the attempt before placed elsewhere)."""
    rows = rejected(validated, quarantined_at)
    if rows.isEmpty() or (may_be_replay(checkpoint, batch_id) and decided_before()):
        return
    append_once(rows, TABLE.path(settings), checkpoint, batch_id, app_id=app_id,
                stamp_column="quarantined_at", key_column="bronze_id")
