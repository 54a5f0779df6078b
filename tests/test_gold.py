"""Gold on inline events: window edges, zones, campaign moves, watermarks, attribution."""

import json
from datetime import UTC, datetime
from decimal import Decimal
from itertools import pairwise
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from spark_jobs import delta_reader, delta_writes
from spark_jobs.audit import late_by_date
from spark_jobs.delta_writes import idempotent_dml, time_bounds
from spark_jobs.gold import ad_attribution, campaign_stats, watermark
from spark_jobs.ops import late_data
from spark_jobs.silver import ad_campaigns
from spark_jobs.tables import ensure_table

QUERY = "test-gold-query"


def events(spark, rows: list[tuple]):
    """(event_id, event_time, event_type, ad_id[, user_id[, price]]) as silver rows."""
    full = [(r[0], r[1], r[1].date(), r[2], r[3], r[4] if len(r) > 4 else "u-1",
             Decimal(r[5]) if len(r) > 5 else None) for r in rows]
    return spark.createDataFrame(
        full, "event_id string, event_time timestamp, event_date date, event_type string, "
              "ad_id string, user_id string, price decimal(12,2)")


def mapping(spark, rows: list[tuple[str, str, datetime]]):
    frame = spark.createDataFrame(
        [(ad, campaign, start, "f", start) for ad, campaign, start in rows],
        "ad_id string, campaign_id string, valid_from timestamp, source_file string, "
        "ingested_at timestamp")
    return ad_campaigns.versions(frame)


EPOCH = datetime(2026, 1, 1)


def at(minute: int, second: int = 0, hour: int = 12) -> datetime:
    return datetime(2026, 11, 22, hour, minute, second)


def stats(spark, rows, mapping_rows=(("ad-1", "c-1", EPOCH),), window="1 minute") -> dict:
    result = campaign_stats.campaign_stats(events(spark, rows), mapping(spark, list(mapping_rows)),
                                           window).collect()
    return {(r.campaign_id, r.window_start.strftime("%d %H:%M:%S")):
            (r.views, r.clicks, r.purchases, r.revenue) for r in result}


def test_window_edges(spark) -> None:
    result = stats(spark, [
        ("a", datetime(2026, 11, 22, 10, 0, 59, 999000), "view", "ad-1"),  # last ms of 10:00
        ("b", datetime(2026, 11, 22, 10, 1, 0), "view", "ad-1"),  # first instant of 10:01
        ("c", datetime(2026, 11, 22, 23, 59, 59, 999000), "click", "ad-1"),  # before midnight
        ("d", datetime(2026, 11, 23, 0, 0, 0), "purchase", "ad-1", "u", "9.99"),  # after
    ])
    assert result == {
        ("c-1", "22 10:00:00"): (1, 0, 0, Decimal("0.00")),
        ("c-1", "22 10:01:00"): (1, 0, 0, Decimal("0.00")),
        ("c-1", "22 23:59:00"): (0, 1, 0, Decimal("0.00")),
        ("c-1", "23 00:00:00"): (0, 0, 1, Decimal("9.99")),
    }


def test_ten_second_windows_are_one_setting_away(spark) -> None:
    result = stats(spark, [("a", datetime(2026, 11, 22, 10, 0, 9), "view", "ad-1"),
                           ("b", datetime(2026, 11, 22, 10, 0, 10), "view", "ad-1")],
                   window="10 seconds")
    assert set(result) == {("c-1", "22 10:00:00"), ("c-1", "22 10:00:10")}


def test_campaign_moved_mid_window_splits_the_window_and_unmapped_is_unknown(spark) -> None:
    move = datetime(2026, 11, 22, 10, 0, 30)
    result = stats(spark, [
        ("before", datetime(2026, 11, 22, 10, 0, 29), "view", "ad-1"),
        ("at-move", move, "view", "ad-1"),
        ("after", datetime(2026, 11, 22, 10, 0, 45), "click", "ad-1"),
        ("orphan", datetime(2026, 11, 22, 10, 0, 45), "view", "ad-without-mapping"),
    ], mapping_rows=[("ad-1", "c-1", EPOCH), ("ad-1", "c-2", move)])
    zero = Decimal("0.00")
    assert result == {("c-1", "22 10:00:00"): (1, 0, 0, zero),
                      ("c-2", "22 10:00:00"): (1, 1, 0, zero),
                      ("unknown", "22 10:00:00"): (1, 0, 0, zero)}


