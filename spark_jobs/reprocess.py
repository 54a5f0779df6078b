"""Reprocessing: rebuild event dates of silver and gold from bronze, in batch, idempotently.

The batch runner of the very transforms the streams use (``validate``,
``first_deliveries``, ``campaign_stats``, ``ad_attribution``), so a rebuilt date holds what
the stream would have written had every event arrived in time. Each table's range is
replaced in one Delta transaction (``replaceWhere``), and only when its content changes:
a second identical run writes nothing at all.

Live streams and a reprocess get along: a conflicting commit is retried on both sides
(``retry_on_conflict``); silver's replace is a change commit the gold streams skip; a gold
rebuild runs where gold's one writer is, inside the driver of a live gold stream and never
beside one of its micro-batches (``gold.writer``); and the gold stream does not add again
what a gold rebuild already counted (``ops.gold_rebuilds``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING

from pyspark.sql import Column
from pyspark.sql import functions as F

from spark_jobs import delta_reader
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.config import Settings, interval_seconds, parse_choices
from spark_jobs.dates import DateRange
from spark_jobs.delta_writes import fully_read_before, retry_on_conflict
from spark_jobs.gold import ad_attribution, campaign_stats
from spark_jobs.ops import gold_rebuilds, late_data
from spark_jobs.silver import ad_campaigns, quarantine
from spark_jobs.silver import ad_events as silver
from spark_jobs.silver.validation import Rules, validate
from spark_jobs.tables import TableSpec, ensure_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

LAYERS = ("silver", "gold")


class ReprocessError(ValueError):
    """A request that cannot be carried out; the message is meant for the user."""


@dataclass
class Change:
    """What a rebuild did (or, in a dry run, would do) to one table."""

    table: str
    rows_before: dict[str, int] = field(default_factory=dict)  # per event date
    rows_after: dict[str, int] = field(default_factory=dict)
    written: bool = False
    note: str = ""

    @property
    def changed_dates(self) -> list[str]:
        return sorted(day for day in self.rows_before.keys() | self.rows_after.keys()
                      if self.rows_before.get(day) != self.rows_after.get(day))

    def as_json(self) -> dict[str, object]:
        return {"table": self.table, "written": self.written, "note": self.note,
                "rows_before": self.rows_before, "rows_after": self.rows_after}


def _rows_per_date(frame: DataFrame, date_column: Column) -> dict[str, int]:
    return {row.day.isoformat(): row.n for row in
            frame.groupBy(date_column.alias("day")).agg(F.count("*").alias("n")).collect()}


def _same_rows(left: DataFrame, right: DataFrame) -> bool:
    return (left.exceptAll(right).limit(1).count() == 0
            and right.exceptAll(left).limit(1).count() == 0)


def _read(spark: SparkSession, settings: Settings, spec: TableSpec) -> DataFrame:
    ensure_table(spark, settings, spec)
    return spark.read.format("delta").load(spec.path(settings))


def _version(spark: SparkSession, settings: Settings, spec: TableSpec) -> int:
    """The table's latest version, read from its log without a Spark job."""
    ensure_table(spark, settings, spec)
    return delta_reader.latest_version(spec.path(settings))


def _read_pinned(spark: SparkSession, settings: Settings, spec: TableSpec,
                 before: int | None = None) -> tuple[DataFrame, int]:
    """The table as of its current version, or of the last one before ``before`` (the same
    rows however often it is read), and that version; no rows when none is."""
    version = _version(spark, settings, spec)
    if before is not None:
        version = min(version, before - 1)
    rows = (spark.read.format("delta").option("versionAsOf", max(version, 0))
            .load(spec.path(settings)))
    return (rows if version >= 0 else rows.limit(0)), version


