"""The chaos battery (``lakehouse chaos``, ``make chaos``): crash the streams, lose nothing.

While a feed keeps landing messy events, the streaming driver of every layer (the process
Airflow's streaming DAG runs) is killed with SIGKILL again and again: at random moments,
wherever it happens to be, and at the crash points of ``spark_jobs.faults``, the short
windows exactly-once hinges on (the quarantine appended but nothing inserted, silver's
insert under way, gold's late-data ledger written before its MERGE, a batch written but
not in the checkpoint's commit log, a MERGE under way). Each time it is started
again as the supervisor starts it. Then the feed stops, the streams drain, and the battery
proves, against the generator's own count of what it delivered:

- bronze holds every delivered record once; silver every distinct valid event once; the
  quarantine every invalid record, reason by reason; the audit identity holds;
- streamed gold differs from a batch recomputation over silver only in the windows the
  late-data ledger names, and there by exactly the ledger's counts;
- after gold's dates are reprocessed, both gold tables equal the batch recomputation row
  for row.

One summary line: faults, records, lost, duplicated. Lost and duplicated add up every
record or count missing or extra anywhere: bronze, silver, quarantine, gold.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from spark_jobs import landing_feed, streaming
from spark_jobs.config import console_script
from spark_jobs.faults import CRASH_AT_VARIABLE, parse

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from spark_jobs.config import Settings

log = logging.getLogger(__name__)

# The faults in the order a battery deals them (cycled past its length): the named windows
# first, random kills between them. "+s" kills that long after the point, inside the work
# that follows it: silver's MERGE, gold's MERGE, the attribution join's batch.
SCHEDULE: tuple[str | None, ...] = (
    "silver_ad_events.after_quarantine",
    "bronze_ad_events.after_batch",
    "gold_campaign_stats.after_ledger",
    None,
    "silver_ad_events.after_quarantine+1.5",
    "silver_ad_events.after_quarantine+0.5",
    None,
    "silver_ad_events.after_batch",
    "gold_campaign_stats.after_batch",
    "gold_ad_attribution.before_batch+1",
    None,
    "gold_campaign_stats.after_ledger+0.3",
    "gold_ad_attribution.after_batch",
    "silver_ad_events.before_batch+1.5",
    None,
)
for _spec in SCHEDULE:  # a typo in the schedule fails at import, not after minutes of chaos
    if _spec is not None:
        parse(_spec)

# A heavy share of every kind of mess, so each batch exercises every path (a quarantine
# append, late and on-time events in silver's insert, the late-data ledger) and every
# reason is counted. (Its batches are small, so silver inserts both classes with one MERGE;
# the kill between two MERGEs is tests/test_silver_batches.py's.)
MESS = {"malformed": 0.03, "missing_field": 0.03, "bad_time": 0.02, "future_time": 0.01,
        "unknown_type": 0.01, "bad_price": 0.02, "duplicate": 0.08, "late": 0.05,
        "long_line": 0.001}


@dataclass(frozen=True)
class ChaosOptions:
    faults: int = 20
    seed: int = 1
    rate: float = 100.0  # events per second of the feed
    trigger: str = "1s"
    files_per_trigger: int = 2  # small batches: many commits to die between
    # A crash point the driver has not reached by then counts as a random kill instead.
    point_timeout: float = 240.0
    # A random kill comes up to this long after the driver's first batch of its run.
    random_kill_within: float = 6.0
    # Maintenance (OPTIMIZE, and VACUUM at the shortest retention it allows) and reprocessing
    # of today and yesterday, in a loop beside the kills.
    under_fire: bool = True


@dataclass
class FaultOutcome:
    fault: str  # the crash point, or "random"
    result: str  # "crash point", "random kill", "point not reached: killed"
    seconds_alive: float


@dataclass
class JobOutcome:
    job: str  # "maintain", "reprocess today", "reprocess yesterday"
    exit_code: int  # of its last attempt
    attempts: int  # a failed job is retried once, as the Airflow task would be
    seconds: float
    # The end of each failed attempt's output: why it failed, in the report itself.
    failures: list[str] = field(default_factory=list)


@dataclass
class ChaosReport:
    faults: list[FaultOutcome] = field(default_factory=list)
    jobs: list[JobOutcome] = field(default_factory=list)
    records: int = 0
    lost: int = 0
    duplicated: int = 0
    checks: dict[str, bool] = field(default_factory=dict)
    details: dict[str, object] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(self.checks.values()) and self.lost == 0 and self.duplicated == 0

    def summary(self) -> str:
        at_points = sum(1 for f in self.faults if f.result == "crash point")
        failed = [name for name, held in self.checks.items() if not held]
        verdict = "exact" if self.ok else f"FAILED: {', '.join(failed) or 'counts differ'}"
        beside = f", {len(self.jobs)} maintenance and reprocess runs beside" if self.jobs else ""
        return (f"chaos: {len(self.faults)} faults ({at_points} at crash points, "
                f"{len(self.faults) - at_points} random{beside}), {self.records:,} records, "
                f"{self.lost:,} lost, {self.duplicated:,} duplicated in {self.seconds:.0f} s: "
                f"{verdict}")

    def as_json(self) -> dict[str, object]:
        return {**asdict(self), "ok": self.ok, "summary": self.summary()}


_LAKEHOUSE = console_script("lakehouse")


# -- the faults --------------------------------------------------------------------------


def _batches(settings: Settings) -> int:
    """Micro-batches the streams have committed so far: grows while the driver works (and
    only then: maintenance and reprocessing beside it commit to the tables too)."""
    return sum(1 for _ in settings.checkpoints_dir.glob("*/commits/[0-9]*"))


class Driver:
    """``lakehouse stream --layers all`` in a process group of its own, as Airflow runs it."""

    def __init__(self, settings: Settings, options: ChaosOptions, log_file: Path,
                 crash_at: str | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if k != CRASH_AT_VARIABLE}
        if crash_at:
            env[CRASH_AT_VARIABLE] = crash_at
        env["LAKEHOUSE_MAX_FILES_PER_TRIGGER"] = str(options.files_per_trigger)
        command = [_LAKEHOUSE, "stream", "--root", str(settings.root), "--layers", "all",
                   "--trigger", options.trigger]
        self.log_file = log_file
        self.log_offset = log_file.stat().st_size if log_file.exists() else 0
        with log_file.open("ab") as sink:
            self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                            stderr=sink, start_new_session=True)
        self.started = time.monotonic()

    def log_since_start(self) -> str:
        with self.log_file.open("rb") as source:
            source.seek(self.log_offset)
            return source.read().decode("utf-8", errors="replace")

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)

    def exited_by_itself(self) -> bool:
        """It exited, and not by a kill: a stream that failed for good."""
        return self.process.poll() is not None and self.process.returncode != -signal.SIGKILL


class DriverFailed(RuntimeError):
    pass


def _wait(driver: Driver, until: float, condition: Callable[[], bool]) -> bool:
    while time.monotonic() < until:
        if condition():
            return True
        if driver.exited_by_itself():
            raise DriverFailed(f"the stream driver exited with {driver.process.returncode} "
                               f"by itself:\n{driver.log_since_start()[-4000:]}")
        time.sleep(0.1)
    return False


def deal_fault(settings: Settings, options: ChaosOptions, crash_at: str | None,
               rng: random.Random, log_file: Path) -> FaultOutcome:
    driver = Driver(settings, options, log_file, crash_at)
    try:
        if crash_at is None:
            before = _batches(settings)
            deadline = time.monotonic() + options.point_timeout
            if not _wait(driver, deadline, lambda: _batches(settings) > before):
                raise DriverFailed(f"the stream driver committed nothing in "
                                   f"{options.point_timeout:.0f} s:\n"
                                   f"{driver.log_since_start()[-4000:]}")
            time.sleep(rng.uniform(0, options.random_kill_within))
            result = "random kill"
        else:
            deadline = time.monotonic() + options.point_timeout
            reached = _wait(driver, deadline, lambda: driver.process.poll() is not None)
            if reached and driver.process.returncode != -signal.SIGKILL:
                raise DriverFailed(f"the stream driver exited with {driver.process.returncode}"
                                   f":\n{driver.log_since_start()[-4000:]}")
            result = ("crash point" if reached and "crash point" in driver.log_since_start()
                      else "point not reached: killed")
        alive = time.monotonic() - driver.started
    finally:
        driver.kill()
    outcome = FaultOutcome(crash_at or "random", result, round(alive, 1))
    log.info("fault: %s", outcome)
    return outcome


# -- the feed ----------------------------------------------------------------------------


class Feed:
    """``lakehouse generate`` writing a file of ``rate`` events every second."""

    def __init__(self, settings: Settings, options: ChaosOptions, log_file: Path) -> None:
        mess = [option for name, share in MESS.items()
                for option in (f"--{name.replace('_', '-')}", str(share))]
        with log_file.open("ab") as log:
            self._process = landing_feed.start_feed(settings.root, options.rate,
                                                    "--seed", str(options.seed), *mess,
                                                    log=log)

    def stop(self) -> bool:
        """Stopped as Ctrl-C stops it, the file under way finished and counted; whether it
        had run until then (a feed that SIGTERM ends before it handles signals has
        written nothing yet, so that too is a clean stop)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signal.SIGTERM)
        try:
            return self._process.wait(timeout=60) in (0, -signal.SIGTERM)
        except subprocess.TimeoutExpired:  # hung: killed, and the battery fails
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
            return False