def stream_batches(spark, settings, batches: list[list[tuple]]) -> None:
    for table in (campaign_stats.TABLE, late_data.TABLE, ad_campaigns.TABLE):
        ensure_table(spark, settings, table)
    mapping(spark, [("ad-1", "c-1", EPOCH)]).write.format("delta").mode("overwrite").save(
        ad_campaigns.TABLE.path(settings))
    for batch_id, rows in enumerate(batches):
        campaign_stats.process(spark, events(spark, rows), QUERY, batch_id, settings=settings)


def table(spark, settings, spec):
    return spark.read.format("delta").load(spec.path(settings))


def test_late_within_the_watermark_updates_its_window_beyond_it_goes_to_the_ledger(
        spark, settings) -> None:
    stream_batches(spark, settings, [
        [("a", at(0), "view", "ad-1")],
        [("b", at(30), "view", "ad-1")],  # max event time 12:30: watermark 12:20 from now on
        [("inside", at(21), "click", "ad-1"),  # window 12:21-12:22 still open
         ("beyond", at(19, 59), "view", "ad-1")],  # window 12:19-12:20 closed at 12:20
    ])
    rows = {r.window_start.strftime("%H:%M"): (r.views, r.clicks)
            for r in table(spark, settings, campaign_stats.TABLE).collect()}
    assert rows == {"12:00": (1, 0), "12:30": (1, 0), "12:21": (0, 1)}
    ledger = table(spark, settings, late_data.TABLE).collect()
    assert [(r.layer, r.window_start.strftime("%H:%M"), r.late_rows, r.event_date.isoformat())
            for r in ledger] == [("gold.campaign_stats", "12:19", 1, "2026-11-22")]
    assert ledger[0].watermark == at(20)
    # The audit shows it per layer and date.
    assert late_by_date(spark, settings) == [{"layer": "gold.campaign_stats",
                                              "event_date": "2026-11-22", "late_rows": 1,
                                              "repaired": False}]


def test_the_late_data_split_is_pure_and_beside_its_table(spark) -> None:
    # Watermark 12:20. A window that ended by then is closed: 12:19-12:20 (its end is the
    # watermark) and 12:05-12:06; 12:20-12:21 is open. Two late events of one window are one
    # ledger row of 2; before the first watermark nothing is late.
    batch = events(spark, [("on-time", at(20), "view", "ad-1"),
                           ("late-1", at(19, 59), "view", "ad-1"),
                           ("late-2", at(19, 1), "click", "ad-1"),
                           ("late-3", at(5), "view", "ad-1")]
                   ).withColumn("_window", campaign_stats.event_window("1 minute"))
    applied = int(at(20).replace(tzinfo=UTC).timestamp() * 1_000_000)
    late = watermark.closed(F.col("_window.end"), applied)
    assert [row.event_id for row in batch.where(~late).collect()] == ["on-time"]
    late_events = batch.where(late).withColumn("window_start", F.col("_window.start"))
    planned = at(21).replace(tzinfo=UTC)  # the batch's time, given: the same in a replay
    ledger = late_data.entries(late_events, "gold.campaign_stats", applied, QUERY, 7,
                               planned).collect()
    assert sorted((r.window_start.strftime("%H:%M"), r.late_rows) for r in ledger) == [
        ("12:05", 1), ("12:19", 2)]
    assert {(r.layer, r.watermark, r.query_id, r.batch_id, r.recorded_at, r.repaired_at)
            for r in ledger} == {("gold.campaign_stats", at(20), QUERY, 7, at(21), None)}
    assert batch.where(watermark.closed(F.col("_window.end"), None)).count() == 0


