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
from spark_jobs.delta_writes import idempotent_append_options
from spark_jobs.tables import TableSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

SCHEMA = StructType([
    *bronze.SCHEMA.fields,
    StructField("reason", StringType(), False),
    StructField("detail", StringType()),
    StructField("quarantined_at", TimestampType(), False),
])

TABLE = TableSpec.declared("silver.quarantine", SCHEMA)


def rejected(validated: DataFrame) -> DataFrame:
    """The validated records that broke a rule, as quarantine rows."""
    return validated.where(F.col("reason").isNotNull()).select(
        *bronze.SCHEMA.fieldNames(), "reason", "detail",
        F.current_timestamp().alias("quarantined_at"))


def append(validated: DataFrame, settings: Settings, app_id: str, version: int, *,
           decided_before: Callable[[], bool] = lambda: False) -> None:
    """Quarantine the rejected records of a micro-batch, at most once per batch.

    A batch with none writes no commit: a commit that adds nothing costs a micro-batch
    about a second, and most batches of a clean feed reject nothing. So a replay's append
    can no longer rely on finding its batch's commit; ``decided_before``, asked only when
    there is something to append, says whether an earlier attempt at this batch got past
    this step, whose verdict then stands (rules changed across the restart must not put a
    record in quarantine that the attempt before placed elsewhere)."""
    rows = rejected(validated)
    if rows.isEmpty() or decided_before():
        return
    (rows.write.format("delta").mode("append")
        .options(**idempotent_append_options(app_id, version))
        .save(TABLE.path(settings)))
