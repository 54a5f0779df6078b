"""The click-fraud alert path (``ops.alerts``): the transform on inline clicks, and the stream
over bronze in several micro-batches against the batch recomputation over silver."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from spark_jobs import streaming
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.ops import alerts
from spark_jobs.silver import ad_events as silver
from spark_jobs.tables import ensure_table
from spark_jobs.tables import read as read_table
from tests.silver_helpers import INGESTED, bronze_frame

MINUTE = datetime(2026, 11, 22, 11, 59)  # the minute most clicks fall in


def click(event_id: str, ip: str = "10.0.0.1", second: int = 0, **changes: object) -> str:
    when = MINUTE + timedelta(seconds=second)
    record = {"event_id": event_id, "event_time": f"{when.isoformat()}Z", "event_type": "click",
              "ad_id": "ad-1", "ip_address": ip, **changes}
    return json.dumps({key: value for key, value in record.items() if value is not None})


def test_an_address_over_the_limit_in_one_minute_raises_one_alert(spark) -> None:
    clicks = spark.createDataFrame(
        # 10.0.0.1: four clicks in 11:59, over a limit of 3; 10.0.0.2: three, at the limit;
        # 10.0.0.3: four clicks, but two in 11:59 and two in 12:00 (minutes, not a sliding
        # 60 seconds).
        [(f"a{n}", MINUTE + timedelta(seconds=10 * n), "10.0.0.1") for n in range(4)]
        + [(f"b{n}", MINUTE + timedelta(seconds=10 * n), "10.0.0.2") for n in range(3)]
        + [(f"c{n}", MINUTE + timedelta(seconds=30 + 20 * n), "10.0.0.3") for n in range(4)],
        "event_id string, event_time timestamp, ip_address string")
    [alert] = alerts.click_fraud(clicks, threshold=3).collect()
    assert (alert.ip_address, alert.window_start, alert.window_end, alert.clicks,
            alert.threshold) == ("10.0.0.1", MINUTE, MINUTE + timedelta(minutes=1), 4, 3)
    # The id is the address and the minute: the same whoever computes it.
    again = alerts.click_fraud(clicks.where("event_id != 'a0'").union(clicks.where(
        "event_id = 'a0'")), threshold=3).first()
    assert again.alert_id == alert.alert_id and len(alert.alert_id) == 64


def test_only_valid_clicks_with_an_address_count(spark, settings) -> None:
    from spark_jobs.silver.validation import Rules, validate

    # Ingested at 12:00; the alert path's lateness (and so its tolerance for clicks ahead
    # of their ingestion) is a minute. A click two hours ahead passes validation (its
    # tolerance is a day) but must not carry the alert stream's watermark with it.
    lines = [click("ok"), click("view", event_type="view"), click("no-ad", ad_id=None),
             click("no-ip", ip=None), click("blank-ip", ip="  "), "not json",
             click("a minute ahead", second=120), click("two hours ahead", second=7260)]
    validated = validate(bronze_frame(spark, lines), Rules.from_settings(settings))
    assert [row.event_id for row in alerts.valid_clicks(validated, settings).collect()] == [
        "ok", "a minute ahead"]


def test_only_records_that_can_be_clicks_are_validated_for_alerts(spark) -> None:
    escaped = '{"event_id": "escaped", "event_type": "\\u0063lick"}'  # JSON for "click"
    lines = [click("plain"), click("upper", event_type=" CLICK "), escaped,
             click("view", event_type="view"), "not json"]
    kept = alerts.maybe_clicks(bronze_frame(spark, lines))
    # The escaped one may spell a click (it does): validation decides; a view cannot.
    assert [row.source_line for row in kept.collect()] == [1, 2, 3]


def test_the_stream_raises_each_alert_once_across_micro_batches(spark, settings) -> None:
    settings = settings.replace(alert_clicks_per_minute=3)
    ensure_table(spark, settings, bronze.TABLE)

    def land(lines: list[str], batch: int) -> None:
        bronze_frame(spark, lines, ingested_at=INGESTED + timedelta(seconds=batch),
                     file_name=f"batch-{batch}.jsonl"
                     ).write.format("delta").mode("append").save(bronze.TABLE.path(settings))

    # One continuous run, as a driver runs it: a minute that grows again is emitted again by
    # Spark's update mode, and the run itself must know it raised it already.
    query = alerts.start(spark, settings, {"processingTime": "5 seconds"})
    try:
        # Batch 0: three clicks of 10.0.0.1 in 11:59, a fourth delivered twice (one event),
        # and invalid ones: at the limit, nothing to raise.
        land([click("a1"), click("a2", second=5), click("a3", second=9),
              click("a2", second=5), click("bad", ad_id=None), click("bad2", event_type="nope")],
             0)
        query.processAllAvailable()
        assert read_table(spark, settings, alerts.TABLE).count() == 0
        # Batch 1: the fourth distinct click: one alert, with the count then.
        land([click("a4", second=30)], 1)
        query.processAllAvailable()
        [raised] = read_table(spark, settings, alerts.TABLE).collect()
        assert (raised.ip_address, raised.clicks, raised.window_start) == (
            "10.0.0.1", 4, MINUTE)
        # Batch 2: the minute grows to five (not raised again) and 10.0.0.9 goes over in
        # 12:00.
        land([click("a5", second=40)]
             + [click(f"z{n}", ip="10.0.0.9", second=60 + n) for n in range(4)], 2)
        query.processAllAvailable()
    finally:
        query.stop()
    rows = {row.ip_address: row for row in read_table(spark, settings, alerts.TABLE).collect()}
    assert sorted(rows) == ["10.0.0.1", "10.0.0.9"]  # one row each
    assert rows["10.0.0.1"] == raised  # as raised first: same count, same batch time
    assert rows["10.0.0.9"].window_start == MINUTE + timedelta(minutes=1)

    # The batch recomputation over silver names the same minutes (its counts are the final
    # ones: 5 for 10.0.0.1, which the stream raised at 4).
    streaming.catch_up(spark, settings, ["silver"])
    recomputed = alerts.from_silver(read_table(spark, settings, silver.TABLE), settings)
    assert ({row.alert_id for row in recomputed.collect()} == {row.alert_id
            for row in rows.values()})


def test_a_bot_raises_its_alert_nobody_else_does_and_a_reset_raises_it_again(spark, tmp_path
                                                                          ) -> None:
    from spark_jobs.generator import FRAUD_ADDRESS
    from tests.conftest import make_settings
    from tests.processes import generate

    settings = make_settings(tmp_path / "lake")
    # Every event at one instant (no --span): the bot's ~280 clicks share its minute, while
    # 2,000 events over 65,536 other addresses put none of them near the limit of 100.
    generate(settings.root, "--events", "2000", "--click-fraud", "0.15", "--seed", "5",
             "--start", "2026-11-22T11:59:30Z")
    streaming.catch_up(spark, settings, ["bronze", "silver", "ops"])
    [raised] = read_table(spark, settings, alerts.TABLE).collect()
    bot_clicks = (read_table(spark, settings, silver.TABLE)
                  .where(f"ip_address = '{FRAUD_ADDRESS}' AND event_type = 'click'").count())
    # One batch saw them all: the count raised is every distinct click silver kept.
    assert (raised.ip_address, raised.clicks, raised.window_start) == (
        FRAUD_ADDRESS, bot_clicks, MINUTE)
    assert bot_clicks > 200
    assert [row.alert_id for row in alerts.from_silver(
        read_table(spark, settings, silver.TABLE), settings).collect()] == [raised.alert_id]
    # A reset of the alert path replays it from its source (bronze here): the same alert,
    # raised again, and nothing else rebuilt.
    from spark_jobs import reset

    outcome = reset.reset(spark, settings, "ops")
    assert (outcome.layers, outcome.rows, outcome.event_dates) == (
        ("ops",), {"ops.alerts": 1}, None)
    [again] = read_table(spark, settings, alerts.TABLE).collect()
    assert (again.alert_id, again.clicks) == (raised.alert_id, raised.clicks)
