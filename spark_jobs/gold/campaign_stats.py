"""``gold.campaign_stats``: what each campaign's ads did, per event-time window.

Grain: one row per campaign and window (one minute by default; ``window_duration``):
``views``, ``clicks``, ``purchases`` and ``revenue``. Events count under the campaign their
ad was mapped to at the event's time, or ``unknown``.

``campaign_stats`` is the one transform; batch recomputation calls it over silver, the
stream over each micro-batch. The stream adds a micro-batch's counts to the window rows
with an idempotent MERGE (a late event inside the watermark updates its window's row). An
event whose window had already closed under the watermark when it arrived is not added:
it is counted in ``ops.late_data`` by window and date, for reprocessing to repair.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs import delta_reader
from spark_jobs.config import Settings, spark_interval
from spark_jobs.delta_writes import (
    batch_time,
    idempotent_dml,
    start_exactly_once,
    time_bounds,
)
from spark_jobs.faults import crash_point
from spark_jobs.gold import watermark, writer
from spark_jobs.ops import gold_rebuilds, late_data, stream_progress
from spark_jobs.range_rebuild import read_current, rebuild_range
from spark_jobs.silver import ad_campaigns
from spark_jobs.silver import ad_events as silver
from spark_jobs.tables import TableSpec, ensure_table
from spark_jobs.tables import read as read_table

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, Row, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from spark_jobs.dates import DateRange
    from spark_jobs.range_rebuild import Change

# The Delta table the stream reads: VACUUM of it keeps what the stream has yet to read.
SOURCE_TABLE = silver.TABLE
# The window is the table's key: windows of two lengths must not mix (``checkpoints``).
STATE_SETTINGS = ("window_duration",)
LAYER = "gold.campaign_stats"
KEYS = ("campaign_id", "window_start")
COUNTS = ("views", "clicks", "purchases", "revenue")
# The silver columns a micro-batch needs: the event_id to skip what a rebuild counted.
INPUTS = ("event_id", "event_date", "event_time", "event_type", "ad_id", "price")
# Where Delta notes the version its last commit in this Spark session wrote (each stream runs
# in a session of its own).
LAST_COMMIT_VERSION = "spark.databricks.delta.lastCommitVersionInSession"
# How many unchanged rows a batch's MERGE may rewrite before the closed windows are moved
# to a file of their own: about 100 minutes of one-minute windows of 100 campaigns.
COPIED_ROWS_BEFORE_SET_APART = 10_000
# Closed windows set apart go to files of about this many rows, in window order.
ROWS_PER_SET_APART_FILE = 1_000_000

# What a group of events did (a campaign's window here, a user's session in
# ``gold.user_sessions``): ``event_counts`` over them.
COUNT_FIELDS = [
    StructField("views", LongType(), False),
    StructField("clicks", LongType(), False),
    StructField("purchases", LongType(), False),
    StructField("revenue", DecimalType(18, 2), False),
]

SCHEMA = StructType([
    StructField("campaign_id", StringType(), False),
    StructField("window_start", TimestampType(), False),
    StructField("window_end", TimestampType(), False),
    *COUNT_FIELDS,
])

TABLE = TableSpec.declared("gold.campaign_stats", SCHEMA)
QUERY_NAME = str(TABLE.stream)  # the stream this module starts


def event_window(window_duration: str) -> Column:
    return F.window("event_time", spark_interval(window_duration))


def campaign_stats(events: DataFrame, mapping: DataFrame, window_duration: str) -> DataFrame:
    """Silver events and the SCD2 mapping to one row per campaign and window."""
    window = event_window(window_duration)
    return (ad_campaigns.campaign_at(events, mapping)
            .groupBy("campaign_id", window.alias("window"))
            .agg(*event_counts())
            .select("campaign_id", F.col("window.start").alias("window_start"),
                    F.col("window.end").alias("window_end"), *COUNTS))


def event_counts() -> list[Column]:
    """The aggregates of ``COUNT_FIELDS``: views, clicks, purchases, and revenue (the
    purchases' prices; a purchase without a price adds none)."""
    return [F.count_if(F.col("event_type") == "view").alias("views"),
            F.count_if(F.col("event_type") == "click").alias("clicks"),
            F.count_if(F.col("event_type") == "purchase").alias("purchases"),
            F.coalesce(F.sum(F.when(F.col("event_type") == "purchase", F.col("price"))),
                       F.lit(0)).cast("decimal(18,2)").alias("revenue")]


def add_to_windows(spark: SparkSession, settings: Settings, stats: DataFrame,
                   windows: tuple[str, str]) -> int | None:
    """MERGE the counts in; the table version it committed (None if it committed nothing:
    an idempotent replay). Scoped to the batch's windows (``windows``: the first and last
    start, as timestamp literal text), so Delta skips the files of other windows by their
    statistics: a batch's cost does not grow with the table."""
    from delta.tables import DeltaTable

    first, last = windows
    scope = f"t.window_start BETWEEN TIMESTAMP'{first}' AND TIMESTAMP'{last}'"
    keys = " AND ".join(f"t.{key} = s.{key}" for key in KEYS)
    # Unset first: the session's earlier commit (the ledger's, another table) may have
    # the very version number this MERGE gets.
    spark.conf.unset(LAST_COMMIT_VERSION)
    (DeltaTable.forPath(spark, TABLE.path(settings)).alias("t")
        .merge(stats.alias("s"), f"{scope} AND {keys}")
        .whenMatchedUpdate(set={name: f"t.{name} + s.{name}" for name in COUNTS})
        .whenNotMatchedInsertAll()
        .execute())
    committed = spark.conf.get(LAST_COMMIT_VERSION, None)
    return None if committed is None else int(committed)


def set_closed_windows_apart(spark: SparkSession, settings: Settings, watermark_micros: int,
                             merged: int) -> bool:
    """Move the windows closed under the watermark out of the file the stream's MERGEs keep
    rewriting, once the MERGE that committed version ``merged`` copied more than
    ``COPIED_ROWS_BEFORE_SET_APART`` unchanged rows; whether it did.

    A MERGE rewrites every file holding a window it updates, with all that file's other
    rows: the file written by one batch's MERGE is the next one's to rewrite, so without
    this it gathers every window since the last OPTIMIZE and each batch costs more, all
    day. Closed windows never change again in the stream (a late event goes to the ledger),
    so once set apart, in a file whose windows all lie before the watermark, no later
    batch's scope reaches them. The rows are the same before and after (a replace of
    exactly the rows it reads), so a replay or a crash in between changes no count."""
    path = TABLE.path(settings)
    # The commit's own metrics, read from its log entry (Delta's history call costs a
    # batch about 0.2 s).
    merge = delta_reader.commit_info(path, merged)
    copied = int(merge.get("operationMetrics", {}).get("numTargetRowsCopied", 0))
    if merge.get("operation") != "MERGE" or copied < COPIED_ROWS_BEFORE_SET_APART:
        return False
    # The files the MERGEs rewrite are those holding an open window (by their statistics in
    # the log); the first window they hold bounds the replace, so files already set apart
    # are left alone. After the nightly OPTIMIZE that is one file of the whole table: set
    # apart once, instead of rewritten whole by every batch until the next night.
    rewritten = [stats for stats in delta_reader.file_statistics(path, ("window_start",
                                                                         "window_end"))
                 if stats["max.window_end"] is None or stats["max.window_end"] > watermark_micros]
    if not rewritten or any(stats["min.window_start"] is None for stats in rewritten):
        return False  # nothing open, or a file without statistics: leave the layout alone
    first = min(stats["min.window_start"] for stats in rewritten)
    moved = (f"window_start >= timestamp_micros({first}) "
             f"AND window_end <= timestamp_micros({watermark_micros})")
    rows = spark.read.format("delta").load(path).where(moved)
    # Files in window order, a million rows each: later reads skip them by time.
    files = math.ceil(sum(stats["num_records"] for stats in rewritten) / ROWS_PER_SET_APART_FILE)
    laid_out = (rows.repartitionByRange(files, "window_start") if files > 1
                else rows.coalesce(1))
    laid_out.write.format("delta").mode("overwrite").option("replaceWhere", moved).save(path)
    return True


def process(spark: SparkSession, batch: DataFrame, query_id: str, batch_id: int, *,
            settings: Settings) -> None:
    with writer.LOCK.batch():  # never beside a gold rebuild (see ``gold.writer``)
        _process(spark, batch, query_id, batch_id, settings)


def _process(spark: SparkSession, batch: DataFrame, query_id: str, batch_id: int,
             settings: Settings) -> None:
    """One micro-batch: late events to the ledger, on-time ones added to their windows."""
    seen_before = watermark.latest_before(TABLE.path(settings), query_id, batch_id,
                                          settings.table_path(watermark.LEGACY_TABLE))
    applied = watermark.applied(seen_before, settings.watermark_delay)
    if applied is not None:
        stream_progress.report_watermark(query_id, batch_id, watermark.naive_utc(applied))
    # Cached first, and only the columns read below: every step reads the micro-batch,
    # which is then scanned once.
    rows = (batch.select(*INPUTS).withColumn("_window", event_window(settings.window_duration))
            .persist())
    try:
        events = gold_rebuilds.not_yet_counted(spark, settings, silver.TABLE.path(settings),
                                               rows)
        late = watermark.closed(F.col("_window.end"), applied)
        summary = _summarize(events, late)
        stream_progress.report_late_rows(query_id, batch_id, summary.late)
        if summary.late:
            late_events = events.where(late).withColumn("window_start", F.col("_window.start"))
            checkpoint = settings.checkpoint(QUERY_NAME)
            ledger_rows = late_data.entries(late_events, LAYER, applied, query_id, batch_id,
                                            batch_time(checkpoint, batch_id))
            late_data.append(settings, ledger_rows, checkpoint, query_id, batch_id)
            crash_point("gold_campaign_stats.after_ledger")
        latest = max((t for t in (seen_before, summary.latest) if t is not None), default=None)
        if summary.first is not None:  # something on time
            merged = _add_on_time(spark, settings, events.where(~late),
                                  (summary.first, summary.last), query_id, batch_id, latest)
            if applied is not None and merged is not None:
                set_closed_windows_apart(spark, settings, applied, merged)
        watermark.remember(TABLE.path(settings), query_id, batch_id, latest)
    finally:
        rows.unpersist()


def _summarize(events: DataFrame, late: Column) -> Row:
    """In one pass over the batch: its ``latest`` event time (microseconds), how many
    events are ``late``, and the ``first`` and ``last`` window of those on time."""
    # One pass tells what the batch needs: a ledger commit only if something is late
    # (most batches, and all before a watermark, have nothing late: a commit that
    # writes nothing costs a gold batch as much as one that does), a MERGE only if
    # something is on time, over the windows it touches.
    return (events.withColumn("_on_time_start", F.when(~late, F.col("_window.start")))
            .agg(F.unix_micros(F.max("event_time")).alias("latest"),
                 F.count_if(late).alias("late"),
                 *time_bounds("_on_time_start")).first())


def _add_on_time(spark: SparkSession, settings: Settings, on_time: DataFrame,
                 windows: tuple[str, str], query_id: str, batch_id: int, latest: int
                 ) -> int | None:
    """MERGE the on-time events' counts into ``windows``, once per batch, in a commit that
    carries the latest event time up to this batch; the version it committed, if any."""
    mapping = read_table(spark, settings, ad_campaigns.TABLE)
    stats = campaign_stats(on_time.drop("_window"), mapping, settings.window_duration)
    with (idempotent_dml(spark, query_id, batch_id),
          watermark.carried_by_commit(spark, query_id, batch_id, latest)):
        return add_to_windows(spark, settings, stats, windows)


def rebuild(spark: SparkSession, settings: Settings, events: DataFrame, days: DateRange,
            dry_run: bool, before_write: Callable[[], None]) -> Change:
    """Replace the windows of ``days`` with ``campaign_stats`` over ``events`` (silver at
    one version) where they differ; ``before_write`` runs just before the replace commits."""
    mapping = read_current(spark, settings, ad_campaigns.TABLE)
    stats = campaign_stats(events.where(days.holds("event_date")), mapping,
                           settings.window_duration)
    in_days = days.predicate("window_start")
    return rebuild_range(spark, settings, TABLE, stats, in_days, F.to_date("window_start"),
                         in_days, dry_run, before_write)


def start(spark: SparkSession, settings: Settings, trigger: dict[str, object]
          ) -> StreamingQuery:
    for table in (TABLE, ad_campaigns.TABLE, late_data.TABLE, gold_rebuilds.TABLE):
        ensure_table(spark, settings, table)
    return start_exactly_once(silver.read_stream(spark, settings), settings, QUERY_NAME,
                              process, trigger)
