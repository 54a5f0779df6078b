"""Changes across restarts: an allowed change resumes, one the state cannot carry is refused
with the runbook, and the runbook (``lakehouse reset``) rebuilds the layer exactly."""

import json
import subprocess
from datetime import datetime

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from spark_jobs import checkpoints, reprocess, streaming
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.gold import ad_attribution, campaign_stats
from spark_jobs.ops import late_data
from spark_jobs.ops.leases import LeaseHeld, leases
from spark_jobs.reset import adopt_first_deliveries, reset
from spark_jobs.silver import ad_campaigns, quarantine
from spark_jobs.silver import ad_events as silver
from spark_jobs.storage import write_atomically
from tests.conftest import cli_env, lakehouse_command, make_settings

pytestmark = pytest.mark.integration


def event(event_id: str, when: str, kind: str, ad: str = "ad-1", user: str = "u-1") -> str:
    return json.dumps({"event_id": event_id, "event_time": when, "event_type": kind,
                       "ad_id": ad, "user_id": user})


# One file per micro-batch (max_files_per_trigger = 1), so gold's watermark moves between
# them: the third file's view at 08:30 comes after the watermark passed 11:50, so the
# stream leaves it to the ledger, and only a rebuild counts it.
FILES = {
    "1.jsonl": [event("v1", "2026-11-20T09:00:00Z", "view"),
                # 40 minutes after v1: attributed to it under a 1-hour bound, not 30 minutes.
                event("c1", "2026-11-20T09:40:00Z", "click"),
                "{not json"],
    "2.jsonl": [event("v2", "2026-11-20T12:00:00Z", "view", ad="ad-2"),
                event("v1", "2026-11-20T09:00:00Z", "view")],  # a redelivery, a batch later
    "3.jsonl": [event("late", "2026-11-20T08:30:00Z", "view")],
}


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    """One lake for the module's tests, which run in order: each leaves it as the next
    expects (the first ends with gold under a 30-minute bound; the silver reset restores
    the configured one)."""
    settings = make_settings(tmp_path_factory.mktemp("reset") / "lake", max_files_per_trigger=1)
    write_atomically(settings.landing_campaigns, "campaigns.jsonl", "".join(
        json.dumps({"ad_id": ad, "campaign_id": campaign,
                    "valid_from": "2026-01-01T00:00:00Z"}) + "\n"
        for ad, campaign in (("ad-1", "c-1"), ("ad-2", "c-2"))).encode())
    for name, lines in FILES.items():
        write_atomically(settings.landing_events, name, "\n".join(lines).encode())
    streaming.run_available_now(spark, settings, list(streaming.LAYERS))
    return settings


def read(spark, settings, spec):
    return spark.read.format("delta").load(spec.path(settings))


def differences(actual, expected) -> int:
    return actual.exceptAll(expected).count() + expected.exceptAll(actual).count()


def gold_equals_batch(spark, settings) -> bool:
    events = read(spark, settings, silver.TABLE)
    stats = campaign_stats.campaign_stats(events, read(spark, settings, ad_campaigns.TABLE),
                                          settings.window_duration)
    attribution = ad_attribution.ad_attribution(events, settings.attribution_max_gap)
    return (differences(read(spark, settings, campaign_stats.TABLE), stats) == 0
            and differences(read(spark, settings, ad_attribution.TABLE), attribution) == 0)