class Fire:
    """Maintenance and reprocessing in a loop, in a thread, as the nightly DAGs would run
    them beside the streams: ``lakehouse reprocess`` of today, ``lakehouse maintain``
    (OPTIMIZE, then VACUUM at the shortest retention the streams' lag allows: no time-travel
    window, a 2-minute margin, which Delta's whole hours make an hour), then ``lakehouse
    reprocess`` of yesterday. A job that fails is retried once, as its Airflow task would be."""

    # Each job is a JVM beside the driver: on two cores, one at a time.
    JOB_TIMEOUT_SECONDS = 900

    def __init__(self, settings: Settings, log_file: Path) -> None:
        self.settings = settings
        self.log_file = log_file
        self.outcomes: list[JobOutcome] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-fire", daemon=True)
        self._thread.start()

    def _jobs(self) -> list[tuple[str, list[str], dict[str, str]]]:
        today = datetime.now(UTC).date()
        yesterday = today.fromordinal(today.toordinal() - 1)
        # A margin longer than any write under way takes here, beside the kills on 2 cores.
        short_retention = {"LAKEHOUSE_TIME_TRAVEL_WINDOW": "0 seconds",
                           "LAKEHOUSE_VACUUM_SAFETY_MARGIN": "2 minutes"}
        # Today's rebuild first: it races the live streams hardest, and a short battery
        # (make test's three faults) then has it and a maintenance run beside its kills.
        return [("reprocess today", ["reprocess", "--from", str(today), "--to", str(today)],
                 {}),
                ("maintain", ["maintain"], short_retention),
                ("reprocess yesterday", ["reprocess", "--from", str(yesterday), "--to",
                                         str(yesterday)], {})]

    def _loop(self) -> None:
        while not self._stop.is_set():
            for name, args, env in self._jobs():
                if self._stop.is_set():
                    return
                self.outcomes.append(self._run(name, args, env))

    def _run(self, name: str, args: list[str], env: dict[str, str]) -> JobOutcome:
        started = time.monotonic()
        command = [_LAKEHOUSE, *args,
                   "--root", str(self.settings.root)]
        code = -1
        failures: list[str] = []
        for attempt in (1, 2):
            with self.log_file.open("ab") as sink:
                sink.write(f"\n== {name}, attempt {attempt}\n".encode())
                sink.flush()
                output_from = sink.tell()
                code = subprocess.run(command, env=dict(os.environ, **env), stdout=sink,
                                      stderr=sink, timeout=self.JOB_TIMEOUT_SECONDS
                                      ).returncode
            if code == 0:
                break
            failures.append(self._output_tail(output_from))
        outcome = JobOutcome(name, code, attempt, round(time.monotonic() - started, 1),
                             failures)
        log.info("beside the kills: %s", outcome)
        return outcome

    def _output_tail(self, offset: int, characters: int = 3000) -> str:
        with self.log_file.open("rb") as source:
            source.seek(offset)
            return source.read().decode(errors="replace")[-characters:]

    def stop(self) -> list[JobOutcome]:
        """Let the job under way finish (its result counts), then stop."""
        self._stop.set()
        self._thread.join(timeout=self.JOB_TIMEOUT_SECONDS * 2 + 60)
        return self.outcomes


