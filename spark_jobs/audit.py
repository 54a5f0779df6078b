"""The accounting of contract section 5: every bronze row is in exactly one place.

Each silver and quarantine row names the bronze delivery it came from (``bronze_id``).
A bronze row in neither is a duplicate only if validating it again gives a valid event
whose ``event_id`` silver holds; anything else is unaccounted for, and the identity
``delivered == silver + quarantine + duplicates`` fails.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from spark_jobs import delta_reader
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.config import Settings
from spark_jobs.expected_counts import ExpectedCounts
from spark_jobs.ops import late_data, stream_progress
from spark_jobs.silver import ad_events as silver
from spark_jobs.silver import quarantine
from spark_jobs.silver.validation import Rules, validate
from spark_jobs.tables import TableSpec, local_rows
from spark_jobs.tables import read as read_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

EVENT_SOURCES = ("file", "kafka")


@dataclass
class Accounting:
    delivered: int
    silver_rows: int
    silver_distinct_event_ids: int
    quarantine_rows: int
    quarantine_by_reason: dict[str, int]
    duplicates: int
    unaccounted: int  # bronze rows in no place
    accounted_twice: int  # bronze rows in two places (or twice in one)
    in_flight: dict[str, object] = field(default_factory=dict)
    late_data: list[dict[str, object]] = field(default_factory=list)  # per layer and date
    streams: list[dict[str, object]] = field(default_factory=list)
    expected: dict[str, object] | None = None

    @property
    def identity_holds(self) -> bool:
        return (self.delivered == self.silver_rows + self.quarantine_rows + self.duplicates
                and self.unaccounted == 0 and self.accounted_twice == 0
                and self.silver_rows == self.silver_distinct_event_ids)

    @property
    def matches_expected(self) -> bool:
        return self.expected is None or bool(self.expected["matches"])

    def as_json(self) -> dict[str, object]:
        return {**asdict(self), "identity_holds": self.identity_holds}


def _table(spark: SparkSession, settings: Settings, spec: TableSpec) -> DataFrame:
    if not delta_reader.is_delta_table(spec.path(settings)):
        return local_rows(spark, [], spec.schema)
    return read_table(spark, settings, spec)


def account(spark: SparkSession, settings: Settings, expected_file: Path | None = None
            ) -> Accounting:
    bronze_rows = _table(spark, settings, bronze.TABLE).persist()
    silver_rows = _table(spark, settings, silver.TABLE).select("bronze_id", "event_id").persist()
    quarantined = (_table(spark, settings, quarantine.TABLE)
                   .where(F.col("source").isin(*EVENT_SOURCES))
                   .select("bronze_id", "reason").persist())
    try:
        placed = silver_rows.select("bronze_id").unionByName(quarantined.select("bronze_id"))
        accounted_twice = placed.groupBy("bronze_id").count().where("count > 1").count()
        rest = (bronze_rows.join(placed.distinct(), "bronze_id", "left_anti"))
        revalidated = validate(rest, Rules.from_settings(settings))
        duplicates = (revalidated.where(F.col("reason").isNull())
                      .join(silver_rows.select("event_id").distinct(), "event_id", "left_semi")
                      .count())
        by_reason = {row.reason: row["count"] for row in
                     quarantined.groupBy("reason").count().orderBy("reason").collect()}
        accounting = Accounting(
            delivered=bronze_rows.count(),
            silver_rows=silver_rows.count(),
            silver_distinct_event_ids=silver_rows.select("event_id").distinct().count(),
            quarantine_rows=sum(by_reason.values()),
            quarantine_by_reason=by_reason,
            duplicates=duplicates,
            unaccounted=rest.count() - duplicates,
            accounted_twice=accounted_twice,
        )
    finally:
        for frame in (bronze_rows, silver_rows, quarantined):
            frame.unpersist()
    accounting.late_data = late_by_date(spark, settings)
    accounting.streams = [_printable(row) for row in
                          stream_progress.latest_per_stream(spark, settings)]
    accounting.in_flight = _in_flight(settings, accounting.streams)
    if expected_file is not None:
        accounting.expected = compare_with_expected(accounting, expected_file)
    return accounting


def _in_flight(settings: Settings, streams: list[dict[str, object]]) -> dict[str, object]:
    """Whether silver's stream had read all of bronze, by its last batch's progress."""
    path = bronze.TABLE.path(settings)
    if not delta_reader.is_delta_table(path):
        return {}
    latest = delta_reader.latest_version(path)
    read_up_to = next((row.get("source_read_before") for row in streams
                       if row["query_name"] == silver.QUERY_NAME), None)
    return {"bronze_latest_version": latest,
            "silver_read_bronze_before_version": read_up_to,
            "silver_caught_up": read_up_to is not None and read_up_to > latest}


def late_by_date(spark: SparkSession, settings: Settings) -> list[dict[str, object]]:
    """The ledger per layer and event date: what streaming could not include."""
    ledger = _table(spark, settings, late_data.TABLE)
    rows = (ledger.groupBy("layer", "event_date")
            .agg(F.sum("late_rows").alias("late_rows"),
                 F.count_if(F.col("repaired_at").isNull()).alias("unrepaired_entries"))
            .orderBy("layer", "event_date").collect())
    return [{"layer": row.layer, "event_date": row.event_date.isoformat(),
             "late_rows": row.late_rows, "repaired": row.unrepaired_entries == 0}
            for row in rows]


def compare_with_expected(accounting: Accounting, expected_file: Path) -> dict[str, object]:
    expected = ExpectedCounts.load(expected_file)
    pairs = {
        "delivered": (expected.delivered, accounting.delivered),
        "silver_rows": (expected.valid_distinct, accounting.silver_rows),
        "quarantine_rows": (expected.invalid, accounting.quarantine_rows),
        "duplicates": (expected.duplicates, accounting.duplicates),
        "quarantine_by_reason": (dict(sorted(expected.invalid_by_reason.items())),
                                 accounting.quarantine_by_reason),
    }
    mismatches = {name: {"expected": want, "actual": got}
                  for name, (want, got) in pairs.items() if want != got}
    return {"file": str(expected_file), "matches": not mismatches, "mismatches": mismatches}


def _printable(row: dict[str, object]) -> dict[str, object]:
    return {key: (value.isoformat() if hasattr(value, "isoformat") else value)
            for key, value in row.items()}


def render(accounting: Accounting) -> str:
    lines = [
        f"delivered (bronze)        {accounting.delivered:>10}",
        f"silver rows               {accounting.silver_rows:>10}",
        f"quarantine rows           {accounting.quarantine_rows:>10}",
        *[f"  {reason:<24}{count:>10}" for reason, count in
          accounting.quarantine_by_reason.items()],
        f"duplicates                {accounting.duplicates:>10}",
        f"unaccounted               {accounting.unaccounted:>10}",
        f"accounted twice           {accounting.accounted_twice:>10}",
        f"silver distinct event ids {accounting.silver_distinct_event_ids:>10}",
        "identity bronze == silver + quarantine + duplicates: "
        + ("holds" if accounting.identity_holds else "DOES NOT HOLD"),
    ]
    flight = accounting.in_flight
    if flight and not flight.get("silver_caught_up"):
        lines.append(f"in flight: silver has read bronze before version "
                     f"{flight['silver_read_bronze_before_version']}, bronze is at "
                     f"{flight['bronze_latest_version']}: run the audit again once it caught up")
    for late in accounting.late_data:
        lines.append(f"late data: {late['late_rows']} rows of {late['event_date']} reached "
                     f"{late['layer']} after its watermark"
                     + (" (repaired)" if late["repaired"] else " (not repaired yet)"))
    for stream in accounting.streams:
        lines.append(f"stream {stream['query_name']}: last batch {stream['batch_id']} at "
                     f"{stream['batch_at']}, {stream['num_input_rows']} rows in "
                     f"{stream['batch_duration_ms']} ms")
    if accounting.expected is not None:
        verdict = "match" if accounting.expected["matches"] else "DO NOT MATCH"
        lines.append(f"generator's expected counts ({accounting.expected['file']}): {verdict}")
        for name, pair in accounting.expected["mismatches"].items():  # type: ignore[union-attr]
            lines.append(f"  {name}: expected {pair['expected']}, actual {pair['actual']}")
    return "\n".join(lines)