def test_a_changed_join_bound_is_refused_and_reset_rebuilds_gold_exactly(spark, lake,
                                                                         monkeypatch) -> None:
    # As streamed: c1 attributed to v1 (40 minutes, within the 1-hour bound), and the late
    # view in the ledger, not in gold: gold is short of the batch by it (campaign stats and
    # the sessions each count it once).
    assert [r.view_event_id for r in read(spark, lake, ad_attribution.TABLE).collect()] == ["v1"]
    assert {r.layer: r.n for r in read(spark, lake, late_data.TABLE).groupBy("layer")
            .agg(F.sum("late_rows").alias("n")).collect()} == {"gold.campaign_stats": 1,
                                                               "gold.user_sessions": 1}
    assert not gold_equals_batch(spark, lake)

    # Allowed: another rate limit and trigger, and the same bound spelled otherwise, resume
    # from the checkpoint.
    streaming.run_available_now(spark, lake.replace(
        max_files_per_trigger=5, trigger_interval="7 seconds",
        attribution_max_gap="60 minutes"), ["gold"])

    # Not allowed: a shorter join bound, refused before any batch, naming the runbook.
    shorter = lake.replace(attribution_max_gap="30 minutes")
    with pytest.raises(checkpoints.CheckpointIncompatible,
                       match=r"attribution_max_gap = '1 hour' \(now '30 minutes'\).*"
                             r"lakehouse reset gold"):
        streaming.run_available_now(spark, shorter, ["gold"])

    # The runbook waits for no running stream: a driver streaming gold keeps it out.
    with leases(lake, ["gold"]), pytest.raises(LeaseHeld, match="gold stream is already"):
        reset(spark, shorter, "gold")

    # A reset interrupted half-way (here its last step, gold's rebuild, fails) keeps the
    # layer's streams shut, and reprocessing out, until it is run again.
    def interrupted(*_args, **_kwargs):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(reprocess, "rebuild_gold", interrupted)
    with pytest.raises(RuntimeError, match="interrupted"):
        reset(spark, shorter, "gold")
    monkeypatch.undo()
    marker = checkpoints.reset_marker(lake, "gold")
    with pytest.raises(checkpoints.CheckpointIncompatible,
                       match=r"gold is being reset \('lakehouse reset gold', started .*"
                             r"run 'lakehouse reset gold' again"):
        streaming.run_available_now(spark, shorter, ["gold"])

    outcome = reset(spark, shorter, "gold")
    assert not marker.exists()
    # c1 has no view within 30 minutes: no attribution; the late view is counted now, so
    # gold equals the batch recomputation under the new bound, row for row.
    assert outcome.layers == ("gold",) and outcome.event_dates == ("2026-11-20", "2026-11-20")
    assert outcome.rows["gold.ad_attribution"] == 0
    assert gold_equals_batch(spark, shorter)
    views = {r.window_start: r.views for r in read(spark, shorter, campaign_stats.TABLE)
             .where("campaign_id = 'c-1'").collect()}
    # v1 once (its redelivery is a duplicate), c1's window without a view, and the late
    # view in its own window.
    assert views == {datetime(2026, 11, 20, 9, 0): 1, datetime(2026, 11, 20, 9, 40): 0,
                     datetime(2026, 11, 20, 8, 30): 1}
    # The streams resume under the new bound; the old one is now the refused change.
    streaming.run_available_now(spark, shorter, ["gold"])
    with pytest.raises(checkpoints.CheckpointIncompatible, match="now '1 hour'"):
        streaming.run_available_now(spark, lake, ["gold"])


def test_resetting_silver_rebuilds_it_and_gold_as_they_were(spark, lake) -> None:
    def rows(spec, *dropped: str) -> list[str]:
        return sorted(json.dumps(row.asDict(), default=str, sort_keys=True)
                      for row in read(spark, lake, spec).drop(*dropped).collect())

    silver_before = rows(silver.TABLE)
    # Whatever order a replay reads bronze in (OPTIMIZE rewrites old records into new
    # files), each event's row ends as its first delivery: here v1's row is made to look
    # like its redelivery's, and the reset's last silver step puts the first one back.
    first = read(spark, lake, silver.TABLE).where("event_id = 'v1'").first()
    redelivery = read(spark, lake, bronze.TABLE).where(
        "raw LIKE '%\"v1\"%' AND source_file LIKE '%2.jsonl'").first()
    DeltaTable.forPath(spark, silver.TABLE.path(lake)).update(
        "event_id = 'v1'", {"bronze_id": F.lit(redelivery.bronze_id),
                            "ingested_at": F.lit(redelivery.ingested_at)})
    adopt_first_deliveries(spark, lake)
    assert read(spark, lake, silver.TABLE).where("event_id = 'v1'").first() == first

    # When a record was quarantined is the one thing a replay changes.
    quarantine_before = rows(quarantine.TABLE, "quarantined_at")
    outcome = reset(spark, lake, "silver")
    assert outcome.layers == ("silver", "gold")
    # Every event again from its first delivery, the same records refused, gold exact.
    assert rows(silver.TABLE) == silver_before and len(silver_before) == 4
    assert rows(quarantine.TABLE, "quarantined_at") == quarantine_before
    assert len(quarantine_before) == 1
    assert gold_equals_batch(spark, lake)


