"""Silver's foreachBatch logic on inline micro-batches: dedup across time, replays, late data."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime, timedelta

import pytest
from pyspark.sql import functions as F

from spark_jobs import reprocess
from spark_jobs.audit import account
from spark_jobs.config import interval_seconds
from spark_jobs.dates import DateRange
from spark_jobs.delta_reader import latest_version, transaction_versions
from spark_jobs.delta_writes import session_setting
from spark_jobs.silver import ad_events as silver
from spark_jobs.silver import quarantine
from spark_jobs.silver.validation import Rules, validate
from spark_jobs.tables import ensure_table
from tests.silver_helpers import INGESTED, bronze_frame

APP = "test-query"


def view(event_id: str, when: str = "2026-11-22T11:59:00Z") -> str:
    return json.dumps({"event_id": event_id, "event_time": when, "event_type": "view",
                       "ad_id": "ad-1"})


def prepare(spark, settings) -> None:
    for table in (silver.TABLE, quarantine.TABLE):
        ensure_table(spark, settings, table)


def silver_rows(spark, settings) -> list:
    return spark.read.format("delta").load(silver.TABLE.path(settings)).collect()


def quarantine_rows(spark, settings) -> list:
    return spark.read.format("delta").load(quarantine.TABLE.path(settings)).collect()


def test_a_redelivery_days_later_does_not_make_a_second_row(spark, settings) -> None:
    prepare(spark, settings)
    first = bronze_frame(spark, [view("e-1")], file_name="monday.jsonl")
    again = bronze_frame(spark, [view("e-1")], ingested_at=INGESTED + timedelta(days=3),
                         file_name="thursday.jsonl")
    silver.process(spark, first, APP, 0, settings=settings)
    silver.process(spark, again, APP, 1, settings=settings)
    rows = silver_rows(spark, settings)
    assert len(rows) == 1
    assert rows[0].bronze_id == "file:monday.jsonl:1"  # the first delivery is kept


def test_duplicates_within_one_batch_keep_the_earliest_delivery(spark, settings) -> None:
    prepare(spark, settings)
    batch = bronze_frame(spark, [view("e-1"), view("e-2"), view("e-1")])
    silver.process(spark, batch, APP, 0, settings=settings)
    rows = sorted((row.event_id, row.bronze_id) for row in silver_rows(spark, settings))
    # Same ingestion time: the lower bronze_id (line 1, not line 3) wins.
    assert rows == [("e-1", "file:inline.jsonl:1"), ("e-2", "file:inline.jsonl:2")]


def test_a_replayed_batch_is_not_applied_twice(spark, settings) -> None:
    prepare(spark, settings)
    batch = bronze_frame(spark, [view("e-1"), "not json"])
    planned_at = datetime(2026, 11, 22, 12, 0, 5)  # a replay comes with its batch's time
    # A crash after the quarantine append but before the MERGE committed:
    quarantine.append(validate(batch, Rules.from_settings(settings)), settings, APP, 0,
                      checkpoint=settings.checkpoint(silver.QUERY_NAME),
                      quarantined_at=F.lit(planned_at))
    # ... then Spark replays batch 0, and once more for good measure.
    silver.process(spark, batch, APP, 0, settings=settings, batch_time=planned_at)
    silver.process(spark, batch, APP, 0, settings=settings, batch_time=planned_at)
    assert [row.quarantined_at for row in quarantine_rows(spark, settings)] == [planned_at]
    assert len(silver_rows(spark, settings)) == 1
    # The next batch, with a record rejected again, is another batch: quarantined again.
    silver.process(spark, batch, APP, 1, settings=settings,
                   batch_time=planned_at + timedelta(seconds=20))
    assert len(quarantine_rows(spark, settings)) == 2


def test_only_a_batch_with_rejected_records_writes_a_quarantine_commit(spark, settings
                                                                    ) -> None:
    prepare(spark, settings)
    path = quarantine.TABLE.path(settings)
    created = latest_version(path)
    silver.process(spark, bronze_frame(spark, [view("e-1")]), APP, 0, settings=settings)
    assert latest_version(path) == created  # nothing rejected, nothing committed
    silver.process(spark, bronze_frame(spark, [view("e-2"), "not json"]), APP, 1,
                   settings=settings)
    assert latest_version(path) == created + 1
    assert [row.reason for row in quarantine_rows(spark, settings)] == ["malformed_json"]


def test_a_replay_under_changed_rules_keeps_its_first_attempt_s_verdict(spark, settings
                                                                       ) -> None:
    prepare(spark, settings)
    # Two hours ahead of its ingestion: within the default 24-hour future tolerance.
    batch = bronze_frame(spark, [view("ahead", when="2026-11-22T14:00:00Z")])
    planned_at = datetime(2026, 11, 22, 12, 0, 5)
    silver.process(spark, batch, APP, 0, settings=settings, batch_time=planned_at)
    # Inserted, nothing rejected.
    # The driver dies before its checkpoint records batch 0, and restarts with a one-hour
    # tolerance: the replay rejects the event that its first attempt inserted.
    stricter = settings.replace(future_tolerance="1 hour")
    silver.process(spark, batch, APP, 0, settings=stricter, batch_time=planned_at)
    assert [row.event_id for row in silver_rows(spark, settings)] == ["ahead"]
    assert quarantine_rows(spark, settings) == []  # not placed twice


def test_a_late_event_lands_in_its_own_date(spark, settings) -> None:
    prepare(spark, settings)
    batch = bronze_frame(spark, [view("late", when="2026-11-19T08:00:00Z"), view("now")])
    silver.process(spark, batch, APP, 0, settings=settings)
    dates = {row.event_id: row.event_date.isoformat() for row in silver_rows(spark, settings)}
    assert dates == {"late": "2026-11-19", "now": "2026-11-22"}
    # Three days later the same late event is redelivered: still one row.
    silver.process(spark, bronze_frame(spark, [view("late", when="2026-11-19T08:00:00Z")],
                                       ingested_at=INGESTED + timedelta(days=3)),
                   APP, 1, settings=settings)
    assert len(silver_rows(spark, settings)) == 2


def write_bronze(spark, settings, raws: list[str], ingested_at: datetime = INGESTED) -> None:
    from spark_jobs.bronze import ad_events as bronze

    ensure_table(spark, settings, bronze.TABLE)
    (bronze_frame(spark, raws, ingested_at).write.format("delta").mode("append")
        .save(bronze.TABLE.path(settings)))


def test_audit_accounts_for_every_bronze_row(spark, settings) -> None:
    prepare(spark, settings)
    raws = [view("e-1"), view("e-2"), view("e-1"), "{}", "[1]"]
    write_bronze(spark, settings, raws)
    silver.process(spark, bronze_frame(spark, raws), APP, 0, settings=settings)
    result = account(spark, settings)
    # 5 delivered = 2 silver (e-1, e-2) + 2 quarantine ({} and [1]) + 1 duplicate (e-1).
    assert (result.delivered, result.silver_rows, result.quarantine_rows,
            result.duplicates) == (5, 2, 2, 1)
    assert result.quarantine_by_reason == {"empty_record": 1, "not_an_object": 1}
    assert result.identity_holds
    # Quarantine keeps a rejected record's text as delivered (the batch caches the raw text
    # of the rejected only); silver keeps the first delivery's identity.
    held = spark.read.format("delta").load(quarantine.TABLE.path(settings))
    assert sorted(row.raw for row in held.collect()) == ["[1]", "{}"]
    assert (spark.read.format("delta").load(silver.TABLE.path(settings))
            .where("event_id = 'e-1'").first().bronze_id) == bronze_frame(
                spark, raws).first().bronze_id


def test_audit_fails_on_an_unprocessed_or_doubly_placed_record(spark, settings) -> None:
    prepare(spark, settings)
    write_bronze(spark, settings, [view("e-1"), view("e-2")])
    # Silver saw only the first record: the second is unaccounted for.
    silver.process(spark, bronze_frame(spark, [view("e-1")]), APP, 0, settings=settings)
    result = account(spark, settings)
    assert result.unaccounted == 1 and not result.identity_holds
    # A silver row forced in twice breaks the identity the other way.
    (spark.read.format("delta").load(silver.TABLE.path(settings)).write.format("delta")
        .mode("append").save(silver.TABLE.path(settings)))
    result = account(spark, settings)
    assert result.accounted_twice == 1 and not result.identity_holds


def scan_metric(spark, settings, scope: str, metric: str) -> int:
    """A metric of the silver scan with a MERGE's scope, summed over its leaves."""
    frame = spark.read.format("delta").load(silver.TABLE.path(settings)).alias("t").where(
        scope)
    frame.collect()
    leaves = frame._jdf.queryExecution().executedPlan().collectLeaves()
    return sum(int(leaves.apply(i).metrics().apply(metric).value())
               for i in range(leaves.size()) if leaves.apply(i).metrics().contains(metric))