def test_a_batch_with_nothing_late_adds_no_ledger_commit(spark, settings) -> None:
    stream_batches(spark, settings, [
        [("a", at(0), "view", "ad-1")],
        [("b", at(30), "view", "ad-1")],  # watermark 12:20 from now on
        [("c", at(31), "view", "ad-1")],  # on time: nothing late in batches 1 and 2
    ])
    # Only the table's creation: a commit per batch would cost each batch a Delta write.
    history = spark.sql(f"DESCRIBE HISTORY delta.`{late_data.TABLE.path(settings)}`")
    assert [r.operation for r in history.collect()] == ["CREATE TABLE"]


def test_late_inside_the_watermark_upserts_the_same_row(spark, settings) -> None:
    stream_batches(spark, settings, [
        [("a", at(5), "view", "ad-1")],
        [("b", at(12), "view", "ad-1")],  # watermark 12:02 from now on
        [("c", at(5, 40), "view", "ad-1")],  # late for 12:05, but inside: same row, 2 views
    ])
    rows = table(spark, settings, campaign_stats.TABLE).where(
        "window_start = '2026-11-22 12:05:00'").collect()
    assert [r.views for r in rows] == [2]


def test_a_replayed_gold_batch_changes_nothing(spark, settings) -> None:
    t = datetime(2026, 11, 22, 12, 0)
    stream_batches(spark, settings, [[("a", t, "view", "ad-1")]])
    campaign_stats.process(spark, events(spark, [("a", t, "view", "ad-1")]), QUERY, 0,
                           settings=settings)
    assert [r.views for r in table(spark, settings, campaign_stats.TABLE).collect()] == [1]


@pytest.fixture(scope="module")
def attribution(spark) -> dict:
    rows = [
        ("v-old", at(0, hour=10), "view", "ad-1", "u-1"),
        ("v-mid", at(10, hour=10), "view", "ad-1", "u-1"),
        ("v-new", at(20, hour=10), "view", "ad-1", "u-1"),
        ("c-several", at(30, hour=10), "click", "ad-1", "u-1"),  # 3 views before: latest wins
        ("c-alone", at(30, hour=10), "click", "ad-2", "u-1"),  # no view of ad-2: no row
        ("v-other-user", at(25, hour=10), "view", "ad-3", "u-2"),
        ("c-other-user", at(26, hour=10), "click", "ad-3", "u-3"),  # another user viewed
        ("v-far", at(0, hour=8), "view", "ad-4", "u-1"),
        ("c-61-minutes", at(1, hour=9), "click", "ad-4", "u-1"),  # 61 min after: too far
        ("v-exact", at(0, hour=12), "view", "ad-5", "u-1"),
        ("c-60-minutes", at(0, hour=13), "click", "ad-5", "u-1"),  # exactly one hour: in
    ]
    result = ad_attribution.ad_attribution(events(spark, rows), "1 hour").collect()
    return {r.click_event_id: (r.view_event_id, r.seconds_from_view) for r in result}


def test_click_gets_the_latest_view_within_the_hour(attribution) -> None:
    assert attribution["c-several"] == ("v-new", 600.0)
    assert attribution["c-60-minutes"] == ("v-exact", 3600.0)


def test_clicks_without_a_view_in_reach_have_no_row(attribution) -> None:
    assert set(attribution) == {"c-several", "c-60-minutes"}


def test_time_zones_land_in_their_utc_window(spark) -> None:
    from spark_jobs.silver import ad_events as silver
    from spark_jobs.silver.validation import Rules, validate
    from tests.silver_helpers import bronze_frame

    raws = [f'{{"event_id":"{n}","event_time":{time},"event_type":"view","ad_id":"ad-1"}}'
            for n, time in enumerate(['"2026-11-22T15:30:30+05:30"',  # 10:00:30 UTC
                                      '"2026-11-22T05:00:59.999-05:00"',  # 10:00:59.999 UTC
                                      "1763805660000"])]  # 2025-11-22 10:01:00 UTC
    valid = silver.accepted(validate(bronze_frame(spark, raws), Rules(86400 * 400, False)))
    result = campaign_stats.campaign_stats(valid, mapping(spark, [("ad-1", "c-1", EPOCH)]),
                                           "1 minute").collect()
    assert sorted((r.window_start.isoformat(), r.views) for r in result) == [
        ("2025-11-22T10:01:00", 1), ("2026-11-22T10:00:00", 2)]


