"""``silver.ad_campaigns``: the ad to campaign mapping as SCD2 versions.

Grain: one row per mapping version: ``ad_id``, ``campaign_id``, ``valid_from`` and
``valid_to`` (the next version's ``valid_from``; NULL while current). A later file moves an
ad from its ``valid_from`` on; files may arrive in any order, so each batch recomputes the
versions of the (small) mapping as a whole. Unusable lines go to ``silver.quarantine``
with reason ``bad_campaign_mapping``, never silently away.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from spark_jobs import reasons
from spark_jobs.bronze.ad_events import lines_from_files
from spark_jobs.config import Settings
from spark_jobs.delta_writes import idempotent_append_options, start_exactly_once
from spark_jobs.landing import whole_files
from spark_jobs.silver import quarantine
from spark_jobs.silver.validation import parse_event_time
from spark_jobs.tables import TableSpec, ensure_table
from spark_jobs.tables import read as read_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

SOURCE = "campaign_file"

SCHEMA = StructType([
    StructField("ad_id", StringType(), False),
    StructField("campaign_id", StringType(), False),
    StructField("valid_from", TimestampType(), False),
    StructField("valid_to", TimestampType()),
    StructField("source_file", StringType(), False),
    StructField("ingested_at", TimestampType(), False),
])

TABLE = TableSpec.declared("silver.ad_campaigns", SCHEMA)
QUERY_NAME = str(TABLE.stream)  # the stream this module starts


def parse_mappings(lines: DataFrame) -> DataFrame:
    """Mapping lines (bronze-shaped) to lines plus ``ad_id``, ``campaign_id``,
    ``valid_from`` and a ``reason`` that is NULL for a usable line."""
    fields = F.from_json("raw", "map<string,variant>")
    ad_id = F.trim(F.try_variant_get(fields["ad_id"], "$", "string"))
    campaign_id = F.trim(F.try_variant_get(fields["campaign_id"], "$", "string"))
    valid_from = parse_event_time(fields["valid_from"])
    usable = (F.coalesce(F.length(ad_id) > 0, F.lit(False))
              & F.coalesce(F.length(campaign_id) > 0, F.lit(False)) & valid_from.isNotNull())
    return lines.select(
        "*", ad_id.alias("ad_id"), campaign_id.alias("campaign_id"),
        valid_from.alias("valid_from"),
        F.when(~usable, F.lit(reasons.BAD_CAMPAIGN_MAPPING)).alias("reason"),
        F.when(~usable, F.lit("a mapping needs ad_id, campaign_id and a valid_from time"))
        .alias("detail"))


def versions(mappings: DataFrame) -> DataFrame:
    """Mapping rows in any order to SCD2 versions: the latest arrival wins a tie on
    (ad_id, valid_from), and each version ends where the ad's next one starts."""
    latest = Window.partitionBy("ad_id", "valid_from").orderBy(
        F.desc("ingested_at"), F.desc("source_file"))
    following = Window.partitionBy("ad_id").orderBy("valid_from")
    return (mappings.select("ad_id", "campaign_id", "valid_from", "source_file", "ingested_at")
            .withColumn("_arrival", F.row_number().over(latest))
            .where("_arrival = 1")
            .withColumn("valid_to", F.lead("valid_from").over(following))
            .select(*SCHEMA.fieldNames()))


def campaign_at(events: DataFrame, mapping: DataFrame, unknown: str = "unknown") -> DataFrame:
    """Each event with the campaign its ad was mapped to at the event's time, or
    ``unknown``: a point-in-time lookup that never drops an event."""
    version = mapping.select("ad_id", "campaign_id", "valid_from", "valid_to").alias("m")
    matched = events.alias("e").join(
        version,
        (F.col("e.ad_id") == F.col("m.ad_id"))
        & (F.col("e.event_time") >= F.col("m.valid_from"))
        & (F.col("m.valid_to").isNull() | (F.col("e.event_time") < F.col("m.valid_to"))),
        "left")
    return matched.select("e.*", F.coalesce("m.campaign_id", F.lit(unknown)).alias("campaign_id"))


def process(spark: SparkSession, lines: DataFrame, app_id: str,
            version: int, *, settings: Settings) -> None:
    parsed = parse_mappings(lines.withColumn("source", F.lit(SOURCE))
                            .withColumn("bronze_id", F.concat_ws(
                                ":", F.lit("campaign"), "source_file", "source_line"))
                            ).persist()
    try:
        quarantine.append(parsed, settings, app_id, version,
                          checkpoint=settings.checkpoint(QUERY_NAME),
                          quarantined_at=F.col("ingested_at"))
        new_rows = parsed.where(F.col("reason").isNull())
        current = read_table(spark, settings, TABLE)
        inputs = ["ad_id", "campaign_id", "valid_from", "source_file", "ingested_at"]
        (versions(current.select(inputs).unionByName(new_rows.select(inputs)))
            .write.format("delta").mode("overwrite")
            .options(**idempotent_append_options(app_id, version))
            .save(TABLE.path(settings)))
    finally:
        parsed.unpersist()


def start(spark: SparkSession, settings: Settings, trigger: dict[str, object]
          ) -> StreamingQuery:
    for table in (TABLE, quarantine.TABLE):
        ensure_table(spark, settings, table)
    # Split into lines within the streaming query, so that each line's ``ingested_at`` is
    # the batch's own time, the same in a replay (the quarantine's stamp).
    new_lines = lines_from_files(whole_files(spark, settings.landing_campaigns, "*.jsonl"))
    return start_exactly_once(new_lines, settings, QUERY_NAME, process, trigger)
