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

``run`` carries out a :class:`Request` (what ``lakehouse reprocess`` is asked); each gold
table rebuilds itself (its module's ``rebuild``), and this module runs them side by side
from one snapshot of silver, then repairs the late-data ledger.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from types import ModuleType
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.util import inheritable_thread_target

from spark_jobs import checkpoints, delta_reader, registry
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.config import Settings, parse_choices
from spark_jobs.dates import DateRange
from spark_jobs.delta_writes import fully_read_before, retry_on_conflict
from spark_jobs.gold import writer as gold_writer
from spark_jobs.ops import gold_rebuilds, late_data
from spark_jobs.progress import SILENT, Steps
from spark_jobs.range_rebuild import Change, read_current, replace_range, rows_per_date
from spark_jobs.silver import ad_events as silver
from spark_jobs.silver import quarantine
from spark_jobs.silver.validation import Rules, validate
from spark_jobs.tables import TableSpec, ensure_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)



class ReprocessError(ValueError):
    """A request that cannot be carried out; the message is meant for the user."""


@dataclass(frozen=True)
class Request:
    """What one reprocess is asked to do (``lakehouse reprocess``'s arguments, checked)."""

    layers: tuple[str, ...] = registry.REPROCESSED_LAYERS
    days: DateRange | None = None  # the event dates to rebuild, when a range is asked
    quarantine: bool = False  # instead: replay quarantine, then gold over what it moved
    reason: str | None = None  # with ``quarantine``: only the records held for this reason
    late: bool = False  # then rebuild gold for the dates the late-data ledger lists
    dry_run: bool = False


@dataclass
class Result:
    """What a reprocess did (or, in a dry run, would do), and notes for the user."""

    dry_run: bool
    changes: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        """The changes as JSON-ready values (the notes are not results)."""
        return {"dry_run": self.dry_run,
                "changes": [change.as_json() for change in self.changes]}

    def render(self) -> str:
        """The changes as text, a table then its dates' row counts."""
        lines = ["DRY RUN: nothing written" if self.dry_run else "reprocessed"]
        for change in self.changes:
            lines.append(f"{change.table}: {change.note}")
            for day in sorted(change.rows_before.keys() | change.rows_after.keys()):
                before, after = change.rows_before.get(day, 0), change.rows_after.get(day, 0)
                if change.rows_before or before != after:
                    lines.append(f"  {day}  {before:>8} -> {after:>8} rows")
                else:
                    lines.append(f"  {day}  {after:>8} rows")
        return "\n".join(lines)


def run(spark: Callable[[], SparkSession], settings: Settings, request: Request,
        steps: Steps = SILENT) -> Result:
    """Carry out ``request``: its range rebuilt, or quarantine replayed, then the ledger's
    dates; ``spark`` starts this process's session when first called."""
    # A layer under reset is emptied and replayed: a rebuild beside it would place records
    # the replay places too.
    checkpoints.refuse_if_reset_unfinished(settings, registry.REPROCESSED_LAYERS)
    rules = Rules.from_settings(settings)
    result = Result(request.dry_run)
    if request.days is not None:
        result.changes += _rebuild_range(spark, settings, request.days, request, rules, steps)
    elif request.quarantine:
        result.changes += _replay_then_gold(spark, settings, request, rules, steps)
    if request.late:  # after the range: a date it rebuilt in gold is repaired already
        result.changes += _rebuild_late_dates(spark, settings, request, steps, result.notes)
    return result


def _rebuild_range(spark: Callable[[], SparkSession], settings: Settings, days: DateRange,
                   request: Request, rules: Rules, steps: Steps) -> list[Change]:
    """``days`` rebuilt in each layer the request names, silver first."""
    changes: list[Change] = []
    if "silver" in request.layers:
        steps.start(f"silver rebuild of {days}")
        changes += rebuild_silver(spark(), settings, days, rules, request.dry_run)
    if "gold" in request.layers:
        steps.start(f"gold rebuild of {days}")
        changes += gold_writer.rebuild(spark, settings, days, request.dry_run)
    return changes


def _replay_then_gold(spark: Callable[[], SparkSession], settings: Settings,
                      request: Request, rules: Rules, steps: Steps) -> list[Change]:
    """Quarantine replayed; then, when it wrote, gold rebuilt over the dates it moved
    records into."""
    steps.start("quarantine replay")
    [replay] = replay_quarantine(spark(), settings, rules, request.reason, request.dry_run)
    recovered = _spanned(replay.rows_after)  # the records that now pass, per event date
    if "gold" not in request.layers or recovered is None or request.dry_run:
        return [replay]
    return [replay, *gold_writer.rebuild(spark, settings, recovered, False)]


def _spanned(days: Iterable[str]) -> DateRange | None:
    """The range from the earliest to the latest of ISO ``days``; None when there is none."""
    ordered = sorted(days)
    if not ordered:
        return None
    return DateRange(date.fromisoformat(ordered[0]), date.fromisoformat(ordered[-1]))


