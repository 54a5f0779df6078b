"""Reprocessing: a parser fix recovers quarantined records, a rebuild repairs late windows,
and a second run changes nothing."""

import hashlib
import json
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from spark_jobs import reasons, streaming
from spark_jobs.audit import account
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.dates import DateRange, DateRangeError
from spark_jobs.gold import ad_attribution, campaign_stats, user_sessions
from spark_jobs.ops import gold_rebuilds, late_data
from spark_jobs.range_rebuild import content_digest
from spark_jobs.reprocess import (
    rebuild_gold,
    rebuild_silver,
    replay_quarantine,
)
from spark_jobs.silver import ad_events as silver
from spark_jobs.silver import quarantine
from spark_jobs.silver.validation import Rules
from spark_jobs.storage import write_atomically
from spark_jobs.tables import ensure_table
from tests.conftest import make_settings
from tests.processes import run_lakehouse

RULES = Rules(future_tolerance_seconds=86400, derive_missing_event_id=False)
FIXED_RULES = Rules(86400, False, extra_time_formats=("yyyy-MM-dd HH:mm:ss",))
DAY_1, DAY_2, DAY_3 = date(2026, 11, 20), date(2026, 11, 21), date(2026, 11, 22)


def event(event_id: str, when: datetime, kind: str, ad: str, price: str | None = None,
          user: str = "u-1") -> dict:
    record = {"event_id": event_id, "event_time": when.isoformat() + "Z", "event_type": kind,
              "ad_id": ad, "user_id": user}
    if price is not None:
        record["price"] = price
    return record


