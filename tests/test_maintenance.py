"""Maintenance beside live streams: nothing fails, nothing is lost or doubled, and every
table stays readable by another Delta reader."""

import threading
from datetime import timedelta

import pytest
from deltalake import DeltaTable as RustDeltaTable

from spark_jobs import streaming
from spark_jobs.audit import account
from spark_jobs.maintenance import HISTORY, TABLES, MaintenanceError, maintain
from tests.conftest import make_settings
from tests.processes import generate, run_lakehouse, wait_for

pytestmark = pytest.mark.integration


def test_optimize_and_vacuum_in_a_loop_beside_the_live_streams(spark, tmp_path) -> None:
    # The streams run in this process's Spark (one JVM, not two, on a 2-core machine) in a
    # thread of their own: their commits and maintenance's are still separate, concurrent
    # Delta transactions on the same tables.
    root = tmp_path / "lake"
    settings = make_settings(root, max_files_per_trigger=1)
    delivered = generate(root, "--events", "1000", "--events-per-file", "100",
                         "--seed", "8")["delivered"]
    stop, failures = threading.Event(), []

    def run_streams() -> None:
        try:
            streaming.run_continuously(spark, settings, list(streaming.LAYERS), "1 second",
                                       stop)
        except Exception as failure:  # a failed query is the test's verdict, reported below
            failures.append(failure)

    streams = threading.Thread(target=run_streams, name="streams")
    streams.start()
    rounds = 0
    try:
        wait_for(lambda: all((settings.tables_dir / spec.relative_path / "_delta_log")
                             .exists() for spec in TABLES.values()) or failures,
                 "the streams never created the tables")
        while not failures:
            maintain(spark, settings, list(TABLES), run_optimize=True, run_vacuum=True,
                     retention=None, dry_run=False)
            rounds += 1
            # Done once bronze holds every delivery and each is in silver, quarantine or
            # counted as a duplicate.
            progress = account(spark, settings)
            if progress.delivered == delivered and progress.identity_holds:
                break
    finally:
        stop.set()
        streams.join(timeout=300)
    assert not streams.is_alive(), "the streams did not stop"
    assert failures == [], failures  # no stream query failed
    assert rounds >= 2, "the streams finished before maintenance ran beside them"

    audit = account(spark, settings, settings.expected_counts_file)
    assert audit.identity_holds and audit.matches_expected, audit.as_json()
    history = spark.read.format("delta").load(HISTORY.path(settings))
    assert history.where("operation = 'optimize'").count() >= 2 * len(TABLES)

    # delta-rs reads every table after maintenance, to the same row count as Spark.
    for spec in TABLES.values():
        path = spec.path(settings)
        rows = RustDeltaTable(path).to_pyarrow_table().num_rows
        assert rows == spark.read.format("delta").load(path).count(), spec.name


def test_an_unsafe_vacuum_is_refused_and_a_dry_run_changes_nothing(spark, settings) -> None:
    with pytest.raises(MaintenanceError, match="refusing VACUUM with retention 1:00:00"):
        maintain(spark, settings, ["silver.ad_events"], run_optimize=False, run_vacuum=True,
                 retention=timedelta(hours=1), dry_run=False)

    spec = TABLES["gold.campaign_stats"]
    for day in range(3):  # three appends: three small files to compact
        spark.createDataFrame([("c-1", f"2026-11-2{day} 10:00:00", f"2026-11-2{day} 10:01:00",
                                1, 0, 0, 0)],
                              "campaign_id string, window_start string, window_end string, "
                              "views long, clicks long, purchases long, revenue int"
                              ).selectExpr("campaign_id", "timestamp(window_start) window_start",
                                           "timestamp(window_end) window_end", "views",
                                           "clicks", "purchases",
                                           "cast(revenue as decimal(18,2)) revenue") \
            .write.format("delta").mode("append").save(spec.path(settings))
    [dry] = maintain(spark, settings, [spec.name], run_optimize=True, run_vacuum=False,
                     retention=None, dry_run=True)
    assert (dry.files_before, dry.files_after) == (3, 3)
    [done] = maintain(spark, settings, [spec.name], run_optimize=True, run_vacuum=False,
                      retention=None, dry_run=False)
    assert (done.files_before, done.files_after) == (3, 1)


def test_cli_refuses_unknown_tables(tmp_path) -> None:
    refused = run_lakehouse("maintain", "--root", str(tmp_path), "--tables", "gold.nope")
    assert refused.returncode == 2 and "unknown table(s) gold.nope" in refused.stderr