def attribution_rows(spark, rows: list[tuple[str, datetime, str, datetime]]):
    """(click_event_id, click_time, view_event_id, view_time) as attribution rows."""
    return spark.createDataFrame(
        [(click, clicked, clicked.date(), "u-1", "ad-1", view, viewed,
          (clicked - viewed).total_seconds()) for click, clicked, view, viewed in rows],
        ad_attribution.SCHEMA)


def test_an_attribution_batch_reads_only_the_files_around_its_clicks(spark, settings,
                                                                       tmp_path) -> None:
    ensure_table(spark, settings, ad_attribution.TABLE)
    path = Path(ad_attribution.TABLE.path(settings))
    files_of_hour = {}
    for hour in (8, 12, 16):  # three earlier batches, a file each
        before = set(path.glob("*.parquet"))
        ad_attribution.upsert(spark, settings, attribution_rows(
            spark, [(f"c-{hour}", at(0, hour=hour), f"v-{hour}", at(0, hour=hour - 1))]))
        files_of_hour[hour] = set(path.glob("*.parquet")) - before
    # The other hours' files are taken away: the MERGE fails if it reads them.
    aside = tmp_path / "aside"
    aside.mkdir()
    for file in files_of_hour[8] | files_of_hour[16]:
        file.rename(aside / file.name)
    # A later view for the noon click, and a new click beside it.
    ad_attribution.upsert(spark, settings, attribution_rows(spark, [
        ("c-12", at(0), "v-later", at(30, hour=11)), ("c-new", at(5), "v-new", at(1))]))
    for file in aside.iterdir():
        file.rename(path / file.name)
    rows = {r.click_event_id: r.view_event_id
            for r in spark.read.format("delta").load(str(path)).collect()}
    assert rows == {"c-8": "v-8", "c-12": "v-later", "c-16": "v-16", "c-new": "v-new"}
    # A batch in which no click found a view commits nothing.
    versions = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count()
    ad_attribution.upsert(spark, settings, attribution_rows(spark, []))
    assert spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count() == versions


def test_a_batch_of_new_attributions_is_written_as_one_file(spark, settings,
                                                             monkeypatch) -> None:
    """The join's output arrives in a partition per shuffle partition (2 in the tests, 4 by
    default); written as it is, every batch would add that many files to the table (and to
    every snapshot Delta replays afterwards)."""
    ensure_table(spark, settings, ad_attribution.TABLE)
    path = ad_attribution.TABLE.path(settings)

    def batch(first: int):
        # 40 clicks, each with its view 5 minutes before: the window over click_event_id
        # spreads them over the shuffle partitions, as in a stream's batch.
        candidates = spark.createDataFrame(
            [(f"c-{n}", at(30, n % 60), "u-1", "ad-1", f"v-{n}", at(25, n % 60), "u-1", "ad-1")
             for n in range(first, first + 40)],
            "click_event_id string, click_time timestamp, click_user_id string, "
            "click_ad_id string, view_event_id string, view_time timestamp, "
            "view_user_id string, view_ad_id string")
        return ad_attribution.latest_view_per_click(candidates).persist()

    def files_added() -> int:
        last = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()
        return int(last.operationMetrics["numTargetFilesAdded"])

    # A stream's micro-batch runs without adaptive execution, which would coalesce them.
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    try:
        spread = batch(0)
        assert spread.rdd.getNumPartitions() == 2  # what the table would get a file each of
        ad_attribution.upsert(spark, settings, spread)
        assert files_added() == 1
        # Past the bound, a file per that many attributions (40 at 20 a file: 2).
        monkeypatch.setattr(ad_attribution, "ATTRIBUTIONS_PER_FILE", 20)
        ad_attribution.upsert(spark, settings, batch(100))
        assert files_added() == 2
    finally:
        spark.conf.unset("spark.sql.adaptive.enabled")
    assert spark.read.format("delta").load(path).count() == 80