def at(day: date, hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(day.year, day.month, day.day, hour, minute, second)


# Three landing files, streamed one per micro-batch, so the watermark moves between them.
FIRST = [
    event("v1", at(DAY_1, 9, 0, 5), "view", "ad-1"),
    event("c1", at(DAY_1, 9, 0, 40), "click", "ad-1"),
    event("p1", at(DAY_1, 9, 1), "purchase", "ad-2", "12.50"),
    event("v2", at(DAY_2, 23, 59, 59), "view", "ad-2", user="u-2"),
    event("v1", at(DAY_1, 9, 0, 5), "view", "ad-1"),  # a producer retry: a duplicate
]
# A producer that writes naive times: rejected until the parser learns the format.
NAIVE = {"event_id": "n1", "event_time": "2026-11-21 10:00:00", "event_type": "click",
         "ad_id": "ad-2", "user_id": "u-2"}
SECOND = [event("v3", at(DAY_3, 12, 0), "view", "ad-1")]  # the watermark moves to 11:50
THIRD = [event("late", at(DAY_2, 8, 30), "view", "ad-1")]  # its window closed long ago

VALID = [*FIRST[:4], *SECOND, *THIRD]
RECOVERED = event("n1", datetime(2026, 11, 21, 10, 0), "click", "ad-2", user="u-2")
CAMPAIGNS = {"ad-1": "c-1", "ad-2": "c-2"}


def expected_gold(records: list[dict]) -> dict:
    """An independent recomputation in plain Python: per campaign and minute."""
    totals: dict = {}
    for record in records:
        when = datetime.fromisoformat(record["event_time"].rstrip("Z")).replace(second=0)
        key = (CAMPAIGNS[record["ad_id"]], when)
        views, clicks, purchases, revenue = totals.get(key, (0, 0, 0, Decimal("0.00")))
        kind = record["event_type"]
        totals[key] = (views + (kind == "view"), clicks + (kind == "click"),
                       purchases + (kind == "purchase"),
                       revenue + Decimal(record.get("price", "0") if kind == "purchase" else 0))
    return totals


def gold_rows(spark, settings) -> dict:
    return {(r.campaign_id, r.window_start): (r.views, r.clicks, r.purchases, r.revenue)
            for r in table(spark, settings, campaign_stats.TABLE).collect()}


def table(spark, settings, spec):
    return spark.read.format("delta").load(spec.path(settings))


def checksum(spark, settings, spec) -> str:
    rows = sorted(json.dumps(row.asDict(), default=str, sort_keys=True)
                  for row in table(spark, settings, spec).collect())
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


TABLES = (silver.TABLE, quarantine.TABLE, campaign_stats.TABLE, ad_attribution.TABLE,
          user_sessions.TABLE, late_data.TABLE, gold_rebuilds.TABLE)


@pytest.fixture(scope="module")
def streamed(spark, tmp_path_factory):
    """The corpus streamed through every layer once, as the live pipeline would."""
    settings = make_settings(tmp_path_factory.mktemp("reprocess") / "lake",
                             max_files_per_trigger=1)
    campaigns = "".join(json.dumps({"ad_id": ad, "campaign_id": campaign,
                                    "valid_from": "2026-01-01T00:00:00Z"}) + "\n"
                        for ad, campaign in CAMPAIGNS.items())
    write_atomically(settings.landing_campaigns, "campaigns.jsonl", campaigns.encode())
    for name, records in (("1.jsonl", [*FIRST, NAIVE]), ("2.jsonl", SECOND),
                          ("3.jsonl", THIRD)):
        lines = [json.dumps(record) for record in records] + ["{not json"]
        write_atomically(settings.landing_events, name, "\n".join(lines).encode())
    streaming.run_available_now(spark, settings, list(streaming.LAYERS))
    return settings


def test_streaming_left_a_late_window_and_a_quarantined_naive_time(spark, streamed) -> None:
    ledger = table(spark, streamed, late_data.TABLE).collect()
    # "late" (08:30 on day 2) came after the watermark had reached 11:50 on day 3: late for
    # the windows and for the sessions alike.
    assert sorted((r.layer, r.event_date, r.late_rows, r.repaired_at) for r in ledger) == [
        ("gold.campaign_stats", DAY_2, 1, None), ("gold.user_sessions", DAY_2, 1, None)]
    reasons_held = Counter(r.reason for r in table(spark, streamed, quarantine.TABLE).collect())
    # One naive time, and one broken line in each of the three files.
    assert reasons_held == {reasons.BAD_EVENT_TIME: 1, reasons.MALFORMED_JSON: 3}
    assert gold_rows(spark, streamed) == expected_gold([*FIRST[:4], *SECOND])


def test_reprocess_recovers_repairs_and_is_idempotent(spark, streamed) -> None:
    settings = streamed
    everything = DateRange(DAY_1, DAY_3)

    # The parser fix: the naive time now parses, so the record leaves quarantine.
    replay_quarantine(spark, settings, FIXED_RULES, reasons.BAD_EVENT_TIME, dry_run=False)
    assert [r.event_id for r in table(spark, settings, silver.TABLE)
            .where("event_id = 'n1'").collect()] == ["n1"]
    assert table(spark, settings, quarantine.TABLE).where(
        F.col("reason") == reasons.BAD_EVENT_TIME).count() == 0
    assert account(spark, settings).identity_holds

    # A dry run says what would change and writes nothing.
    versions = {spec.name: len(list((settings.tables_dir / spec.relative_path / "_delta_log")
                                    .glob("*.json"))) for spec in TABLES[:5]}
    dry = rebuild_gold(spark, settings, everything, dry_run=True)
    assert [c.note for c in dry][:1] == ["would be replaced"]
    assert {spec.name: len(list((settings.tables_dir / spec.relative_path / "_delta_log")
                                .glob("*.json"))) for spec in TABLES[:5]} == versions

    rebuild_silver(spark, settings, everything, FIXED_RULES, dry_run=False)
    rebuild_gold(spark, settings, everything, dry_run=False)
    # Gold now holds every valid event, the late one and the recovered one included.
    assert gold_rows(spark, settings) == expected_gold([*VALID, RECOVERED])
    assert table(spark, settings, late_data.TABLE).where("repaired_at IS NULL").count() == 0
    # The recovered click (10:00 on day 2) has no view of ad-2 by u-2 in the hour before.
    assert {r.click_event_id: r.view_event_id
            for r in table(spark, settings, ad_attribution.TABLE).collect()} == {"c1": "v1"}
    assert account(spark, settings).identity_holds

    # A second identical run writes nothing: every table's content is the same.
    before = {spec.name: checksum(spark, settings, spec) for spec in TABLES}
    again = [*rebuild_silver(spark, settings, everything, FIXED_RULES, dry_run=False),
             *rebuild_gold(spark, settings, everything, dry_run=False)]
    assert not any(change.written for change in again)
    assert {spec.name: checksum(spark, settings, spec) for spec in TABLES} == before


def test_a_live_gold_stream_does_not_count_again_what_a_rebuild_counted(spark, streamed
                                                                         ) -> None:
    from delta.tables import DeltaTable

    settings = streamed
    silver_path = silver.TABLE.path(settings)
    version = DeltaTable.forPath(spark, silver_path).history(1).first().version
    gold_rebuilds.record(spark, settings, [DAY_1], version)  # as rebuild_gold does
    # A stream batch that is behind silver delivers v1 (the rebuild counted it) and a new
    # view on day 1 that the rebuild could not have seen.
    fresh = at(DAY_1, 9, 0, 50)
    batch = spark.createDataFrame(
        [("v1", at(DAY_1, 9, 0, 5), DAY_1, "view", "ad-1"), ("v9", fresh, DAY_1, "view", "ad-1")],
        "event_id string, event_time timestamp, event_date date, event_type string, "
        "ad_id string")
    kept = gold_rebuilds.not_yet_counted(spark, settings, silver_path, batch)
    assert [r.event_id for r in kept.collect()] == ["v9"]


def land_in_bronze(spark, settings, deliveries: list[tuple[str, dict, datetime]]) -> None:
    """(bronze_id, record, ingested_at) as bronze rows, each in its ingest date."""
    rows = [(bronze_id, json.dumps(record), "file", "f.jsonl", line, None, None, None,
             ingested_at, ingested_at.date())
            for line, (bronze_id, record, ingested_at) in enumerate(deliveries, start=1)]
    ensure_table(spark, settings, bronze.TABLE)
    (spark.createDataFrame(rows, bronze.SCHEMA).write.format("delta").mode("append")
     .save(bronze.TABLE.path(settings)))


def test_a_rebuild_leaves_bronze_the_silver_stream_has_not_judged_to_the_stream(spark, tmp_path
                                                                               ) -> None:
    """Found by the chaos battery: a rebuild beside a silver stream that was behind bronze
    quarantined the records the stream had yet to read, and the stream then quarantined them
    again (one delivery placed twice)."""
    settings = make_settings(tmp_path / "lake")

    def land(name: str, records: list[dict]) -> None:
        lines = [json.dumps(record) for record in records] + ["{not json"]
        write_atomically(settings.landing_events, name, "\n".join(lines).encode())

    land("1.jsonl", [event("a1", at(DAY_2, 9, 0), "view", "ad-1")])
    streaming.run_available_now(spark, settings, ["bronze", "silver"])
    # Bronze moves on; silver's stream has not read it yet when the rebuild runs.
    land("2.jsonl", [event("a2", at(DAY_2, 9, 5), "view", "ad-1")])
    streaming.run_available_now(spark, settings, ["bronze"])
    rebuild_silver(spark, settings, DateRange(DAY_2, DAY_2), RULES, dry_run=False)
    # The rebuild judged what the stream had: file 1's two records, not file 2's.
    assert [r.event_id for r in table(spark, settings, silver.TABLE).collect()] == ["a1"]
    assert table(spark, settings, quarantine.TABLE).count() == 1

    streaming.run_available_now(spark, settings, ["silver"])
    accounting = account(spark, settings)
    # Four deliveries, each placed once: two events in silver, two broken lines quarantined.
    assert (accounting.delivered, accounting.silver_rows, accounting.quarantine_rows) == (
        4, 2, 2)
    assert accounting.accounted_twice == 0 and accounting.identity_holds


def test_a_rebuild_does_not_read_bronze_ingested_before_its_days_could_arrive(spark, tmp_path
                                                                              ) -> None:
    settings = make_settings(tmp_path / "lake")
    land_in_bronze(spark, settings, [
        ("old", event("o1", at(DAY_1, 12, 0), "view", "ad-1"), datetime(2026, 11, 20, 12, 1,
                                                                         tzinfo=UTC)),
        ("new", event("d3", at(DAY_3, 12, 0), "view", "ad-1"), datetime(2026, 11, 22, 12, 1,
                                                                         tzinfo=UTC))])
    # A record of DAY_3 is at most the tolerance (a day) ahead of its ingestion, so bronze
    # ingested on DAY_1 cannot hold one: its files are not read (gone, they would fail it).
    old_files = list(Path(bronze.TABLE.path(settings), f"ingest_date={DAY_1}").glob("*.parquet"))
    assert old_files
    for data_file in old_files:
        data_file.unlink()
    rebuild_silver(spark, settings, DateRange(DAY_3, DAY_3), RULES, dry_run=False)
    assert [r.event_id for r in table(spark, settings, silver.TABLE).collect()] == ["d3"]


def test_a_row_silver_holds_from_before_the_tolerance_is_judged_again(spark, tmp_path
                                                                      ) -> None:
    """Accepted under a four-day tolerance, ingested two days before its event: rebuilt
    under a one-day tolerance it fails and moves to quarantine. Its bronze record lies
    before what the new tolerance alone would read, and silver's own row bounds the read."""
    settings = make_settings(tmp_path / "lake")
    land_in_bronze(spark, settings, [
        ("early", event("e1", at(DAY_3, 12, 0), "view", "ad-1"),
         datetime(2026, 11, 20, 12, 0, tzinfo=UTC))])
    days = DateRange(DAY_3, DAY_3)
    rebuild_silver(spark, settings, days, Rules(4 * 86400, False), dry_run=False)
    assert [r.event_id for r in table(spark, settings, silver.TABLE).collect()] == ["e1"]
    rebuild_silver(spark, settings, days, RULES, dry_run=False)
    assert table(spark, settings, silver.TABLE).count() == 0
    assert [(r.bronze_id, r.reason) for r in table(spark, settings, quarantine.TABLE).collect()
            ] == [("early", reasons.FUTURE_EVENT_TIME)]


def test_date_ranges_are_checked() -> None:
    assert DateRange.parse("2026-11-20", "2026-11-20").days == [DAY_1]
    with pytest.raises(DateRangeError, match="after"):
        DateRange.parse("2026-11-21", "2026-11-20")
    with pytest.raises(DateRangeError, match="not a date"):
        DateRange.parse("2026-13-01", "2026-11-20")


def test_cli_refuses_bad_ranges_and_a_range_without_data_is_a_clean_no_op(tmp_path) -> None:
    root = str(tmp_path / "lake")
    backwards = run_lakehouse("reprocess", "--root", root, "--from", "2026-11-22",
                              "--to", "2026-11-01")
    assert backwards.returncode == 2
    assert "--from 2026-11-22 is after --to 2026-11-01" in backwards.stderr
    garbled = run_lakehouse("reprocess", "--root", root, "--from", "22/11/2026",
                            "--to", "2026-11-23")
    assert garbled.returncode == 2 and "is not a date" in garbled.stderr
    empty = run_lakehouse("reprocess", "--root", root, "--from", "2026-11-01",
                          "--to", "2026-11-02", "--json")
    assert empty.returncode == 0, empty.stderr
    assert not any(change["written"] for change in json.loads(empty.stdout)["changes"])


def test_a_window_that_changed_is_replaced_though_every_date_keeps_its_row_count(
        spark, tmp_path) -> None:
    """A rebuild skips its exact comparison when a date's row count changed; with equal
    counts it must still compare values: a second view in a window gold already holds
    changes that window's views, not the number of windows."""
    settings = make_settings(tmp_path / "lake")
    days = DateRange(DAY_2, DAY_2)
    ingested = datetime.combine(DAY_2, datetime.min.time(), tzinfo=UTC).replace(hour=10)
    land_in_bronze(spark, settings, [("b1", event("v1", at(DAY_2, 9, 0, 5), "view", "ad-1"),
                                      ingested)])
    rebuild_silver(spark, settings, days, RULES, dry_run=False)
    rebuild_gold(spark, settings, days, dry_run=False)
    land_in_bronze(spark, settings, [("b2", event("v2", at(DAY_2, 9, 0, 30), "view", "ad-1"),
                                      ingested)])
    [silver_change, _] = rebuild_silver(spark, settings, days, RULES, dry_run=False)
    assert silver_change.rows_after == {str(DAY_2): 2} and silver_change.written
    stats_change = rebuild_gold(spark, settings, days, dry_run=False)[0]
    # v1 and v2 share one window (the same minute): one row on DAY_2 before and after.
    assert stats_change.rows_before == stats_change.rows_after == {str(DAY_2): 1}
    assert stats_change.written
    assert [r.views for r in table(spark, settings, campaign_stats.TABLE).collect()] == [2]


def test_the_content_digest_tells_rows_apart_but_not_their_order(spark) -> None:
    schema = StructType([StructField("a", StringType()), StructField("n", LongType())])

    def digest(rows: list[tuple]) -> tuple:
        return content_digest(spark.createDataFrame(rows, schema), schema)

    rows = [("x", 1), ("y", 2), (None, 3)]
    assert digest(rows) == digest(list(reversed(rows)))  # order does not matter
    assert digest(rows) != digest([("x", 1), ("y", 2), (None, 4)])  # one value
    # Duplicates count: {x, x, y} is not {x, y, y}, though both hold x and y.
    assert digest([("x", 1), ("x", 1), ("y", 2)]) != digest([("x", 1), ("y", 2), ("y", 2)])
    # Where a NULL sits matters, though the other values are the same.
    wide = StructType([StructField("p", LongType()), StructField("q", LongType())])
    assert (content_digest(spark.createDataFrame([(None, 1)], wide), wide)
            != content_digest(spark.createDataFrame([(1, None)], wide), wide))
    # Values are read as the table's types: a count computed as a decimal is the same row.
    as_decimal = spark.createDataFrame([("x", Decimal(1))], "a string, n decimal(20,0)")
    assert content_digest(as_decimal, schema) == digest([("x", 1)])
    assert digest([]) == (0, None, None)


def test_a_replayed_delivery_earlier_than_silver_s_row_becomes_the_event_s_row(
        spark, tmp_path) -> None:
    """Silver keeps each event's first delivery. The first copy of n1 is held in quarantine
    (a naive time), a later good copy enters silver; once the parser learns the format, the
    replay makes the first copy the row, as a rebuild would: both runners agree."""
    settings = make_settings(tmp_path / "lake")
    first_seen = datetime(2026, 11, 21, 10, 1, tzinfo=UTC)
    land_in_bronze(spark, settings, [("first", NAIVE, first_seen),
                                     ("retry", RECOVERED, first_seen + timedelta(minutes=5))])
    for spec in (silver.TABLE, quarantine.TABLE):
        ensure_table(spark, settings, spec)
    # The stream's own batch function over both deliveries.
    silver.process(spark, table(spark, settings, bronze.TABLE), "test", 0, settings=settings)
    assert [r.bronze_id for r in table(spark, settings, silver.TABLE).collect()] == ["retry"]
    assert [r.bronze_id for r in table(spark, settings, quarantine.TABLE).collect()] == ["first"]

    replay_quarantine(spark, settings, FIXED_RULES, reasons.BAD_EVENT_TIME, dry_run=False)
    [row] = table(spark, settings, silver.TABLE).collect()
    assert (row.event_id, row.bronze_id, row.ingested_at) == ("n1", "first",
                                                              first_seen.replace(tzinfo=None))
    assert table(spark, settings, quarantine.TABLE).count() == 0
    assert account(spark, settings).identity_holds  # "retry" is now the duplicate
    # The batch runner finds nothing to change in silver.
    [silver_change, _] = rebuild_silver(spark, settings, DateRange(DAY_2, DAY_2), FIXED_RULES,
                                        dry_run=False)
    assert silver_change.note == "unchanged", silver_change

    # A naive copy delivered after the row's: released by a second replay, it stays a
    # duplicate (an adoption that ignored delivery order would make it the row).
    land_in_bronze(spark, settings, [("again", NAIVE, first_seen + timedelta(minutes=20))])
    silver.process(spark, table(spark, settings, bronze.TABLE).where("bronze_id = 'again'"),
                   "test", 1, settings=settings)
    replay_quarantine(spark, settings, FIXED_RULES, reasons.BAD_EVENT_TIME, dry_run=False)
    assert [r.bronze_id for r in table(spark, settings, silver.TABLE).collect()] == ["first"]
    assert table(spark, settings, quarantine.TABLE).count() == 0
    # The audit judges what is left over with the configured rules: the fix configured.
    fixed = make_settings(settings.root,
                          extra_event_time_formats=list(FIXED_RULES.extra_time_formats))
    assert account(spark, fixed).identity_holds