def _replace_range(spark: SparkSession, settings: Settings, spec: TableSpec, rows: DataFrame,
                   predicate: str, change: Change, dry_run: bool,
                   before_write: Callable[[], None] = lambda: None,
                   counted_at_one_version: bool = True) -> None:
    """Replace the rows matching ``predicate`` with ``rows`` in one commit, unless equal.

    ``counted_at_one_version``: the change's counts before and after saw the same version
    of the table (gold's, under its one writer, always do)."""
    current = _read(spark, settings, spec).where(predicate)
    rows = rows.select(*spec.schema.fieldNames())
    # Counts that differ on a date already say the rows differ; the exact comparison, which
    # costs more than computing the rows, only runs when every date's count is the same,
    # or when a commit between the two counts may be all that made them differ.
    differs = bool(change.changed_dates) and counted_at_one_version
    if not differs and _same_rows(current, rows):
        change.note = "unchanged"
        return
    if dry_run:
        change.note = "would be replaced"
        return
    before_write()
    (rows.write.format("delta").mode("overwrite")
        .option("replaceWhere", predicate).save(spec.path(settings)))
    change.written, change.note = True, "replaced"


# -- silver ----------------------------------------------------------------------------


def rebuild_silver(spark: SparkSession, settings: Settings, days: DateRange, rules: Rules,
                   dry_run: bool) -> list[Change]:
    """Silver's rows of ``days`` re-derived from bronze, and quarantine reconciled: a record
    that now passes leaves quarantine, one that now fails enters it.

    Only bronze ingested since ``earliest_ingestion`` is read: no older record can belong
    to ``days``, so a rebuild of recent days costs the same with years of bronze behind it.
    """
    changes: list[Change] = []

    def attempt() -> None:
        changes.clear()
        # One bronze snapshot for both reads below: with a fresh read for the "arrived
        # since" rows, a record landing between them would be in neither set, and dropped.
        # And only the records silver's stream has judged in its committed batches: one it
        # has yet to read, judged here too, would be quarantined twice (here, then by the
        # stream), and one in its batch under way is that batch's to place. What the
        # stream inserts meanwhile is kept as arrived since; with no stream, all of bronze.
        bronze_rows, _ = _read_pinned(spark, settings, bronze.TABLE, fully_read_before(
            settings.checkpoint(silver.QUERY_NAME)))
        bronze_rows = bronze_rows.where(
            F.col("ingest_date") >= F.lit(earliest_ingestion(spark, settings, days, rules)))
        # Only the records of ``days`` matter below: the others are not kept in memory.
        validated = silver.slimmed(
            validate(bronze_rows, rules).where(days.holds("event_date"))).persist()
        try:
            changes.extend(_rebuild_silver_from(spark, settings, days, bronze_rows, validated,
                                                dry_run))
        finally:
            validated.unpersist()

    retry_on_conflict(attempt, f"silver rebuild of {days}")
    return changes


def earliest_ingestion(spark: SparkSession, settings: Settings, days: DateRange,
                       rules: Rules) -> date:
    """The earliest ingest date of a bronze record that can matter to ``days``.

    A valid event is at most the future tolerance ahead of its ingestion, so no record
    ingested earlier can pass into ``days``; and a row silver holds for ``days`` now (valid
    under earlier rules, perhaps with a wider tolerance) must be found in bronze to be judged
    again, so its own ingestion bounds the read too.
    """
    by_rules = (datetime.combine(days.first, datetime.min.time())
                - timedelta(seconds=rules.future_tolerance_seconds)).date()
    held = (_read(spark, settings, silver.TABLE).where(days.holds("event_date"))
            .agg(F.min(F.to_date("ingested_at")).alias("earliest")).first().earliest)
    return by_rules if held is None else min(by_rules, held)