def test_closed_windows_are_set_apart_from_the_file_the_merges_rewrite(spark, settings,
                                                                       monkeypatch) -> None:
    ensure_table(spark, settings, campaign_stats.TABLE)
    path = campaign_stats.TABLE.path(settings)
    monkeypatch.setattr(campaign_stats, "COPIED_ROWS_BEFORE_SET_APART", 20)

    def add(minutes: range) -> int | None:
        """One view in each minute's window of campaign c-1, MERGEd as a batch does."""
        rows = [("c-1", at(m), at(m + 1), 1, 0, 0, Decimal("0")) for m in minutes]
        return campaign_stats.add_to_windows(
            spark, settings, spark.createDataFrame(rows, campaign_stats.SCHEMA).coalesce(1),
            (f"{at(minutes[0])}", f"{at(minutes[-1])}"))

    def copied() -> int:
        last = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()
        return int(last.operationMetrics["numTargetRowsCopied"])

    def table() -> list[tuple]:
        return sorted((r.window_start, r.views) for r in
                      spark.read.format("delta").load(path).collect())

    watermark_at_25 = watermark.micros(at(25))
    add(range(0, 30))  # one file of windows 12:00 to 12:29
    merged = add(range(29, 31))  # 12:29 updated, 12:30 inserted: 29 rows rewritten as they were
    assert copied() == 29
    before = table()
    assert campaign_stats.set_closed_windows_apart(spark, settings, watermark_at_25, merged)
    assert table() == before  # the same rows, in other files
    # Windows ending by 12:25 (12:00 to 12:24) lie in files of their own, apart from the open
    # ones (a MERGE writes a file per shuffle partition, so the open ones may be in two).
    files = (spark.read.format("delta").load(path)
             .groupBy("_metadata.file_path").agg(F.min("window_start"), F.max("window_start"))
             .collect())
    assert {(low.minute, high.minute) for _, low, high in files if high.minute < 25} == {(0, 24)}
    assert all(low.minute >= 25 for _, low, high in files if high.minute >= 25)
    # The next batch's MERGE rewrites open windows only: of the 6 rows, at most the other 5.
    merged = add(range(30, 31))
    assert copied() <= 5
    # Below the bound nothing moves, and no commit is written.
    version = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count()
    assert not campaign_stats.set_closed_windows_apart(spark, settings,
                                                       watermark.micros(at(28)), merged)
    assert spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count() == version
    # After the nightly OPTIMIZE the whole table is one file again: the next MERGE copies
    # all of it, and the closed windows are set apart once more, in files of at most 10
    # rows here, in window order.
    spark.sql(f"OPTIMIZE delta.`{path}`")
    monkeypatch.setattr(campaign_stats, "ROWS_PER_SET_APART_FILE", 10)
    merged = add(range(30, 32))  # 12:30 is in the compacted file: all of it is rewritten
    assert copied() == 30
    after_merge = table()
    assert campaign_stats.set_closed_windows_apart(spark, settings, watermark.micros(at(28)),
                                                   merged)
    assert table() == after_merge
    files = sorted((low.minute, high.minute) for _, low, high in
                   spark.read.format("delta").load(path).groupBy("_metadata.file_path")
                   .agg(F.min("window_start"), F.max("window_start")).collect())
    # Closed: the windows ending by 12:28, 12:00 to 12:27.
    closed_files = [(low, high) for low, high in files if high < 28]
    assert all(low >= 28 for low, high in files if high >= 28)
    assert len(closed_files) >= 2 and closed_files[0][0] == 0 and closed_files[-1][1] == 27
    assert all(left[1] < right[0] for left, right in pairwise(closed_files))
    # A MERGE an idempotent replay skipped commits nothing, and says so.
    with idempotent_dml(spark, "test-query", 0):
        assert add(range(32, 33)) is not None
    with idempotent_dml(spark, "test-query", 0):
        assert add(range(32, 33)) is None