# -- the proof ---------------------------------------------------------------------------


def _read(spark: SparkSession, path: str) -> DataFrame:
    return spark.read.format("delta").load(path)


def _count_differences(actual: DataFrame, expected: DataFrame) -> tuple[int, int]:
    """(rows of ``expected`` missing from ``actual``, rows of ``actual`` not expected)."""
    return expected.exceptAll(actual).count(), actual.exceptAll(expected).count()


def prove(spark: SparkSession, settings: Settings, report: ChaosReport) -> None:
    """Every check of the battery, what was lost or duplicated added up in the report."""
    from spark_jobs.silver import ad_events as silver

    prove_accounting(spark, settings, report)
    events = _read(spark, silver.TABLE.path(settings)).persist()
    try:
        prove_streamed_gold(spark, settings, events, report)
        prove_reprocessed_gold(spark, settings, events, report)
    finally:
        events.unpersist()


def prove_accounting(spark: SparkSession, settings: Settings, report: ChaosReport) -> None:
    """Bronze, silver and the quarantine against what the generator says it delivered."""
    from spark_jobs.audit import account
    from spark_jobs.bronze import ad_events as bronze
    from spark_jobs.expected_counts import ExpectedCounts

    expected = ExpectedCounts.load(settings.expected_counts_file)
    accounting = account(spark, settings, settings.expected_counts_file)
    distinct_bronze = (_read(spark, bronze.TABLE.path(settings)).select("bronze_id")
                       .distinct().count())
    report.records = expected.delivered
    report.details["accounting"] = {k: v for k, v in accounting.as_json().items()
                                    if k not in ("streams", "late_data")}
    report.checks["bronze holds every delivered record once"] = (
        accounting.delivered == distinct_bronze == expected.delivered)
    report.checks["silver holds every distinct valid event once"] = (
        accounting.silver_rows == accounting.silver_distinct_event_ids
        == expected.valid_distinct)
    report.checks["the quarantine holds every invalid record, by reason"] = (
        accounting.quarantine_by_reason == dict(sorted(expected.invalid_by_reason.items())))
    report.checks["the audit identity holds"] = accounting.identity_holds
    report.lost += (max(0, expected.delivered - distinct_bronze) + accounting.unaccounted
                    + max(0, expected.valid_distinct - accounting.silver_distinct_event_ids)
                    + max(0, expected.invalid - accounting.quarantine_rows))
    report.duplicated += ((accounting.delivered - distinct_bronze) + accounting.accounted_twice
                          + (accounting.silver_rows - accounting.silver_distinct_event_ids)
                          + max(0, accounting.quarantine_rows - expected.invalid))