def _rebuild_late_dates(spark: Callable[[], SparkSession], settings: Settings,
                        request: Request, steps: Steps, notes: list[str]) -> list[Change]:
    """Gold rebuilt, a date at a time, for each date the late-data ledger lists as not
    repaired, but those the request's range rebuilt in gold."""
    days = request.days
    late_dates = [day for day in late_data.unrepaired_dates(settings)
                  if days is None or "gold" not in request.layers
                  or not days.first <= day <= days.last]  # (a dry run's range)
    if late_dates:
        steps.start("gold rebuild of late dates", len(late_dates))
    else:
        notes.append("the late-data ledger has no other unrepaired dates")
    changes: list[Change] = []
    for day in late_dates:
        steps.advance(0, str(day))
        changes += gold_writer.rebuild(spark, settings, DateRange(day, day), request.dry_run)
        steps.advance()
    return changes


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

    with bronze.even_reads(spark):
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
    held = (read_current(spark, settings, silver.TABLE).where(days.holds("event_date"))
            .agg(F.min(F.to_date("ingested_at")).alias("earliest")).first().earliest)
    return by_rules if held is None else min(by_rules, held)


def _rebuild_silver_from(spark: SparkSession, settings: Settings, days: DateRange,
                         bronze_rows: DataFrame, validated: DataFrame, dry_run: bool
                         ) -> list[Change]:
    current = read_current(spark, settings, silver.TABLE).where(days.holds("event_date"))
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
        silver_change = Change(silver.TABLE.name, rows_per_date(current, F.col("event_date")),
                               rows_per_date(events, F.col("event_date")))
        one_version = _version(spark, settings, silver.TABLE) == counted_at

        quarantined = read_current(spark, settings, quarantine.TABLE).select("bronze_id")
        passing_now = validated.where(F.col("reason").isNull()).select("bronze_id").join(
            quarantined, "bronze_id")
        failing_now = quarantine.rejected(validated).join(quarantined, "bronze_id", "left_anti")
        released, newly_rejected = passing_now.count(), failing_now.count()
        quarantine_change = Change(quarantine.TABLE.name,
                                   note=f"{released} records now pass and leave quarantine, "
                                        f"{newly_rejected} now fail and enter it")

        replace_range(spark, settings, silver.TABLE, events,
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
    held = read_current(spark, settings, quarantine.TABLE)
    if reason:
        held = held.where(F.col("reason") == reason)
    revalidated = validate(held.select(*bronze.SCHEMA.fieldNames()), rules).persist()
    try:
        passing = silver.accepted(revalidated)
        by_reason = {row.reason: row.n for row in
                     held.join(passing.select("bronze_id"), "bronze_id")
                     .groupBy("reason").agg(F.count("*").alias("n")).collect()}
        change = Change(quarantine.TABLE.name,
                        rows_after=rows_per_date(passing, F.col("event_date")),
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
    """Every gold table's rows of ``days`` recomputed from one snapshot of silver (each
    table's module's ``rebuild``); the late-data ledger's entries for those dates marked
    repaired."""
    # Before silver is read: a ledger entry recorded earlier is of an event the snapshot
    # holds, which the rebuild counts.
    started = datetime.now(UTC).replace(tzinfo=None)
    events, version = _read_pinned(spark, settings, silver.TABLE)
    recorded = False
    recording = threading.Lock()

    def record_rebuild() -> None:
        nonlocal recorded
        with recording:  # the tables' replaces wait for it, whichever comes first
            if not recorded:
                ensure_table(spark, settings, gold_rebuilds.TABLE)  # not in a dry run
                gold_rebuilds.record(spark, settings, days.days, version)
                recorded = True

    # A retry per table's commit, each from the snapshot pinned above, so that every commit
    # stands for silver at ``version`` however often one was retried. The record of the
    # rebuild is written once, just before the first table's replace, inside its retry: a
    # gold batch drops the events a rebuilt date held at the recorded version, so the record
    # must name the version gold was counted from, and precede every replace. The gold
    # batches wait for the whole rebuild, not for each commit (``gold.writer``).
    what = f"gold rebuild of {days}"

    def rebuilt(table: ModuleType) -> Change:
        return retry_on_conflict(lambda: table.rebuild(spark, settings, events, days, dry_run,
                                                       record_rebuild),
                                 f"{what}: {table.TABLE.name}")

    # The tables side by side: each is a few Spark jobs with driver work between them
    # (planning, Delta's commit) and stages of a task or two, which the others' tasks fill.
    tables = _gold_tables()
    with ThreadPoolExecutor(len(tables), thread_name_prefix="gold-rebuild") as pool:
        # Each thread carries the session's local properties and tags (what cancels its jobs).
        in_session = inheritable_thread_target(spark)
        futures = [pool.submit(in_session(rebuilt), table) for table in tables]
        changes = [future.result() for future in futures]
    return [*changes,
            retry_on_conflict(lambda: late_data.repair(spark, settings, days, started, dry_run),
                              f"{what}: {late_data.TABLE.name}")]


def _gold_tables() -> list[ModuleType]:
    """The gold tables' modules, in the registry's order."""
    return [importlib.import_module(table.module)
            for table in registry.streams() if table.layer == "gold"]


def parse_layers(text: str | None) -> list[str]:
    """The layers named in ``text`` (comma-separated; all when empty)."""
    return parse_choices(text, registry.REPROCESSED_LAYERS, "layer(s)")