def _rebuild_silver_from(spark: SparkSession, settings: Settings, days: DateRange,
                         bronze_rows: DataFrame, validated: DataFrame, dry_run: bool
                         ) -> list[Change]:
    current = _read(spark, settings, silver.TABLE).where(days.holds("event_date"))
    # Rows the live silver stream added from bronze records newer than this snapshot stay;
    # the first delivery over all history wins, which keeps dedup exact across the range's
    # boundaries.
    arrived_since = current.join(bronze_rows.select("bronze_id"), "bronze_id", "left_anti")
    # The snapshot's own first deliveries are kept in memory (they are read up to three
    # times); the rows arrived since are not: read again when the replace runs, inside its
    # transaction, a row the stream commits meanwhile is a conflict (retried), not lost.
    # One delivery per event_id either way: the first of the first is the first of all.
    fresh = silver.first_deliveries(silver.accepted(validated)).persist()
    try:
        events = silver.first_deliveries(fresh.unionByName(arrived_since))
        counted_at = _version(spark, settings, silver.TABLE)
        silver_change = Change(silver.TABLE.name, _rows_per_date(current, F.col("event_date")),
                               _rows_per_date(events, F.col("event_date")))
        one_version = _version(spark, settings, silver.TABLE) == counted_at

        quarantined = _read(spark, settings, quarantine.TABLE).select("bronze_id")
        passing_now = validated.where(F.col("reason").isNull()).select("bronze_id").join(
            quarantined, "bronze_id")
        failing_now = quarantine.rejected(validated).join(quarantined, "bronze_id", "left_anti")
        released, newly_rejected = passing_now.count(), failing_now.count()
        quarantine_change = Change(quarantine.TABLE.name,
                                   note=f"{released} records now pass and leave quarantine, "
                                        f"{newly_rejected} now fail and enter it")

        _replace_range(spark, settings, silver.TABLE, events,
                       days.date_predicate("event_date"),
                       silver_change, dry_run, counted_at_one_version=one_version)
    finally:
        fresh.unpersist()
    if not dry_run and (released or newly_rejected):
        _move_out_of_quarantine(spark, settings, passing_now)
        failing_now.write.format("delta").mode("append").save(quarantine.TABLE.path(settings))
        quarantine_change.written = True
    return [silver_change, quarantine_change]


def _move_out_of_quarantine(spark: SparkSession, settings: Settings, bronze_ids: DataFrame
                            ) -> None:
    from delta.tables import DeltaTable

    (DeltaTable.forPath(spark, quarantine.TABLE.path(settings)).alias("q")
        .merge(bronze_ids.distinct().alias("r"), "q.bronze_id = r.bronze_id")
        .whenMatchedDelete()
        .execute())


def replay_quarantine(spark: SparkSession, settings: Settings, rules: Rules,
                      reason: str | None, dry_run: bool) -> list[Change]:
    """Re-validate quarantined records with ``rules``; move those that now pass into silver.

    The insert into silver, the adoption of deliveries earlier than silver's (an event's row
    is its first delivery) and the delete from quarantine are three commits. Each is
    idempotent, so a replay interrupted between them is completed by running it again
    (the audit shows such records as accounted twice until then)."""
    held = _read(spark, settings, quarantine.TABLE)
    if reason:
        held = held.where(F.col("reason") == reason)
    revalidated = validate(held.select(*bronze.SCHEMA.fieldNames()), rules).persist()
    try:
        passing = silver.accepted(revalidated)
        by_reason = {row.reason: row.n for row in
                     held.join(passing.select("bronze_id"), "bronze_id")
                     .groupBy("reason").agg(F.count("*").alias("n")).collect()}
        change = Change(quarantine.TABLE.name,
                        rows_after=_rows_per_date(passing, F.col("event_date")),
                        note=f"records that now pass, by former reason: {by_reason or 'none'}")
        if by_reason and not dry_run:
            def write() -> None:
                ensure_table(spark, settings, silver.TABLE)
                silver.insert_new_events(spark, settings, passing)
                silver.adopt_earlier_deliveries(spark, settings,
                                                silver.first_deliveries(passing))
                _move_out_of_quarantine(spark, settings, passing.select("bronze_id"))

            retry_on_conflict(write, "quarantine replay")
            change.written = True
        return [change]
    finally:
        revalidated.unpersist()


# -- gold ------------------------------------------------------------------------------


