"""Maintenance beside live streams: nothing fails, nothing is lost or doubled, and every
table stays readable by another Delta reader."""

import json
import os
import shutil
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from spark_jobs import delta_reader
from spark_jobs.audit import account
from spark_jobs.maintenance import (
    TABLES,
    MaintenanceError,
    maintain,
    minimum_retention,
)
from spark_jobs.ops import maintenance_history
from tests.conftest import make_settings
from tests.processes import generate, run_lakehouse, start_stream, wait_for

pytestmark = pytest.mark.integration


@pytest.mark.timeout(900)
def test_optimize_and_vacuum_beside_the_live_streams(spark, tmp_path) -> None:
    root = tmp_path / "lake"
    settings = make_settings(root)
    # The corpus is generated aside and released file by file, so maintenance runs while
    # the streams carry new data through every layer.
    staging = make_settings(tmp_path / "staging")
    delivered = generate(staging.root, "--events", "800", "--events-per-file", "400",
                         "--seed", "8")["delivered"]
    shutil.copytree(staging.landing_campaigns, settings.landing_campaigns)
    shutil.copy(staging.expected_counts_file, settings.expected_counts_file)
    pending = sorted(staging.landing_events.iterdir())
    settings.landing_events.mkdir(parents=True)
    stream = start_stream(root, "all", "--trigger", "1s", files_per_batch=1)
    try:
        # Every table a stream writes (maintenance creates the others it finds missing).
        wait_for(lambda: all((settings.tables_dir / spec.relative_path / "_delta_log")
                             .exists() for spec in TABLES.values() if spec.stream),
                 "the streams never created their tables")
        # The first file is released right before the round, so OPTIMIZE and VACUUM run
        # while every layer's stream commits it; the second follows while they still run.
        first, second = pending
        first.replace(settings.landing_events / first.name)  # atomic rename
        maintain(spark, settings, list(TABLES), run_optimize=True, run_vacuum=True,
                 retention=None, dry_run=False)
        second.replace(settings.landing_events / second.name)
        assert stream.poll() is None, stream.log()[-3000:]

        def accounted() -> bool:
            # Bronze holds every delivery and each is in silver, quarantine or counted as a
            # duplicate.
            progress = account(spark, settings)
            return progress.delivered == delivered and progress.identity_holds

        wait_for(accounted, "the streams never carried every delivery through", timeout=300)
    finally:
        stopped = run_lakehouse("stop", "--root", str(root), "--wait", "400", timeout=500)
    assert stopped.returncode == 0, stopped.stderr
    # No stream query failed: a failure would have ended the driver with status 1.
    assert stream.wait(timeout=120) == 0, stream.log()[-3000:]

    audit = account(spark, settings, settings.expected_counts_file)
    assert audit.identity_holds and audit.matches_expected, audit.as_json()
    history = spark.read.format("delta").load(maintenance_history.TABLE.path(settings))
    assert history.where("operation = 'optimize'").count() == len(TABLES)
    assert history.where("operation = 'vacuum'").count() == len(TABLES)

    # delta-rs reads every table after maintenance, to the same row count as Spark.
    for spec in TABLES.values():
        path = spec.path(settings)
        rows = delta_reader.read_arrow(path).num_rows
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


