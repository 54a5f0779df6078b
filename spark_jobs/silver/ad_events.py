"""``silver.ad_events``: one row per distinct valid ``event_id``, typed and normalised.

Grain: one row per distinct valid event, however late or often it was delivered; the row
keeps the first delivery's bronze identity. Partitioned by ``event_date`` (UTC), so date
ranges prune, and a late event lands in its own date.

Deduplication is exact across all history: each micro-batch is deduplicated in itself,
then inserted with an insert-only MERGE on ``event_id`` scoped to the batch's event dates
(an event_id always comes with the same event_time, so its copies share a date). The MERGE
and the quarantine append carry the query id and batch id as a Delta transaction
identifier, so a batch replayed after a crash is not applied twice.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DateType,
    DecimalType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.bronze import ad_events as bronze
from spark_jobs.config import Settings
from spark_jobs.delta_writes import idempotent_dml, start_exactly_once
from spark_jobs.silver import quarantine
from spark_jobs.silver.validation import Rules, validate
from spark_jobs.tables import TableSpec, ensure_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

QUERY_NAME = "silver_ad_events"

SCHEMA = StructType([
    StructField("event_id", StringType(), False),
    StructField("event_time", TimestampType(), False),
    StructField("event_date", DateType(), False),
    StructField("event_type", StringType(), False),
    StructField("user_id", StringType()),
    StructField("page_id", StringType()),
    StructField("ad_id", StringType(), False),
    StructField("ad_type", StringType()),
    StructField("ip_address", StringType()),
    StructField("price", DecimalType(12, 2)),
    StructField("_rescued", StringType()),  # JSON text of fields the contract does not name
    StructField("event_id_derived", BooleanType(), False),
    StructField("bronze_id", StringType(), False),  # the first delivery
    StructField("source", StringType(), False),
    StructField("ingested_at", TimestampType(), False),
])

# Statistics on what queries and Z-order filter by; the event_id is random, so min/max
# statistics on it would skip nothing.
TABLE = TableSpec("silver.ad_events", SCHEMA, partitioned_by=("event_date",),
                  stats_columns=("event_time", "event_type", "ad_id", "ingested_at"))


def accepted(validated: DataFrame) -> DataFrame:
    """The valid records, as silver rows (duplicates still in)."""
    return validated.where(F.col("reason").isNull()).select(*SCHEMA.fieldNames())


def first_deliveries(events: DataFrame) -> DataFrame:
    """One row per event_id: the earliest delivery (by ingestion time, then bronze id)."""
    earliest = Window.partitionBy("event_id").orderBy("ingested_at", "bronze_id")
    return (events.withColumn("_delivery", F.row_number().over(earliest))
            .where("_delivery = 1").drop("_delivery"))


def insert_new_events(spark: SparkSession, settings: Settings, events: DataFrame,
                      dates_from: DataFrame | None = None) -> None:
    """Insert the events whose event_id silver does not hold yet (events are distinct).

    ``dates_from`` holds the same event dates as ``events`` more cheaply (the valid records
    before deduplication: copies share a date), so the MERGE's scope costs no extra pass
    over the deduplication."""
    from delta.tables import DeltaTable

    dates = sorted(row.event_date for row in (events if dates_from is None else dates_from)
                   .select("event_date").distinct().collect())
    if not dates:
        return
    in_dates = ", ".join(f"DATE'{day.isoformat()}'" for day in dates)
    (DeltaTable.forPath(spark, TABLE.path(settings)).alias("t")
        .merge(events.alias("s"), f"t.event_date IN ({in_dates}) AND t.event_id = s.event_id")
        .whenNotMatchedInsertAll()
        .execute())


def process(spark: SparkSession, bronze_rows: DataFrame, app_id: str,
            version: int, *, settings: Settings) -> None:
    """Validate bronze rows; quarantine the rejected, insert the new valid events."""
    validated = validate(bronze_rows, Rules.from_settings(settings)).persist()
    try:
        quarantine.append(validated, settings, app_id, version)
        valid = accepted(validated)
        with idempotent_dml(spark, app_id, version):
            insert_new_events(spark, settings, first_deliveries(valid), dates_from=valid)
    finally:
        validated.unpersist()


def start(spark: SparkSession, settings: Settings, trigger: dict[str, object]
          ) -> StreamingQuery:
    for table in (bronze.TABLE, TABLE, quarantine.TABLE):
        ensure_table(spark, settings, table)
    new_bronze_rows = (spark.readStream.format("delta")
                       .option("maxFilesPerTrigger", settings.max_files_per_trigger)
                       .load(bronze.TABLE.path(settings)))
    return start_exactly_once(new_bronze_rows, settings, QUERY_NAME, process, trigger)