def rebuild_gold(spark: SparkSession, settings: Settings, days: DateRange, dry_run: bool
                 ) -> list[Change]:
    """Gold's windows and clicks of ``days`` recomputed from silver; the late-data ledger's
    entries for those dates marked repaired."""

    changes: list[Change] = []
    computed: list[DataFrame] = []  # kept in memory for one attempt

    def forget_computed() -> None:
        for frame in computed:
            frame.unpersist()
        computed.clear()

    def write() -> None:
        changes.clear()
        forget_computed()  # a failed attempt's
        started = datetime.now(UTC).replace(tzinfo=None)
        events, version = _read_pinned(spark, settings, silver.TABLE)
        mapping = _read(spark, settings, ad_campaigns.TABLE)

        # Computed from a pinned version of silver, so they can be kept in memory for the
        # counts, the comparison and the write alike.
        stats = campaign_stats.campaign_stats(events.where(days.holds("event_date")), mapping,
                                              settings.window_duration).persist()
        computed.append(stats)
        stats_change = Change(campaign_stats.TABLE.name,
                              _rows_per_date(_read(spark, settings, campaign_stats.TABLE)
                                             .where(days.predicate("window_start")),
                                             F.to_date("window_start")),
                              _rows_per_date(stats, F.to_date("window_start")))

        def record_rebuild() -> None:
            ensure_table(spark, settings, gold_rebuilds.TABLE)
            gold_rebuilds.record(spark, settings, days.days, version)

        _replace_range(spark, settings, campaign_stats.TABLE, stats,
                       days.predicate("window_start"), stats_change, dry_run, record_rebuild)

        # A click's view may be up to the gap earlier, on the day before the range.
        gap = timedelta(seconds=interval_seconds(settings.attribution_max_gap))
        earliest = (datetime.combine(days.first, datetime.min.time()) - gap).date()
        attributions = (ad_attribution.ad_attribution(
            events.where(F.col("event_date").between(F.lit(earliest), F.lit(days.last))),
            settings.attribution_max_gap).where(days.holds("click_date"))).persist()
        computed.append(attributions)
        attribution_change = Change(ad_attribution.TABLE.name,
                                    _rows_per_date(_read(spark, settings, ad_attribution.TABLE)
                                                   .where(days.holds("click_date")),
                                                   F.col("click_date")),
                                    _rows_per_date(attributions, F.col("click_date")))
        _replace_range(spark, settings, ad_attribution.TABLE, attributions,
                       days.date_predicate("click_date"),
                       attribution_change, dry_run)
        changes.extend([stats_change, attribution_change,
                        _mark_repaired(spark, settings, days, started, dry_run)])

    try:
        retry_on_conflict(write, f"gold rebuild of {days}")
    finally:
        forget_computed()
    return changes


def _mark_repaired(spark: SparkSession, settings: Settings, days: DateRange,
                   rebuild_started: datetime, dry_run: bool) -> Change:
    """Ledger entries recorded before the rebuild read silver are covered by it; later
    ones are events it did not see, and stay open."""
    from delta.tables import DeltaTable

    open_entries = (F.col("repaired_at").isNull() & days.holds("event_date")
                    & (F.col("recorded_at") < F.lit(rebuild_started)))
    ledger = _read(spark, settings, late_data.TABLE)
    repaired = _rows_per_date(ledger.where(open_entries), F.col("event_date"))
    change = Change(late_data.TABLE.name, rows_after=repaired,
                    note=f"{sum(repaired.values())} ledger entries marked repaired")
    if repaired and not dry_run:
        (DeltaTable.forPath(spark, late_data.TABLE.path(settings))
            .update(open_entries, {"repaired_at": F.current_timestamp()}))
        change.written = True
    return change


def unrepaired_late_dates(settings: Settings) -> list[date]:
    """The event dates the late-data ledger lists as not repaired yet (read without Spark)."""
    rows = delta_reader.read_rows(late_data.TABLE.path(settings), ["event_date", "repaired_at"])
    return sorted({row["event_date"] for row in rows if row["repaired_at"] is None})


def parse_layers(text: str | None) -> list[str]:
    return parse_choices(text, LAYERS, "layer(s)")


def render(changes: list[Change], dry_run: bool) -> str:
    lines = ["DRY RUN: nothing written" if dry_run else "reprocessed"]
    for change in changes:
        lines.append(f"{change.table}: {change.note}")
        for day in sorted(change.rows_before.keys() | change.rows_after.keys()):
            before, after = change.rows_before.get(day, 0), change.rows_after.get(day, 0)
            if change.rows_before or before != after:
                lines.append(f"  {day}  {before:>8} -> {after:>8} rows")
            else:
                lines.append(f"  {day}  {after:>8} rows")
    return "\n".join(lines)