def test_the_vacuum_floor_keeps_what_a_stream_far_behind_has_yet_to_read(spark, tmp_path
                                                                        ) -> None:
    """Found beside the chaos battery's kills: a stream that runs a batch every few seconds
    but reads its source far behind needs files that OPTIMIZE removed long ago. The floor
    counts the age of the oldest source commit a stream has not fully read."""
    settings = make_settings(tmp_path / "lake", time_travel_window="0 seconds",
                             vacuum_safety_margin="1 minute")
    source = TABLES["bronze.ad_events"]
    for _ in range(3):  # versions 0, 1, 2 (the floor reads only the source's history)
        spark.range(1).write.format("delta").mode("append").save(source.path(settings))
    commits = sorted((Path(source.path(settings)) / "_delta_log").glob("*.json"))
    assert len(commits) == 3
    three_days_ago = time.time() - 3 * 86400
    for commit in commits:  # committed three days ago
        os.utime(commit, (three_days_ago, three_days_ago))

    def silver_stream_has_read(up_to_version: int) -> None:
        checkpoint = Path(settings.checkpoint("silver_ad_events"))
        for folder in ("offsets", "commits"):
            (checkpoint / folder).mkdir(parents=True, exist_ok=True)
        offset = {"sourceVersion": 1, "reservoirVersion": up_to_version, "index": -1,
                  "isStartingVersion": False}
        (checkpoint / "offsets" / "0").write_text(f"v1\n{{}}\n{json.dumps(offset)}")
        (checkpoint / "commits" / "0").write_text("v1\n{}")

    # Version 2 unread: its three-day-old files must stay, plus the margin. (Delta keeps
    # equal commit times apart by a millisecond each: version 2 is 2 ms younger.)
    silver_stream_has_read(2)
    floor = minimum_retention(spark, settings)
    assert timedelta(days=3, seconds=59) <= floor < timedelta(days=3, minutes=5)
    # Everything read: no stream needs an old file. The floor is still the margin, though the
    # time-travel window is none: VACUUM deletes files no commit names yet, such as those a
    # write under way has written (found by the chaos battery: at retention 0, a bronze
    # batch's file went before its commit named it).
    silver_stream_has_read(3)
    assert minimum_retention(spark, settings) == timedelta(minutes=1)


def test_a_vacuum_under_an_hour_keeps_the_files_it_must(spark, tmp_path) -> None:
    """Delta counts a retention in whole hours, rounded: a five-minute floor became 0 and the
    VACUUM deleted every file OPTIMIZE had just removed (found by the chaos battery, whose
    streams, behind, still had to read them)."""
    settings = make_settings(tmp_path / "lake", time_travel_window="0 seconds",
                             vacuum_safety_margin="5 minutes")
    spec = TABLES["gold.ad_attribution"]
    for _ in range(2):  # small files, then compacted: all removed a moment ago
        spark.range(1).selectExpr(*[f"CAST(NULL AS {field.dataType.simpleString()}) AS "
                                    f"{field.name}" for field in spec.schema.fields]
                                  ).write.format("delta").mode("append").save(
                                      spec.path(settings))
    written = set(Path(spec.path(settings)).rglob("*.parquet"))
    [compacted, vacuumed] = maintain(spark, settings, [spec.name], run_optimize=True,
                                     run_vacuum=True, retention=None, dry_run=False)
    assert compacted.files_before > compacted.files_after  # files removed from the table
    on_disk = set(Path(spec.path(settings)).rglob("*.parquet"))
    # Removed less than the floor ago, they are all still on disk, beside the compacted one.
    assert written < on_disk, (sorted(written - on_disk), vacuumed.detail)


def test_vacuum_lists_a_small_table_with_a_few_tasks(spark, settings) -> None:
    """VACUUM lists a table with Spark's file-listing parallelism as its tasks, in each of
    its passes. Spark's default, 10,000 tasks, made a VACUUM of a table of a few files take
    minutes on two cores; the project's setting is a handful."""
    spec = TABLES["silver.quarantine"]
    spark.createDataFrame([], spec.schema).write.format("delta").save(spec.path(settings))
    group = f"vacuum-{uuid.uuid4().hex}"
    spark.sparkContext.setJobGroup(group, "the VACUUM under test")
    try:
        maintain(spark, settings, [spec.name], run_optimize=False, run_vacuum=True,
                 retention=None, dry_run=False)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    tracker = spark.sparkContext.statusTracker()
    stages = [stage for job in tracker.getJobIdsForGroup(group)
              for stage in tracker.getJobInfo(job).stageIds]
    tasks = sum(info.numTasks for info in map(tracker.getStageInfo, stages) if info)
    assert stages, "the VACUUM ran no Spark job in its group"
    # A dozen stages of at most file_listing_parallelism (8) or shuffle_partitions (2)
    # tasks each; with Spark's default the listing alone is 10,000 a pass.
    assert tasks <= 8 * len(stages), (len(stages), tasks)


def test_cli_refuses_unknown_tables(tmp_path) -> None:
    refused = run_lakehouse("maintain", "--root", str(tmp_path), "--tables", "gold.nope")
    assert refused.returncode == 2 and "unknown table(s) gold.nope" in refused.stderr
