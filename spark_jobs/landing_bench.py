"""``make bench``'s landing part: what a bronze trigger pays for the files the landing zone
keeps, with ingested files archived (``landing_cleanup = "archive"``, the default) and
left in place (``"off"``), side by side.

Spark's file source lists the whole landing folder at every trigger. Per mode, bronze runs
as a stream (a 1-second trigger), first over ``files`` small files in one batch (a feed of
one file a second leaves 10,000 in under three hours), then over one new file at a time;
when archiving, the first of those batches is the one whose planning moves the seeded files
away, so the measured batches are the ones after it. Measured, from each batch's progress:
Spark's ``latestOffset`` phase (the listing) and the whole trigger.
"""

from __future__ import annotations

import shutil
import statistics
import time
from typing import Any

from pyspark.sql import SparkSession

from spark_jobs.bronze import ad_events as bronze
from spark_jobs.config import Settings
from spark_jobs.storage import write_atomically

MODES = ("archive", "off")
RECORD = b'{"event_id":"e","event_time":"2026-11-27T00:00:00Z","event_type":"view","ad_id":"a"}\n'
TIMEOUT_SECONDS = 600


def _data_batches(query: Any) -> list[dict[str, Any]]:
    return [progress for progress in query.recentProgress if progress["numInputRows"]]


def _wait_for_batches(query: Any, count: int) -> None:
    deadline = time.monotonic() + TIMEOUT_SECONDS
    while len(_data_batches(query)) < count:
        if query.exception() is not None:
            raise RuntimeError(f"bronze failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"bronze ran {len(_data_batches(query))} of {count} batches "
                               f"in {TIMEOUT_SECONDS} s")
        time.sleep(0.2)


def _triggers(spark: SparkSession, settings: Settings, files: int, measured: int
              ) -> list[dict[str, int]]:
    """The phases (milliseconds) of ``measured`` one-file batches after ``files`` files."""
    shutil.rmtree(settings.root, ignore_errors=True)
    for number in range(files):
        write_atomically(settings.landing_events, f"seed-{number:06d}.jsonl", RECORD)
    query = bronze.start(spark, settings, {"processingTime": "1 second"})
    try:
        _wait_for_batches(query, 1)
        for number in range(measured + 1):
            write_atomically(settings.landing_events, f"new-{number:03d}.jsonl", RECORD)
            _wait_for_batches(query, number + 2)
        batches = _data_batches(query)
    finally:
        query.stop()
    return [batch["durationMs"] for batch in batches[2:]]


def run(spark: SparkSession, settings: Settings, files: int, measured: int = 5
        ) -> dict[str, Any]:
    results: dict[str, Any] = {"files_before": files, "batches_measured": measured}
    for mode in MODES:
        # One batch holds every seeded file; recentProgress keeps the last 100 batches.
        each = settings.replace(root=settings.root / mode, landing_cleanup=mode,
                                max_files_per_trigger=files)
        phases = _triggers(spark, each, files, measured)
        results[mode] = {
            f"{phase}_seconds": round(statistics.median(p.get(phase, 0) for p in phases)
                                      / 1000, 2)
            for phase in ("latestOffset", "triggerExecution")}
        results[mode]["files_left_in_landing"] = sum(
            1 for _ in each.landing_events.glob("*.jsonl"))
    return results


def render(results: dict[str, Any]) -> str:
    lines = [f"a bronze trigger after {results['files_before']:,} files (median of "
             f"{results['batches_measured']} one-file batches, seconds)",
             f"{'landing_cleanup':<18}{'listing':>10}{'trigger':>10}{'files left':>12}"]
    for mode in MODES:
        shown = results[mode]
        lines.append(f"{mode:<18}{shown['latestOffset_seconds']:>10.2f}"
                     f"{shown['triggerExecution_seconds']:>10.2f}"
                     f"{shown['files_left_in_landing']:>12,}")
    return "\n".join(lines)