def prove_streamed_gold(spark: SparkSession, settings: Settings, events: DataFrame,
                        report: ChaosReport) -> None:
    """Streamed ``gold.campaign_stats`` against the batch recomputation over silver: equal
    outside the late-data ledger's windows; inside them, short by exactly what the ledger
    counted. An event short or over beyond the ledger is lost or duplicated."""
    from pyspark.sql import functions as F

    from spark_jobs.gold import campaign_stats
    from spark_jobs.ops import late_data
    from spark_jobs.silver import ad_campaigns

    mapping = _read(spark, ad_campaigns.TABLE.path(settings))
    batch = campaign_stats.campaign_stats(events, mapping, settings.window_duration)

    def events_per_window(frame: DataFrame) -> DataFrame:
        return frame.groupBy("window_start").agg(
            F.sum(F.col("views") + F.col("clicks") + F.col("purchases")).alias("n"))

    streamed = _read(spark, campaign_stats.TABLE.path(settings))
    # Open entries only: a rebuild of a date counted the late events of the entries it marked
    # repaired, so streamed gold holds them now.
    ledger = (_read(spark, late_data.TABLE.path(settings))
              .where((F.col("layer") == campaign_stats.LAYER) & F.col("repaired_at").isNull())
              .groupBy("window_start").agg(F.sum("late_rows").alias("ledger")))
    windows = (events_per_window(batch).withColumnRenamed("n", "batch")
               .join(events_per_window(streamed).withColumnRenamed("n", "streamed"),
                     "window_start", "full")
               .join(ledger, "window_start", "full")
               .select("window_start", *(F.coalesce(name, F.lit(0)).alias(name)
                                         for name in ("batch", "streamed", "ledger")))
               .withColumn("off", F.col("batch") - F.col("streamed") - F.col("ledger"))
               .where("off != 0").persist())
    off = windows.agg(
        F.count("*").alias("windows"),
        F.coalesce(F.sum(F.greatest("off", F.lit(0))), F.lit(0)).alias("short"),
        F.coalesce(F.sum(F.greatest(-F.col("off"), F.lit(0))), F.lit(0)).alias("over")).first()
    report.details["windows_off_the_ledger_sample"] = [
        {k: str(v) for k, v in row.asDict().items()}
        for row in windows.orderBy("window_start").limit(10).collect()]
    windows.unpersist()
    report.details["windows_off_the_ledger"] = off.windows
    report.checks["streamed gold is short of the batch by exactly the ledger"] = (
        off.windows == 0)
    missing, extra = _count_differences(streamed.join(ledger, "window_start", "left_anti"),
                                        batch.join(ledger, "window_start", "left_anti"))
    report.checks["streamed gold equals the batch outside the ledger's windows"] = (
        missing == extra == 0)
    report.details["late_rows_in_ledger"] = (
        _read(spark, late_data.TABLE.path(settings)).where(F.col("layer") == campaign_stats.LAYER)
        .agg(F.sum("late_rows")).first()[0] or 0)
    report.details["late_rows_open"] = ledger.agg(F.sum("ledger")).first()[0] or 0
    report.lost += off.short
    report.duplicated += off.over