def files_read(spark, settings, scope: str) -> int:
    """How many silver files a scan with a MERGE's scope reads: Delta skips the others by
    partition and statistics, for the MERGE as for this scan."""
    return scan_metric(spark, settings, scope, "numFiles")


def scopes_of(settings, batch) -> dict[bool, str]:
    """The MERGE scopes of a bronze batch's first deliveries."""
    return silver.merge_scopes(silver.first_deliveries(silver.accepted(
        validate(batch, Rules.from_settings(settings)))), settings)


def test_a_batch_looks_only_at_the_silver_files_around_its_own_event_times(spark,
                                                                           settings) -> None:
    prepare(spark, settings)
    # Five hours of a steady feed, a batch an hour, each event a minute before ingestion.
    for hour in range(5):
        ingested = INGESTED - timedelta(hours=5 - hour)
        when = (ingested - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        silver.process(spark, bronze_frame(spark, [view(f"e-{hour}-{n}", when)
                                                    for n in range(3)],
                                           ingested_at=ingested, file_name=f"h{hour}.jsonl"),
                       APP, hour, settings=settings)
    # Now: two new events (one twice) and, five hours late, a copy of the first hour's.
    batch = bronze_frame(spark, [view("new-1"), view("new-2"), view("new-1"),
                                 view("e-0-0", "2026-11-22T06:59:00Z")], file_name="now.jsonl")
    scopes = scopes_of(settings, batch)
    # Silver holds five files of the date, one per batch. The on-time events (11:59-12:00)
    # overlap none (the latest ended at 10:59); the late copy (06:59) the first hour's only.
    assert files_read(spark, settings, scopes[True]) == 0
    assert files_read(spark, settings, scopes[False]) == 1
    assert files_read(spark, settings, "t.event_date = DATE'2026-11-22'") == 5  # the date
    silver.process(spark, batch, APP, 5, settings=settings)
    # 15 earlier events and the two new ones: the late copy is found, the double is one.
    assert sorted(row.event_id for row in silver_rows(spark, settings))[-2:] == [
        "new-1", "new-2"]
    assert len(silver_rows(spark, settings)) == 17


# Ingested at 12:00: three views a minute old (on time), three five hours late on the same
# date, one a day late.
LATE = ["2026-11-22T06:59:00Z", "2026-11-22T07:30:00Z", "2026-11-22T08:00:00Z",
        "2026-11-21T12:00:00Z"]


def on_time_and_late(spark, copies: int = 1):
    """Three on-time events and four late ones, each delivered ``copies`` times."""
    return bronze_frame(spark, [*(view(f"on-{n}") for n in range(3)),
                                *(view(f"late-{n}", when) for n, when in enumerate(LATE))]
                        * copies)


def merges_and_files(spark, settings) -> tuple[int, list]:
    """How many MERGEs silver committed; per file, its classes of event and rows."""
    path = silver.TABLE.path(settings)
    operations = [row.operation for row in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()]
    on_time = F.abs(F.col("event_time").cast("long") - F.col("ingested_at").cast("long")) <= (
        interval_seconds(settings.watermark_delay))
    files = (spark.read.format("delta").load(path)
             .groupBy(F.col("_metadata.file_path").alias("file"))
             .agg(F.collect_set(on_time).alias("classes"), F.count("*").alias("rows"))
             .collect())
    return operations.count("MERGE"), sorted((sorted(row.classes), row.rows) for row in files)


# One file per class and date: the on-time events' (one date), the late ones' (two dates).
SEPARATE_FILES = [([False], 1), ([False], 3), ([True], 3)]


def test_a_batch_of_both_classes_is_one_merge_whose_files_do_not_mix_them(spark,
                                                                          settings) -> None:
    prepare(spark, settings)
    # Silver is empty, so Spark broadcasts its rows in scope: one MERGE.
    silver.process(spark, on_time_and_late(spark), APP, 0, settings=settings)
    assert merges_and_files(spark, settings) == (1, SEPARATE_FILES)


def test_a_large_class_is_written_by_the_tasks_that_deduplicated_it(spark, settings,
                                                                       monkeypatch) -> None:
    prepare(spark, settings)
    batch = bronze_frame(spark, [view(f"e-{n}") for n in range(20)])  # on time, one date
    # Spark's two shuffle partitions kept apart, as a large batch's would be.
    with session_setting(spark, "spark.sql.adaptive.coalescePartitions.enabled", "false"):
        silver.process(spark, batch, APP, 0, settings=settings)
        # Up to ONE_FILE_PER_DATE_AT_MOST events a class, one file for the date.
        assert merges_and_files(spark, settings) == (1, [([True], 20)])
        monkeypatch.setattr(silver, "ONE_FILE_PER_DATE_AT_MOST", 10)
        later = bronze_frame(spark, [view(f"later-{n}") for n in range(20)],
                             file_name="later.jsonl")
        silver.process(spark, later, APP, 1, settings=settings)
    # Past it, a file per task: the 20 later events in two files (event ids hashed over
    # both partitions), still one class each.
    merges, files = merges_and_files(spark, settings)
    assert merges == 2 and len(files) == 3
    assert sorted(rows for _, rows in files)[-1] == 20 and sum(rows for _, rows in files) == 40
    assert all(classes == [True] for classes, _ in files)


def merges_recorded(settings) -> set[str]:
    """Which of the insert's MERGEs (one for both classes, or one per class) silver's log
    records for the batches of ``APP``."""
    names = [silver.INSERT, *silver.CLASS_INSERTS.values()]
    versions = transaction_versions(silver.TABLE.path(settings),
                                    [f"{APP}/{name}" for name in names])
    return {name for name, version in zip(names, versions, strict=True) if version is not None}


@contextmanager
def join_would_shuffle(spark) -> Iterator[None]:
    """Spark plans no broadcast join inside, as for a scope too large to broadcast; and the
    driver asks again (an answer given outside does not hold inside)."""
    silver._answers.clear()
    with session_setting(spark, "spark.sql.autoBroadcastJoinThreshold", "-1"):
        yield


def killed_between_merges(spark, settings, monkeypatch) -> None:
    """The batch processed where its join would shuffle, killed after the on-time MERGE
    committed and before the other one."""
    def crash(point: str) -> None:
        if point == "silver_ad_events.between_merges":
            raise RuntimeError("killed")

    monkeypatch.setattr(silver, "crash_point", crash)
    with join_would_shuffle(spark), pytest.raises(RuntimeError, match="killed"):
        silver.process(spark, on_time_and_late(spark), APP, 0, settings=settings)
    monkeypatch.undo()
    assert merges_and_files(spark, settings) == (1, [([True], 3)])


def test_where_the_join_would_shuffle_each_class_has_a_merge_and_a_replay_finishes_it(
        spark, settings, monkeypatch) -> None:
    prepare(spark, settings)
    killed_between_merges(spark, settings, monkeypatch)
    # Replayed the same way: the on-time MERGE is not applied again, the other is.
    with join_would_shuffle(spark):
        silver.process(spark, on_time_and_late(spark), APP, 0, settings=settings)
    assert merges_and_files(spark, settings) == (2, SEPARATE_FILES)
    assert merges_recorded(settings) == {"on-time", "others"}


def test_a_replay_that_takes_the_other_path_inserts_each_event_once(spark, settings,
                                                                    monkeypatch) -> None:
    prepare(spark, settings)
    killed_between_merges(spark, settings, monkeypatch)
    silver._answers.clear()  # a new driver: it asks
    # Replayed where it broadcasts: one MERGE of both classes, which finds the on-time
    # events already in and inserts the late ones, each once, in files of their own.
    silver.process(spark, on_time_and_late(spark), APP, 0, settings=settings)
    assert merges_and_files(spark, settings) == (2, SEPARATE_FILES)
    assert merges_recorded(settings) == {"on-time", "insert"}


def test_a_batch_inserted_by_one_merge_and_replayed_by_two_changes_nothing(spark,
                                                                          settings) -> None:
    prepare(spark, settings)
    silver.process(spark, on_time_and_late(spark), APP, 0, settings=settings)  # one MERGE
    # Replayed (killed before its checkpoint's commit) where the join would shuffle: the
    # two MERGEs find every event in, and the seven rows and their files stay as they were.
    with join_would_shuffle(spark):
        silver.process(spark, on_time_and_late(spark), APP, 0, settings=settings)
    assert merges_and_files(spark, settings) == (3, SEPARATE_FILES)
    assert merges_recorded(settings) == {"insert", "on-time", "others"}


def test_a_batch_over_the_limit_takes_a_merge_per_class_without_asking(spark, settings,
                                                                       monkeypatch) -> None:
    prepare(spark, settings)
    monkeypatch.setattr(silver, "ONE_MERGE_AT_MOST", 6)  # the batch has 7 deliveries
    monkeypatch.setattr(silver, "_broadcast_join", lambda *args: pytest.fail("asked"))
    silver.process(spark, on_time_and_late(spark), APP, 0, settings=settings)
    assert merges_and_files(spark, settings) == (2, SEPARATE_FILES)


def answered(monkeypatch, *, broadcasts: bool) -> list[bool]:
    """Whether the join broadcasts is answered ``broadcasts``; the list grows per question."""
    asked: list[bool] = []

    def answer(*_args) -> bool:
        asked.append(broadcasts)
        return broadcasts

    monkeypatch.setattr(silver, "_broadcast_join", answer)
    return asked


def test_an_accepted_broadcast_holds_for_the_next_batches_unless_one_is_much_larger(
        spark, settings, monkeypatch) -> None:
    prepare(spark, settings)
    monkeypatch.setattr(silver, "BATCHES_BEFORE_ASKING_AGAIN", 2)
    asked = answered(monkeypatch, broadcasts=True)
    # Asked (7 deliveries); held for 14, twice 7, and for 7; asked again: one MERGE each.
    for batch_id, copies in enumerate([1, 2, 1, 1]):
        silver.process(spark, on_time_and_late(spark, copies), APP, batch_id,
                       settings=settings)
    assert len(asked) == 2
    # One more batch within the answer's two; but with 21 deliveries, more than twice the
    # 7 of the batch asked about, it asks.
    silver.process(spark, on_time_and_late(spark, copies=3), APP, 4, settings=settings)
    assert len(asked) == 3
    assert merges_and_files(spark, settings) == (5, SEPARATE_FILES)


def test_after_a_refused_broadcast_the_next_batches_do_not_ask(spark, settings,
                                                              monkeypatch) -> None:
    prepare(spark, settings)
    monkeypatch.setattr(silver, "BATCHES_BEFORE_ASKING_AGAIN", 1)
    asked = answered(monkeypatch, broadcasts=False)
    for batch_id in range(3):  # asked and refused, not asked, asked again
        silver.process(spark, on_time_and_late(spark), APP, batch_id, settings=settings)
    assert len(asked) == 2
    # A refusal holds for a larger batch too (its scope is no smaller): 21 deliveries.
    silver.process(spark, on_time_and_late(spark, copies=3), APP, 3, settings=settings)
    assert len(asked) == 2
    # Each refused batch took a MERGE per class (the later three found every event in).
    assert merges_and_files(spark, settings) == (8, SEPARATE_FILES)


def test_every_copy_is_found_whatever_class_and_minute_it_comes_in(spark, settings) -> None:
    prepare(spark, settings)
    times = ["2026-11-22T11:59:30Z", "2026-11-22T11:58:59.999Z", "2026-11-21T23:59:59.999Z",
             "2026-11-19T08:00:00.001Z", "2026-11-22T12:00:00Z"]
    # First seen on time (the first two, the last) or late (the others), ...
    silver.process(spark, bronze_frame(spark, [view(f"e-{n}", when)
                                               for n, when in enumerate(times)]),
                   APP, 0, settings=settings)
    # ... then all seen again, days later, in one batch with a new event on time.
    again = [view(f"e-{n}", when) for n, when in enumerate(times)]
    later = INGESTED + timedelta(days=2)
    silver.process(spark, bronze_frame(spark, [*again, view("fresh", "2026-11-24T11:59:00Z")],
                                       ingested_at=later, file_name="again.jsonl"),
                   APP, 1, settings=settings)
    assert sorted(row.event_id for row in silver_rows(spark, settings)) == [
        "e-0", "e-1", "e-2", "e-3", "e-4", "fresh"]


def test_the_ranges_a_merge_reads_are_joined_at_their_closest_gaps() -> None:
    def minute(m: int) -> tuple:
        start = datetime(2026, 11, 22, 0, 0) + timedelta(minutes=m)
        return (start.date(), f"{start:%Y-%m-%d %H:%M:%S}.000000",
                f"{start + timedelta(seconds=59):%Y-%m-%d %H:%M:%S}.000000")

    spans = [minute(m) for m in (50, 0, 1, 2, 10)]
    # Two ranges: the one cut is the widest gap (10 -> 50); minutes 0-10 become one range.
    assert silver._joined(spans, 2) == [
        ("2026-11-22 00:00:00.000000", "2026-11-22 00:10:59.000000"),
        ("2026-11-22 00:50:00.000000", "2026-11-22 00:50:59.000000")]
    # Within the limit, every minute keeps its own range.
    assert len(silver._joined(spans, 5)) == 5


def test_copies_spread_over_many_minutes_are_found_through_a_few_ranges(spark,
                                                                        settings) -> None:
    prepare(spark, settings)
    # 120 events, each in its own minute over five days: late, so one class.
    times = [(INGESTED - timedelta(hours=2, minutes=61 * n)).strftime("%Y-%m-%dT%H:%M:%SZ")
             for n in range(120)]
    silver.process(spark, bronze_frame(spark, [view(f"e-{n}", when)
                                               for n, when in enumerate(times)]),
                   APP, 0, settings=settings)
    again = bronze_frame(spark, [view(f"e-{n}", when) for n, when in enumerate(times)],
                         ingested_at=INGESTED + timedelta(hours=1), file_name="again.jsonl")
    scopes = scopes_of(settings, again)
    assert set(scopes) == {False}
    # 120 minutes of events, read through at most MAX_TIME_SLICES ranges (a filter Delta
    # can still compile), and every copy is found: silver keeps its 120 rows.
    assert scopes[False].count("BETWEEN") == silver.MAX_TIME_SLICES
    silver.process(spark, again, APP, 1, settings=settings)
    assert len(silver_rows(spark, settings)) == 120


def rows_read(spark, settings, scope: str) -> int:
    """How many silver rows a scan with a MERGE's scope reads from its files: Parquet skips
    the row groups the pushed filter rules out (by statistics or Bloom filter) and hands
    up every row of the others."""
    return scan_metric(spark, settings, scope, "numOutputRows")


def late_scope(spark, settings, raws: list[str]) -> str:
    return scopes_of(settings, bronze_frame(spark, raws, file_name="now.jsonl"))[False]


def test_late_events_are_looked_for_only_in_the_row_groups_that_may_hold_them(
        spark, settings) -> None:
    prepare(spark, settings)
    # An hour of the morning in silver: 50 views at 06:59, written by one batch, one file.
    morning = INGESTED - timedelta(hours=5)
    silver.process(spark, bronze_frame(spark, [view(f"e-{n}", "2026-11-22T06:59:00Z")
                                               for n in range(50)], ingested_at=morning),
                   APP, 0, settings=settings)
    # At 12:00, two events five hours late: new ones. Their times overlap the morning's file,
    # whose Bloom filter of event ids holds neither, so none of its rows is read.
    new = late_scope(spark, settings, [view(f"new-{n}", "2026-11-22T06:59:00Z")
                                       for n in range(2)])
    assert files_read(spark, settings, new) == 1
    assert rows_read(spark, settings, new) == 0
    # Without the ids, the scope reads all 50.
    assert rows_read(spark, settings, new.split(" AND t.event_id IN")[0]) == 50
    # A late copy of a morning event: its row group is read, and the copy found.
    copy = [view("e-7", "2026-11-22T06:59:00Z"), view("new-0", "2026-11-22T06:59:00Z")]
    assert rows_read(spark, settings, late_scope(spark, settings, copy)) == 50
    silver.process(spark, bronze_frame(spark, copy, file_name="now.jsonl"), APP, 1,
                   settings=settings)
    assert len(silver_rows(spark, settings)) == 51  # only new-0 is new


def test_late_event_ids_with_quotes_and_backslashes_are_looked_for_as_they_are(
        spark, settings) -> None:
    prepare(spark, settings)
    awkward = ["o'brien", "back\\slash", "\\'", "e-1' OR '1'='1"]
    late = [view(event_id, "2026-11-22T06:59:00Z") for event_id in awkward]
    silver.process(spark, bronze_frame(spark, late), APP, 0, settings=settings)
    # Delivered again an hour later, still late: every copy is found by its own id.
    silver.process(spark, bronze_frame(spark, late, ingested_at=INGESTED + timedelta(hours=1),
                                       file_name="again.jsonl"), APP, 1, settings=settings)
    assert sorted(row.event_id for row in silver_rows(spark, settings)) == sorted(awkward)


def test_a_large_late_class_is_scoped_by_time_alone(spark, settings, monkeypatch) -> None:
    prepare(spark, settings)
    monkeypatch.setattr(silver, "PROBE_BY_ID_AT_MOST", 1)
    raws = [view(f"late-{n}", "2026-11-22T06:59:00Z") for n in range(2)]
    # Two late events, more than the one id the scope may name.
    assert "event_id" not in late_scope(spark, settings, raws)
    silver.process(spark, bronze_frame(spark, raws), APP, 0, settings=settings)
    silver.process(spark, bronze_frame(spark, raws, ingested_at=INGESTED + timedelta(hours=1),
                                       file_name="again.jsonl"), APP, 1, settings=settings)
    assert len(silver_rows(spark, settings)) == 2


def test_the_stream_quarantines_at_the_time_spark_planned_the_batch(spark, settings) -> None:
    """A replay quarantines with its first attempt's time, which the fallback of a replay
    check looks for: the time Spark kept for the batch in its offset log, not the moment
    the rows were written."""
    from spark_jobs import streaming
    from spark_jobs.delta_writes import planned_time

    prepare(spark, settings)
    checkpoint = settings.checkpoint(silver.QUERY_NAME)
    stamps = []
    for batch_id, raw in enumerate(("not json", "[2]")):
        write_bronze(spark, settings, [view(f"e-{batch_id}"), raw])
        streaming.run_available_now(spark, settings, ["silver"])  # one batch each
        stamps.append(planned_time(checkpoint, batch_id))
    found = sorted((row.quarantined_at, row.raw) for row in quarantine_rows(spark, settings))
    # Collected rows hold naive local times.
    local = [stamp.astimezone().replace(tzinfo=None) for stamp in stamps]
    assert found == [(local[0], "not json"), (local[1], "[2]")]
    assert stamps[0] < stamps[1]


def test_silver_s_stream_and_a_rebuild_read_bronze_in_four_splits_per_core(spark, settings,
                                                                          monkeypatch) -> None:
    """A batch's few large bronze files were two or three uneven tasks on two cores, one
    validated alone while a core waited (``bronze.even_reads``). The stream's session is a
    copy made at its start: the setting must be there when each batch reads bronze."""
    write_bronze(spark, settings, [view("e-1")])
    four_per_core = str(4 * spark.sparkContext.defaultParallelism)
    seen: list[str | None] = []

    def recorded(action):
        def record(session, *args, **kwargs):
            seen.append(session.conf.get("spark.sql.files.minPartitionNum", None))
            return action(session, *args, **kwargs)
        return record

    monkeypatch.setattr(silver, "place", recorded(silver.place))
    monkeypatch.setattr(reprocess, "_rebuild_silver_from",
                        recorded(reprocess._rebuild_silver_from))
    silver.start(spark, settings, {"availableNow": True}).awaitTermination()
    reprocess.rebuild_silver(spark, settings, DateRange(date(2026, 11, 22), date(2026, 11, 22)),
                             Rules.from_settings(settings), dry_run=True)
    assert seen == [four_per_core, four_per_core]  # the stream's one batch, the rebuild
    assert [row.event_id for row in silver_rows(spark, settings)] == ["e-1"]
    # The caller's session is as it was: other jobs keep Spark's own splits.
    assert spark.conf.get("spark.sql.files.minPartitionNum", None) is None