def test_gold_still_equals_the_batch_recomputation_when_windows_are_set_apart(
        spark, settings, monkeypatch) -> None:
    """Closed windows set apart after every batch (bound 1) change no count."""
    monkeypatch.setattr(campaign_stats, "COPIED_ROWS_BEFORE_SET_APART", 1)
    batches = [
        # Ten views a batch, a minute apart, and a click 5 minutes before the batch: inside
        # the 10-minute watermark, so it updates a window an earlier batch wrote.
        [(f"v-{k}-{m}", at(10 * k + m), "view", "ad-1") for m in range(10)]
        + ([(f"c-{k}", at(10 * k - 5), "click", "ad-1")] if k else [])
        for k in range(6)]
    stream_batches(spark, settings, batches)
    path = campaign_stats.TABLE.path(settings)
    operations = [r.operation for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()]
    assert "WRITE" in operations, "no window was set apart: the test proves nothing"
    every_event = events(spark, [row for batch in batches for row in batch])
    expected = campaign_stats.campaign_stats(every_event, mapping(spark, [("ad-1", "c-1", EPOCH)]),
                                             settings.window_duration)
    streamed = table(spark, settings, campaign_stats.TABLE)
    assert streamed.count() == 60  # a window per minute, each once
    assert streamed.exceptAll(expected).count() == 0
    assert expected.exceptAll(streamed).count() == 0


def test_time_bounds_name_the_same_instants_in_any_session_time_zone(spark) -> None:
    # 06:30 UTC on 2026-11-01 is the second 01:30 in New York (clocks went back from EDT to
    # EST at 06:00 UTC): as text without an offset it is read back as the first, an hour
    # earlier, and a scope ending there would miss the batch's last rows.
    instant = spark.sql("SELECT TIMESTAMP'2026-11-01 06:30:00Z' AS t")
    zone = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        bounds = instant.agg(*time_bounds("t")).first()
        assert spark.sql(
            f"SELECT TIMESTAMP'{bounds['first']}' = TIMESTAMP'2026-11-01 06:29:59.999Z', "
            f"TIMESTAMP'{bounds['last']}' = TIMESTAMP'2026-11-01 06:30:00.001Z'").first() == (
                True, True)
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)


def test_a_restarted_driver_applies_the_watermark_its_commits_carry(spark, settings) -> None:
    stream_batches(spark, settings, [
        [("a", at(0), "view", "ad-1")],
        [("b", at(30), "view", "ad-1")],  # max event time 12:30: watermark 12:20 from now on
    ])
    path = campaign_stats.TABLE.path(settings)
    # A new driver remembers nothing: the watermark comes from gold's own log.
    watermark._latest_through.clear()
    campaign_stats.process(spark, events(spark, [("late", at(19), "view", "ad-1")]), QUERY,
                           2, settings=settings)
    ledger = table(spark, settings, late_data.TABLE).collect()
    assert [(r.window_start.strftime("%H:%M"), r.watermark) for r in ledger] == [
        ("12:19", at(20))]
    # Batch 1 replayed by a new driver applies batch 0's watermark (12:00 less 10 minutes),
    # not its own first attempt's: the MERGE already committed, nothing changes.
    watermark._latest_through.clear()
    assert watermark.naive_utc(watermark.latest_before(path, QUERY, 1)) == at(0)
    # Batch 2 had nothing on time and committed nothing: batch 3 reads batch 1's figure.
    assert watermark.naive_utc(watermark.latest_before(path, QUERY, 3)) == at(30)
    # Another query of the same table (a reset checkpoint) starts with no watermark.
    assert watermark.latest_before(path, "another-query", 0) is None


