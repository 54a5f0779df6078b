"""The campaign mapping as SCD2 versions, and the point-in-time lookup of an event."""

from datetime import datetime

from spark_jobs.silver.ad_campaigns import campaign_at, parse_mappings, versions
from tests.silver_helpers import bronze_frame

T0 = datetime(2026, 11, 1)
T1 = datetime(2026, 11, 10)


def mapping_rows(spark, rows: list[tuple[str, str, datetime, str, datetime]]):
    return spark.createDataFrame(
        rows, "ad_id string, campaign_id string, valid_from timestamp, source_file string, "
              "ingested_at timestamp")


def test_a_later_file_closes_the_previous_version(spark) -> None:
    rows = versions(mapping_rows(spark, [
        ("ad-1", "c-1", T0, "a.jsonl", T0),
        ("ad-1", "c-2", T1, "b.jsonl", T1),
        ("ad-2", "c-1", T0, "a.jsonl", T0),
    ])).orderBy("ad_id", "valid_from").collect()
    assert [(r.ad_id, r.campaign_id, r.valid_from, r.valid_to) for r in rows] == [
        ("ad-1", "c-1", T0, T1),  # closed where the move starts
        ("ad-1", "c-2", T1, None),  # current
        ("ad-2", "c-1", T0, None),
    ]


def test_files_out_of_order_and_restatements(spark) -> None:
    late_arrival = datetime(2026, 11, 20)
    rows = versions(mapping_rows(spark, [
        ("ad-1", "c-2", T1, "b.jsonl", T1),
        ("ad-1", "c-1", T0, "a.jsonl", late_arrival),  # older version, arrived last
        ("ad-1", "c-9", T1, "fix.jsonl", late_arrival),  # restates T1: latest arrival wins
    ])).orderBy("valid_from").collect()
    assert [(r.campaign_id, r.valid_to) for r in rows] == [("c-1", T1), ("c-9", None)]


def test_events_get_the_campaign_at_their_time_or_unknown(spark) -> None:
    mapping = versions(mapping_rows(spark, [
        ("ad-1", "c-1", T0, "a", T0), ("ad-1", "c-2", T1, "b", T1)]))
    events = spark.createDataFrame([
        ("before-any-mapping", "ad-1", datetime(2026, 10, 1)),
        ("old-campaign", "ad-1", datetime(2026, 11, 9, 23, 59, 59)),
        ("on-the-boundary", "ad-1", T1),  # the new version starts at its valid_from
        ("unmapped-ad", "ad-404", T1),
    ], "event_id string, ad_id string, event_time timestamp")
    result = {r.event_id: r.campaign_id for r in campaign_at(events, mapping).collect()}
    assert result == {"before-any-mapping": "unknown", "old-campaign": "c-1",
                      "on-the-boundary": "c-2", "unmapped-ad": "unknown"}


def test_unusable_mapping_lines_are_flagged(spark) -> None:
    lines = bronze_frame(spark, [
        '{"ad_id": "a", "campaign_id": "c", "valid_from": "2026-11-01T00:00:00Z"}',
        '{"ad_id": "a", "campaign_id": "c", "valid_from": 1761955200000}',
        '{"ad_id": "a", "valid_from": "2026-11-01T00:00:00Z"}',
        '{"ad_id": "a", "campaign_id": "c", "valid_from": "soon"}',
        "not json",
    ])
    verdicts = [r.reason for r in parse_mappings(lines).orderBy("source_line").collect()]
    assert verdicts == [None, None, "bad_campaign_mapping", "bad_campaign_mapping",
                        "bad_campaign_mapping"]
