"""``gold.ad_attribution``: which view led to each click.

Grain: one row per click matched to the latest view of the same ``user_id`` and ``ad_id``
at most ``attribution_max_gap`` (one hour) before it. A click without such a view has no
row.

The stream is a stream-stream join of silver's clicks and views with a watermark on each
side and the time-range condition, so Spark can drop a view from its state once no click
within the gap can still arrive: state holds about ``attribution_max_gap +
watermark_delay`` of views. Each micro-batch keeps the latest view per click and MERGEs it
in; a later micro-batch that finds a later view (it arrived out of order) replaces it.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DateType,
    DoubleType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.config import Settings, interval_seconds, spark_interval
from spark_jobs.delta_writes import idempotent_dml, start_exactly_once, time_bounds
from spark_jobs.gold import writer
from spark_jobs.range_rebuild import rebuild_range
from spark_jobs.silver import ad_events as silver
from spark_jobs.tables import TableSpec, ensure_table

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from spark_jobs.dates import DateRange
    from spark_jobs.range_rebuild import Change

# The Delta table the stream reads: VACUUM of it keeps what the stream has yet to read.
SOURCE_TABLE = silver.TABLE
# The join's bound: its state and every attribution written were built under it (``checkpoints``).
STATE_SETTINGS = ("attribution_max_gap",)

SCHEMA = StructType([
    StructField("click_event_id", StringType(), False),
    StructField("click_time", TimestampType(), False),
    StructField("click_date", DateType(), False),
    StructField("user_id", StringType(), False),
    StructField("ad_id", StringType(), False),
    StructField("view_event_id", StringType(), False),
    StructField("view_time", TimestampType(), False),
    StructField("seconds_from_view", DoubleType(), False),
])

TABLE = TableSpec.declared("gold.ad_attribution", SCHEMA)
# A batch's new attributions go to one file per this many (a small file each below it).
ATTRIBUTIONS_PER_FILE = 500_000
QUERY_NAME = str(TABLE.stream)  # the stream this module starts


def clicks(events: DataFrame) -> DataFrame:
    return events.where("event_type = 'click'").select(
        F.col("event_id").alias("click_event_id"), F.col("event_time").alias("click_time"),
        F.col("user_id").alias("click_user_id"), F.col("ad_id").alias("click_ad_id"))


def views(events: DataFrame) -> DataFrame:
    return events.where("event_type = 'view'").select(
        F.col("event_id").alias("view_event_id"), F.col("event_time").alias("view_time"),
        F.col("user_id").alias("view_user_id"), F.col("ad_id").alias("view_ad_id"))


def candidate_views(click_rows: DataFrame, view_rows: DataFrame, max_gap: str) -> DataFrame:
    """Every (click, view) of the same user and ad with the view at most ``max_gap`` before
    the click. Works on batch and streaming frames alike."""
    condition = F.expr(
        f"click_user_id = view_user_id AND click_ad_id = view_ad_id "
        f"AND view_time <= click_time "
        f"AND view_time >= click_time - INTERVAL {spark_interval(max_gap)}")
    return click_rows.join(view_rows, condition, "inner")


def latest_view_per_click(candidates: DataFrame) -> DataFrame:
    latest = Window.partitionBy("click_event_id").orderBy(
        F.desc("view_time"), F.desc("view_event_id"))
    return (candidates.withColumn("_rank", F.row_number().over(latest)).where("_rank = 1")
            .select("click_event_id", "click_time", F.to_date("click_time").alias("click_date"),
                    F.col("click_user_id").alias("user_id"), F.col("click_ad_id").alias("ad_id"),
                    "view_event_id", "view_time",
                    ((F.unix_micros("click_time") - F.unix_micros("view_time")) / 1e6)
                    .alias("seconds_from_view")))


def ad_attribution(events: DataFrame, max_gap: str) -> DataFrame:
    """The batch transform over silver events."""
    return latest_view_per_click(candidate_views(clicks(events), views(events), max_gap))


def upsert(spark: SparkSession, settings: Settings, attributions: DataFrame) -> None:
    """MERGE attributions in, a later view replacing an earlier one. Scoped to the clicks'
    own times (a click's row always has its click's time), so Delta skips the files of
    other times by their statistics: a batch's cost does not grow with every click ever."""
    from delta.tables import DeltaTable

    bounds = attributions.agg(*time_bounds("click_time"), F.count("*").alias("rows")).first()
    if bounds["first"] is None:
        return  # no click found a view: a commit that writes nothing costs as much
    scope = f"t.click_time BETWEEN TIMESTAMP'{bounds['first']}' AND TIMESTAMP'{bounds['last']}'"
    # A MERGE that matches nothing (the usual batch: new clicks) writes its source's
    # partitions as they are, one file per shuffle partition: four files a batch, which
    # Delta then replays in every later snapshot until maintenance compacts them.
    files = max(1, math.ceil(bounds["rows"] / ATTRIBUTIONS_PER_FILE))
    (DeltaTable.forPath(spark, TABLE.path(settings)).alias("t")
        .merge(attributions.coalesce(files).alias("s"),
               f"{scope} AND t.click_event_id = s.click_event_id")
        .whenMatchedUpdateAll(condition="s.view_time > t.view_time")
        .whenNotMatchedInsertAll()
        .execute())


def process(spark: SparkSession, batch: DataFrame, query_id: str, batch_id: int, *,
            settings: Settings) -> None:
    with writer.LOCK.batch(), idempotent_dml(spark, query_id, batch_id):  # see gold.writer
        # Cached: the scope's bounds and the MERGE both read the join's output.
        attributions = latest_view_per_click(batch).persist()
        try:
            upsert(spark, settings, attributions)
        finally:
            attributions.unpersist()


def rebuild(spark: SparkSession, settings: Settings, events: DataFrame, days: DateRange,
            dry_run: bool, before_write: Callable[[], None]) -> Change:
    """Replace the clicks of ``days`` with ``ad_attribution`` over ``events`` (silver at one
    version) where they differ; ``before_write`` runs just before the replace commits."""
    # A click's view may be up to the gap earlier, on the day before the range.
    gap = timedelta(seconds=interval_seconds(settings.attribution_max_gap))
    earliest = (datetime.combine(days.first, datetime.min.time()) - gap).date()
    attributions = ad_attribution(
        events.where(F.col("event_date").between(F.lit(earliest), F.lit(days.last))),
        settings.attribution_max_gap).where(days.holds("click_date"))
    return rebuild_range(spark, settings, TABLE, attributions, days.holds("click_date"),
                         F.col("click_date"), days.date_predicate("click_date"), dry_run,
                         before_write)


def start(spark: SparkSession, settings: Settings, trigger: dict[str, object]
          ) -> StreamingQuery:
    ensure_table(spark, settings, TABLE)
    delay = spark_interval(settings.watermark_delay)
    click_rows = clicks(silver.read_stream(spark, settings)).withWatermark("click_time", delay)
    view_rows = views(silver.read_stream(spark, settings)).withWatermark("view_time", delay)
    # Without batches of no data: after each batch that moved the watermark, Spark would
    # run one more only to drop the join's expired state (about 0.7 s of a gold trigger).
    # An inner join emits a row when it matches, so no row waits for such a batch, and the
    # next batch with data drops the state as well: nothing it could still match (a click
    # on time is at most the gap later than a view it matches).
    return start_exactly_once(
        candidate_views(click_rows, view_rows, settings.attribution_max_gap), settings,
        QUERY_NAME, process, trigger, batches_without_data=False)