def prove_reprocessed_gold(spark: SparkSession, settings: Settings, events: DataFrame,
                           report: ChaosReport) -> None:
    """Gold's dates reprocessed, as a user repairs them: both tables equal the batch
    recomputation row for row (a wrong row is one missing and one extra)."""
    from pyspark.sql import functions as F

    from spark_jobs.dates import DateRange
    from spark_jobs.gold import ad_attribution, campaign_stats
    from spark_jobs.gold import writer as gold_writer
    from spark_jobs.silver import ad_campaigns

    bounds = events.agg(F.min("event_date").alias("first"),
                        F.max("event_date").alias("last")).first()
    gold_writer.rebuild(lambda: spark, settings, DateRange(bounds.first, bounds.last), False)
    mapping = _read(spark, ad_campaigns.TABLE.path(settings))
    stats_missing, stats_extra = _count_differences(
        _read(spark, campaign_stats.TABLE.path(settings)),
        campaign_stats.campaign_stats(events, mapping, settings.window_duration))
    attribution_missing, attribution_extra = _count_differences(
        _read(spark, ad_attribution.TABLE.path(settings)),
        ad_attribution.ad_attribution(events, settings.attribution_max_gap))
    report.checks["reprocessed gold equals the batch recomputation"] = (
        stats_missing == stats_extra == attribution_missing == attribution_extra == 0)
    report.details["gold_after_reprocessing"] = {
        "campaign_stats_rows_missing": stats_missing, "campaign_stats_rows_extra": stats_extra,
        "attribution_rows_missing": attribution_missing,
        "attribution_rows_extra": attribution_extra}
    report.lost += stats_missing + attribution_missing
    report.duplicated += stats_extra + attribution_extra


def run(settings: Settings, options: ChaosOptions) -> ChaosReport:
    from spark_jobs.session import spark_session

    if any(settings.tables_dir.glob("*/*/_delta_log")) or settings.landing_events.exists():
        raise ValueError(f"{settings.root} already holds a lake: the battery counts what it "
                         "delivers itself, so give it an empty root")
    started = time.monotonic()
    rng = random.Random(options.seed)
    log_dir = settings.root / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    driver_log = log_dir / "chaos-driver.log"
    report = ChaosReport()
    feed = Feed(settings, options, log_dir / "chaos-feed.log")
    fire = Fire(settings, log_dir / "chaos-jobs.log") if options.under_fire else None
    try:
        for number in range(options.faults):
            crash_at = SCHEDULE[number % len(SCHEDULE)]
            report.faults.append(deal_fault(settings, options, crash_at, rng, driver_log))
    finally:
        report.checks["the feed ran until stopped"] = feed.stop()
        if fire is not None:
            report.jobs = fire.stop()
            report.checks["every maintenance and reprocess run succeeded (one retry)"] = all(
                job.exit_code == 0 for job in report.jobs)
    faulted = time.monotonic()
    with spark_session(settings, "lakehouse-chaos") as spark:
        # Restarted once more and drained, by the proof's own driver (one cold JVM, not two):
        # everything delivered goes through every layer, from the checkpoints the kills left.
        try:
            streaming.run_available_now(spark, settings, list(streaming.LAYERS))
        except streaming.StreamFailed as error:
            raise DriverFailed(f"draining failed: {error}") from None
        drained = time.monotonic()
        prove(spark, settings, report)
    report.seconds = time.monotonic() - started
    report.details["seconds"] = {"faults": round(faulted - started),
                                 "drain": round(drained - faulted),
                                 "proof": round(time.monotonic() - drained)}
    (log_dir / "chaos-report.json").write_text(json.dumps(report.as_json(), indent=2,
                                                          default=str))
    return report
