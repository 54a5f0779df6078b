"""``make bench``'s declarative part: the lakehouse against the plain pipeline a Spark user
would write with Spark's own declarative pipelines, side by side, in speed and exactness.

The plain pipeline (``bench/declarative/``: bronze as text, silver parsed, filtered and
deduplicated within a watermark, gold as a materialized view of per-campaign minutes) and
``lakehouse stream --available-now`` each run as the cold command a user starts
(``spark-pipelines run``; ``lakehouse stream``), in interleaved repetitions, on fresh roots
holding the same messy corpus, with the project's own Spark settings and one micro-batch per
layer for both. Each run's wall time is what the user waits for, JVM start included. Then
both results are compared with the generator's promise (``expected_counts.json``): records
landed in bronze, events in silver (the distinct valid ones, exactly once), rejected
records accounted for, and gold's event counts.
"""

from __future__ import annotations

import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

from spark_jobs import delta_reader, registry
from spark_jobs.config import LOOPBACK, PROJECT_DIR, Settings, console_script, in_checkout
from spark_jobs.expected_counts import ExpectedCounts
from spark_jobs.session import spark_conf

PIPELINE = PROJECT_DIR / "bench" / "declarative"
COUNTED = ("views", "clicks", "purchases")
TIMEOUT_SECONDS = 1800


def run(settings: Settings, corpus: Path, scratch: Path, repetitions: int) -> dict[str, Any]:
    """Both pipelines over ``corpus`` (a generated landing zone: ``events/``, ``campaigns/``
    and ``expected_counts.json``), ``repetitions`` times each, alternating."""
    if not in_checkout():
        raise FileNotFoundError("the declarative part runs from the project's checkout, "
                                f"where its pipeline is ({PIPELINE})")
    expected = ExpectedCounts.load(corpus / "expected_counts.json")
    seconds: dict[str, list[float]] = {"lakehouse": [], "plain": []}
    roots: dict[str, Path] = {}
    for repetition in range(repetitions):
        for name, runner in (("plain", _run_plain), ("lakehouse", _run_lakehouse)):
            root = scratch / f"{name}-{repetition}"
            shutil.rmtree(root, ignore_errors=True)
            _land(corpus, root / "landing")
            seconds[name].append(runner(settings, root))
            if repetition:  # the first repetition's tables are the ones compared
                shutil.rmtree(root, ignore_errors=True)
            else:
                roots[name] = root
    medians = {name: statistics.median(times) for name, times in seconds.items()}
    return {
        "records": expected.delivered, "repetitions": repetitions,
        "seconds": {name: [round(s, 1) for s in times] for name, times in seconds.items()},
        "median_seconds": {name: round(m, 1) for name, m in medians.items()},
        "records_per_second": {name: round(expected.delivered / m) for name, m in medians.items()},
        # Above 1: the lakehouse is faster than the plain pipeline.
        "lakehouse_speed_vs_plain": round(medians["plain"] / medians["lakehouse"], 2),
        "exactness": _exactness(expected, settings, roots["lakehouse"], roots["plain"]),
    }


def _land(corpus: Path, landing: Path) -> None:
    """The corpus as a fresh landing zone, by hard links: no copy, and nothing either
    pipeline does can change the corpus the next repetition lands."""
    for folder in ("events", "campaigns"):
        shutil.copytree(corpus / folder, landing / folder, copy_function=os.link)
    shutil.copy(corpus / "expected_counts.json", landing / "expected_counts.json")


def _timed(command: list[str], env: dict[str, str], cwd: Path, log: Path) -> float:
    started = time.perf_counter()
    with log.open("w") as out:
        finished = subprocess.run(command, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=TIMEOUT_SECONDS, check=False)
    elapsed = time.perf_counter() - started
    if finished.returncode:
        raise RuntimeError(f"{' '.join(command[:3])} failed (exit {finished.returncode}); "
                           f"its output is in {log}")
    return elapsed


def _run_lakehouse(settings: Settings, root: Path) -> float:
    env = {**os.environ, "LAKEHOUSE_MAX_FILES_PER_TRIGGER": "100000"}
    return _timed([console_script("lakehouse"), "stream", "--root", str(root),
                   "--available-now"], env, root, root / "lakehouse.log")