def test_a_stats_batch_reads_only_the_files_of_its_windows(spark, settings, tmp_path) -> None:
    stream_batches(spark, settings, [[("a", at(0, hour=8), "view", "ad-1")]])
    path = Path(campaign_stats.TABLE.path(settings))
    files_of_hour = {}
    for batch_id, hour in enumerate((12, 16), start=1):  # two more batches, a file each
        before = set(path.glob("*.parquet"))
        campaign_stats.process(spark, events(spark, [(f"e-{hour}", at(0, hour=hour), "view",
                                                      "ad-1")]), QUERY, batch_id,
                               settings=settings)
        files_of_hour[hour] = set(path.glob("*.parquet")) - before
    files_of_hour[8] = set(path.glob("*.parquet")) - files_of_hour[12] - files_of_hour[16]
    # The other hours' files are taken away: the MERGE fails if it reads them.
    aside = tmp_path / "aside"
    aside.mkdir()
    for file in files_of_hour[8] | files_of_hour[12]:
        file.rename(aside / file.name)
    # 16:00 counted again (a second view) and a new window beside it.
    campaign_stats.process(spark, events(spark, [("again", at(0, 30, hour=16), "view", "ad-1"),
                                                 ("new", at(1, hour=16), "click", "ad-1")]),
                           QUERY, 3, settings=settings)
    for file in aside.iterdir():
        file.rename(path / file.name)
    rows = {r.window_start.strftime("%H:%M"): (r.views, r.clicks)
            for r in table(spark, settings, campaign_stats.TABLE).collect()}
    assert rows == {"08:00": (1, 0), "12:00": (1, 0), "16:00": (2, 0), "16:01": (0, 1)}


def test_a_batch_replayed_after_its_ledger_committed_decides_as_its_first_attempt(
        spark, settings, monkeypatch) -> None:
    stream_batches(spark, settings, [
        [("a", at(0), "view", "ad-1")],
        [("b", at(30), "view", "ad-1")],  # watermark 12:20 from now on
    ])
    batch = [("late", at(19), "view", "ad-1"), ("on-time", at(25), "view", "ad-1")]

    def killed(*_args, **_kwargs) -> None:
        raise RuntimeError("driver killed between the ledger append and the MERGE")

    with monkeypatch.context() as patched:
        patched.setattr(campaign_stats, "add_to_windows", killed)
        with pytest.raises(RuntimeError):
            campaign_stats.process(spark, events(spark, batch), QUERY, 2, settings=settings)
    watermark._latest_through.clear()  # the restarted driver
    campaign_stats.process(spark, events(spark, batch), QUERY, 2, settings=settings)
    # The replay applied 12:20 again: "late" is in the ledger once and in no window.
    assert [(r.window_start.strftime("%H:%M"), r.late_rows)
            for r in table(spark, settings, late_data.TABLE).collect()] == [("12:19", 1)]
    # The ledger's one commit names its batch, and carries no Delta transaction, whose check
    # would rebuild the ledger's state for every batch with a late event.
    ledger_path = late_data.TABLE.path(settings)
    appended = delta_reader.commit_actions(ledger_path, delta_reader.latest_version(ledger_path))
    assert not [action for action in appended if "txn" in action]
    assert json.loads(delta_reader.info_among(appended)["userMetadata"]) == {
        delta_writes.BATCH_MARKER: [QUERY, 2]}
    rows = {r.window_start.strftime("%H:%M"): r.views
            for r in table(spark, settings, campaign_stats.TABLE).collect()}
    assert rows == {"12:00": 1, "12:30": 1, "12:25": 1}


def test_a_lake_from_before_the_commit_metadata_resumes_with_its_recorded_watermark(
        spark, settings) -> None:
    stream_batches(spark, settings, [])
    # As the earlier design left it: batches 0 and 1 recorded in the ops table, gold's
    # commits carrying nothing.
    legacy = settings.table_path(watermark.LEGACY_TABLE)
    spark.sql(f"SELECT '{QUERY}' AS query_id, id AS batch_id, TIMESTAMP'2026-11-22 12:00:00' "
              f"+ id * INTERVAL 30 MINUTES AS max_event_time FROM range(2)"
              ).write.format("delta").save(legacy)
    watermark._latest_through.clear()
    campaign_stats.process(spark, events(spark, [("late", at(19), "view", "ad-1")]), QUERY,
                           2, settings=settings)
    # Batch 1's 12:30 less 10 minutes: the event's window closed at 12:20.
    assert [r.watermark for r in table(spark, settings, late_data.TABLE).collect()] == [
        at(20)]
