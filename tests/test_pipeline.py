"""The whole pipeline as real processes: every layer, many micro-batches, late events."""

import json

import pytest
from pyspark.sql import functions as F

from spark_jobs import delta_reader
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.gold import ad_attribution, campaign_stats
from spark_jobs.ops import late_data, stream_progress
from spark_jobs.silver import ad_campaigns
from spark_jobs.silver import ad_events as silver
from tests.conftest import make_settings
from tests.processes import generate, run_lakehouse, start_stream

pytestmark = pytest.mark.integration


def test_streaming_gold_equals_batch_except_the_ledger_windows(spark, tmp_path) -> None:
    root = tmp_path / "lake"
    settings = make_settings(root)
    # Late events reach days back; 4 files streamed one per micro-batch make the watermark
    # advance between batches, so some of them arrive after their window closed.
    generate(root, "--events", "2000", "--events-per-file", "500", "--seed", "5",
             "--late", "0.1")
    stream = start_stream(root, "all", "--available-now", files_per_batch=1)
    assert stream.wait(timeout=600) == 0, stream.log()[-3000:]

    def read(spec):
        return spark.read.format("delta").load(spec.path(settings))

    events, mapping = read(silver.TABLE), read(ad_campaigns.TABLE)
    batch = campaign_stats.campaign_stats(events, mapping, settings.window_duration)
    streamed = read(campaign_stats.TABLE)
    # The windows' entries (the sessions' ledger rows are by date, with no window).
    ledger = read(late_data.TABLE).where(F.col("layer") == campaign_stats.LAYER)
    assert ledger.count() > 0, "no late event beyond the watermark: the test proves nothing"

    late_windows = ledger.select("window_start").distinct()
    # Outside the ledger's windows, streaming and batch agree row for row.
    assert streamed.join(late_windows, "window_start", "left_anti").exceptAll(
        batch.join(late_windows, "window_start", "left_anti")).count() == 0
    assert batch.join(late_windows, "window_start", "left_anti").exceptAll(
        streamed.join(late_windows, "window_start", "left_anti")).count() == 0

    # In them, what streaming misses is exactly what the ledger counted.
    def events_per_window(frame):
        return frame.groupBy("window_start").agg(
            F.sum(F.col("views") + F.col("clicks") + F.col("purchases")).alias("n"))

    missing = (events_per_window(batch).alias("b")
               .join(events_per_window(streamed).alias("s"), "window_start", "left")
               .select("window_start", (F.col("b.n") - F.coalesce("s.n", F.lit(0))).alias("n"))
               .where("n > 0"))
    counted = ledger.groupBy("window_start").agg(F.sum("late_rows").alias("n"))
    assert sorted(missing.collect()) == sorted(counted.collect())

    # Attribution: every streamed row is the batch transform's. (A click or view later than
    # the watermark is dropped by the join, and counted in the progress table.)
    attributed = read(ad_attribution.TABLE)
    expected = ad_attribution.ad_attribution(events, settings.attribution_max_gap)
    assert attributed.count() > 0
    assert attributed.exceptAll(expected).count() == 0

    audit = run_lakehouse("audit", "--root", str(root), "--expected", "--json")
    assert audit.returncode == 0, audit.stdout + audit.stderr[-2000:]
    # Silver's last batch had read all of bronze, as Spark reported it (its progress row),
    # so nothing is in flight.
    in_flight = json.loads(audit.stdout)["in_flight"]
    assert in_flight == {"bronze_latest_version": delta_reader.latest_version(
        bronze.TABLE.path(settings)), "silver_read_bronze_before_version":
        in_flight["bronze_latest_version"] + 1, "silver_caught_up": True}

    # The progress table counts records: each stream read every row of its input once
    # (bronze counts lines, not files; the attribution join reads silver once per side but
    # reports it once), so the Stream health rates are rates of records.
    progress = spark.read.format("delta").load(stream_progress.TABLE.path(settings))
    read_rows = {row.query_name: row.n for row in progress.groupBy("query_name")
                 .agg(F.sum("num_input_rows").alias("n")).collect()}
    assert read_rows["bronze_ad_events"] == read(bronze.TABLE).count()
    assert read_rows["silver_ad_events"] == read(bronze.TABLE).count()
    assert read_rows["gold_campaign_stats"] == events.count()
    assert read_rows["gold_ad_attribution"] == events.count()
    # The attribution and alert streams ran no batch without data (Spark's, only to drop
    # expired state): attribution's rows equal the batch transform's above all the same
    # (the alerts' equality: tests/test_alerts.py).
    assert progress.where("query_name IN ('gold_ad_attribution', 'ops_alerts') "
                          "AND num_input_rows = 0").count() == 0