def test_a_changed_join_key_is_refused_by_spark_with_the_runbook(spark, lake,
                                                                  monkeypatch) -> None:
    # A new view, so that gold runs a batch, which loads the join's state.
    write_atomically(lake.landing_events, "4.jsonl",
                     event("v4", "2026-11-20T12:30:00Z", "view").encode())
    streaming.run_available_now(spark, lake, ["bronze", "silver"])

    def by_user_only(click_rows, view_rows, max_gap):
        return click_rows.join(view_rows, F.expr(
            "click_user_id = view_user_id AND view_time <= click_time "
            f"AND view_time >= click_time - INTERVAL {max_gap}"), "inner")

    # The join's key as the code now writes it (user) is not the one its state holds
    # (user and ad): Spark refuses the state, and the error says what to do.
    monkeypatch.setattr(ad_attribution, "candidate_views", by_user_only)
    with pytest.raises(streaming.StreamFailed, match=r"(?s)gold_ad_attribution failed.*"
                                                     r"lakehouse reset gold"):
        streaming.run_available_now(spark, lake, ["gold"])
    monkeypatch.undo()
    streaming.run_available_now(spark, lake, ["gold"])
    # Resumed with the join as its state knows it; v4 counted in its window.
    assert read(spark, lake, campaign_stats.TABLE).where(
        "campaign_id = 'c-1' AND window_start = '2026-11-20 12:30:00'").first().views == 1


def test_the_command_line_refuses_the_change_and_a_bronze_reset(lake) -> None:
    changed = subprocess.run(
        lakehouse_command("stream", "--root", str(lake.root), "--layers", "gold",
                          "--available-now"),
        env=cli_env(LAKEHOUSE_WINDOW_DURATION="5 minutes", LAKEHOUSE_MAX_FILES_PER_TRIGGER="1"),
        capture_output=True, text=True, timeout=300)
    assert changed.returncode == 2, changed.stderr[-3000:]
    assert ("gold_campaign_stats: its checkpoint" in changed.stderr
            and "window_duration = '1 minute' (now '5 minutes')" in changed.stderr
            and "lakehouse reset gold" in changed.stderr), changed.stderr[-3000:]
    # Refused before a JVM started (Spark prints its logging profile as one starts).
    assert "log4j" not in changed.stderr, changed.stderr[-3000:]

    # A reset under way (or interrupted) keeps reprocessing out, before any Spark starts.
    checkpoints.mark_reset(lake, "silver", "silver", "2026-11-25T22:00:00+00:00")
    try:
        refused = subprocess.run(
            lakehouse_command("reprocess", "--late", "--root", str(lake.root)),
            env=cli_env(), capture_output=True, text=True, timeout=120)
    finally:
        checkpoints.reset_marker(lake, "silver").unlink()
    assert refused.returncode == 2
    assert "silver is being reset ('lakehouse reset silver'" in refused.stderr, refused.stderr

    bronze = subprocess.run(lakehouse_command("reset", "bronze", "--root", str(lake.root)),
                            env=cli_env(), capture_output=True, text=True, timeout=60)
    assert bronze.returncode == 2
    assert "cannot reset 'bronze': choose from silver, gold" in bronze.stderr