def _run_plain(settings: Settings, root: Path) -> float:
    """``spark-pipelines run`` with the project's Spark settings. Its Spark Connect server
    runs in a JVM of its own, which takes its settings (the Delta jars among them) from
    ``PYSPARK_SUBMIT_ARGS``, and listens on loopback."""
    conf = spark_conf(settings.replace(root=root)) | {
        "spark.connect.grpc.binding.address": LOOPBACK,
        # The same JIT flag; not the project's class archive, built for its own class path.
        "spark.driver.extraJavaOptions": settings.spark_java_options}
    jars = conf.pop("spark.jars", None)  # none for a local master (its class path)
    submit = [*(["--jars", jars] if jars else []), *(arg for key, value in conf.items()
                                for arg in ("--conf", f"{key}={value}"))]
    (root / "transformations").symlink_to(PIPELINE / "transformations")
    (root / "spark-pipeline.yml").write_text(
        "name: plain_ad_events\n"
        f"storage: file://{root}/storage\n"
        "libraries:\n  - glob:\n      include: transformations/**\n"
        f"configuration:\n  plain.landing: {root}/landing\n", encoding="utf-8")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": LOOPBACK,
           "PYSPARK_SUBMIT_ARGS": shlex.join([*submit, "pyspark-shell"])}
    return _timed([console_script("spark-pipelines"), *submit, "run", "--spec",
                   str(root / "spark-pipeline.yml")], env, root, root / "plain.log")


def _exactness(expected: ExpectedCounts, settings: Settings, lakehouse: Path, plain: Path
               ) -> dict[str, dict[str, int]]:
    """Each pipeline's tables against the generator's promise."""
    ours = settings.replace(root=lakehouse)

    def path(table: str) -> str:
        return registry.TABLES[table].path(ours)

    def warehouse(table: str) -> Path:
        return plain / "warehouse" / table

    valid_ids = _ids(path("silver.ad_events"))  # exact: make test's audits prove it
    return {
        "lakehouse": _counts(expected, valid_ids, path("bronze.ad_events"),
                             path("silver.ad_events"), path("silver.quarantine"),
                             path("gold.campaign_stats")),
        "plain": _counts(expected, valid_ids, warehouse("bronze_ad_events"),
                         warehouse("silver_ad_events"), None, warehouse("gold_campaign_stats")),
    }


def _ids(table: str | Path) -> set[str]:
    return set(delta_reader.read_arrow(table, ["event_id"]).column("event_id").to_pylist())


def _counts(expected: ExpectedCounts, valid_ids: set[str], bronze: str | Path,
            silver: str | Path, quarantine: str | Path | None, gold: str | Path
            ) -> dict[str, int]:
    silver_ids = delta_reader.read_arrow(silver, ["event_id"]).column("event_id")
    distinct = set(silver_ids.to_pylist())
    gold_table = delta_reader.read_arrow(gold, list(COUNTED))
    return {
        "bronze_rows": delta_reader.count_rows(bronze),
        "expected_bronze_rows": expected.delivered,
        "silver_rows": len(silver_ids),
        "expected_silver_rows": expected.valid_distinct,
        # An event in silver twice: a redelivery the deduplication let through.
        "silver_duplicate_rows": len(silver_ids) - len(distinct),
        # An event id in silver that the contract rejects (or a record without one).
        "silver_invalid_events": len(distinct - valid_ids),
        "valid_events_missing": len(valid_ids - distinct),
        "quarantined_rows": delta_reader.count_rows(quarantine) if quarantine else 0,
        "expected_quarantined_rows": expected.invalid,
        "gold_events_counted": sum(int(pc.sum(gold_table.column(name)).as_py() or 0)
                                   for name in COUNTED),
    }


def render(results: dict[str, Any]) -> str:
    medians, rates = results["median_seconds"], results["records_per_second"]
    lines = [f"{results['records']:,} records, median of {results['repetitions']}: the "
             f"lakehouse at {results['lakehouse_speed_vs_plain']}x the plain declarative "
             "pipeline's speed",
             f"{'':<28}{'lakehouse':>12}{'plain':>12}",
             f"{'wall seconds (cold command)':<28}{medians['lakehouse']:>12}"
             f"{medians['plain']:>12}",
             f"{'records per second':<28}{rates['lakehouse']:>12,}{rates['plain']:>12,}"]
    ours, plain = results["exactness"]["lakehouse"], results["exactness"]["plain"]
    for key in ("bronze_rows", "silver_rows", "silver_duplicate_rows", "silver_invalid_events",
                "valid_events_missing", "quarantined_rows", "gold_events_counted"):
        lines.append(f"{key.replace('_', ' '):<28}{ours[key]:>12,}{plain[key]:>12,}")
    lines.append(f"expected: bronze {ours['expected_bronze_rows']:,}, silver "
                 f"{ours['expected_silver_rows']:,}, quarantined "
                 f"{ours['expected_quarantined_rows']:,}")
    return "\n".join(lines)
