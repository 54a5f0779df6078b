"""Sustained rate and latency: every layer running continuously behind a live feed.

One driver runs bronze, silver and gold continuously with the project's own settings
(``streaming.run_continuously`` at its trigger interval and file limit per trigger, as
``make run`` does) while a feed lands one file a second holding that second's events, as
``lakehouse generate --rate`` does. A monitor notes when each file landed and, at every new
version of ``gold.campaign_stats``, how many events its windows count; since the files are
processed in order, a file's latency is the time from its landing until gold first counts
every event up to and including it.

The feed is clean (every record valid and distinct, made by the generator with its mess set
to zero), so each record is counted in gold exactly once and its arrival can be counted;
the messy corpus is the pipeline part's. Each trial's files are generated just before it,
their event times a second apart per file from the moment of generation, so every event is
on time when it lands (within a minute or two of its ingestion, far inside the watermark)
and generating costs the machine nothing while it is measured.

- **Sustained rate**: a trial feeds ``rate`` events a second for ``SUSTAIN_SECONDS``. The
  streams keep up when the backlog (events landed and not yet in gold, in seconds of feed)
  never exceeds ``MAX_BACKLOG_SECONDS``, latency does not grow (the slope of latency
  against landing time, after the first minute, is at most ``MAX_SLOPE``: gold counts at
  least 95% of the feed rate), and gold holds every event within ``MAX_BACKLOG_SECONDS`` of
  the last landing. A steady backlog is kept up with; a growing one is not. A trial that
  falls behind stops early. The first trial runs at the start rate; each next one 25%
  above the last if that kept up, 20% below if not, until a rate kept up and a rate not
  kept up bracket the sustained rate (at most ``MAX_SUSTAINED_TRIALS``; a run that could
  not bracket it says so, and its rate kept up is then a lower bound).
- **Latency**: a third of the sustained rate for ``LATENCY_SECONDS``; p50 and p99 of the
  latencies of the files landed after the first ``WARM_UP_SECONDS``.
"""

from __future__ import annotations

import itertools
import os
import shutil
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from spark_jobs import delta_reader, landing_feed, streaming
from spark_jobs.config import Settings
from spark_jobs.gold import campaign_stats
from spark_jobs.ops import heartbeat, stream_progress

SUSTAIN_SECONDS = 300
LATENCY_SECONDS = 180
MAX_BACKLOG_SECONDS = 120.0
MAX_SLOPE = 0.05  # seconds of latency gained per second of feed
# The first batches pay for planning, JIT and table creation: files landed this early are
# in neither the slope nor the latencies.
WARM_UP_SECONDS = 60
STEP_UP, STEP_DOWN = 1.25, 0.8
# Five minutes of feed each (less for one that falls behind early): four trials bracket a
# sustained rate within 25% from a start anywhere between about half and twice it.
MAX_SUSTAINED_TRIALS = 4
POLL_SECONDS = 0.25


@dataclass(frozen=True)
class Pool:
    """Generated feed files, one per second of feed in landing order, and the campaign
    mapping their ads need."""

    files: list[Path]
    campaigns: list[Path]
    file_events: int


def clean_pool(generated: Settings, rate: int, seconds: int) -> Pool:
    """``seconds`` files of ``rate`` clean events, written by ``lakehouse generate`` into the
    fresh root of ``generated``; file ``n`` holds the events of second ``n`` from now."""
    shutil.rmtree(generated.root, ignore_errors=True)
    # Event time spread over the span ending at ``--start``: one second per file from now.
    start = datetime.now(UTC) + timedelta(seconds=seconds)
    landing_feed.generate(generated.root, "--clean", "--events", str(rate * seconds),
                          "--seed", "13", "--start", start.isoformat(),
                          "--span", f"{seconds} seconds", "--events-per-file", str(rate))
    # The generator numbers its files in writing order.
    return Pool(sorted(generated.landing_events.iterdir()),
                sorted(generated.landing_campaigns.iterdir()), rate)


@dataclass
class Observations:
    """What the monitor saw: landings as (time, events landed so far) and gold versions as
    (time, events counted so far)."""

    landed: list[tuple[float, int]] = field(default_factory=list)
    counted: list[tuple[float, int]] = field(default_factory=list)

    def backlog_seconds(self, rate: float) -> float:
        landed = self.landed[-1][1] if self.landed else 0
        counted = self.counted[-1][1] if self.counted else 0
        return max(landed - counted, 0) / rate

    def latencies(self) -> list[tuple[float, float]]:
        """(landing time, latency) of every file gold has counted whole."""
        result, position = [], 0
        for landed_at, events in self.landed:
            while position < len(self.counted) and self.counted[position][1] < events:
                position += 1
            if position == len(self.counted):
                break
            result.append((landed_at, self.counted[position][0] - landed_at))
        return result


def _land(pool: Pool, landing: Path, seen: Observations, stop: threading.Event) -> None:
    """Hard-link the pool's files into the landing zone (atomic, nothing copied), one a
    second."""
    landing.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for second, path in enumerate(pool.files):
        if stop.wait(max(started + second - time.monotonic(), 0)):
            return
        os.link(path, landing / path.name)
        seen.landed.append((time.time(), (second + 1) * pool.file_events))


def _gold_events(path: str) -> int:
    import pyarrow.compute as pc

    table = delta_reader.read_arrow(path, ["views", "clicks", "purchases"])
    return sum(int(pc.sum(table[column]).as_py() or 0) for column in table.column_names)


def _slope(points: list[tuple[float, float]]) -> float:
    if len(points) < 3:
        return 0.0
    return statistics.linear_regression([p[0] for p in points], [p[1] for p in points]).slope


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(share * len(ordered)), len(ordered) - 1)]


def trial(spark: SparkSession, settings: Settings, scratch: Path, rate: int,
          seconds: int) -> dict[str, Any]:
    """``rate`` events a second for ``seconds`` on a fresh root, every layer streaming."""
    pool = clean_pool(settings.replace(root=scratch / "pool"), rate, seconds)
    # A root of its own: a stopped query's background work (RocksDB's snapshot upload)
    # can still write into its checkpoint after the stop, which a reused root would then
    # hold on the next trial's batch 0 (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY).
    settings = settings.replace(
        root=settings.root.with_name(f"{settings.root.name}-{uuid.uuid4().hex[:8]}"))
    shutil.rmtree(settings.root, ignore_errors=True)
    settings.landing_campaigns.mkdir(parents=True)
    for mapping in pool.campaigns:
        shutil.copy(mapping, settings.landing_campaigns / mapping.name)
    stop_streams, stop_feed = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def failing_into(action: Callable[[], object]) -> Callable[[], None]:
        def guarded() -> None:
            try:
                action()
            except BaseException as error:  # reported by the trial, not lost in a thread
                failure.append(error)
        return guarded

    streams = threading.Thread(name="feed-bench-streams", target=failing_into(
        lambda: streaming.run_continuously(spark, settings, list(streaming.LAYERS),
                                           settings.trigger_interval, stop_streams)))
    streams.start()
    seen = Observations()
    feed = threading.Thread(name="feed-bench-feed", target=failing_into(
        lambda: _land(pool, settings.landing_events, seen, stop_feed)))
    gold = campaign_stats.TABLE.path(settings)
    verdict, max_backlog = None, 0.0
    try:
        _wait(lambda: heartbeat.health(settings).running or failure, "the streams to start")
        feed.start()
        version = -1
        while not failure:
            # Taken before the read: a version committed meanwhile is seen late, never early.
            now = time.time()
            if delta_reader.is_delta_table(gold) and (
                    latest := delta_reader.latest_version(gold)) != version:
                version = latest
                seen.counted.append((now, _gold_events(gold)))
            max_backlog = max(max_backlog, seen.backlog_seconds(rate))
            if max_backlog > MAX_BACKLOG_SECONDS:
                verdict = f"backlog over {MAX_BACKLOG_SECONDS:g} s of feed"
                break
            if not feed.is_alive() and seen.landed:
                if seen.backlog_seconds(rate) == 0:
                    break
                if now - seen.landed[-1][0] > MAX_BACKLOG_SECONDS:
                    verdict = (f"gold lacked events {MAX_BACKLOG_SECONDS:g} s after the "
                               f"last landing")
                    break
            time.sleep(POLL_SECONDS)
    finally:
        stop_feed.set()
        stop_streams.set()
        if feed.ident is not None:
            feed.join()
        streams.join()
    if failure or not seen.landed:
        raise RuntimeError("the feed or a stream failed during the feed trial") from (
            failure[0] if failure else None)
    first_landing = seen.landed[0][0]
    warm = [p for p in seen.latencies() if p[0] - first_landing >= WARM_UP_SECONDS]
    slope = _slope(warm)
    if verdict is None and slope > MAX_SLOPE:
        verdict = f"latency grew {slope:.2f} s per second of feed"
    values = [latency for _, latency in warm]
    return {
        "stages": stages(settings, first_landing + WARM_UP_SECONDS),
        "rate": rate, "seconds_fed": len(seen.landed), "events_landed": seen.landed[-1][1],
        "kept_up": verdict is None, "fell_behind": verdict,
        "max_backlog_seconds": round(max_backlog, 1), "latency_slope": round(slope, 3),
        "latency_seconds": {"p50": round(_percentile(values, 0.5), 1),
                            "p99": round(_percentile(values, 0.99), 1),
                            "max": round(max(values), 1), "files": len(values)}
        if values else None,
    }


def stages(settings: Settings, since: float) -> dict[str, dict[str, float]]:
    """Each stream's batches that read records after ``since`` (epoch seconds), from its
    ``ops.stream_progress`` rows: how often one started, how long one ran, and how many
    records it read (medians). A record waits for each stage's next batch, then for that
    batch to finish: these bound the latency stage by stage."""
    batches: dict[str, list[dict[str, Any]]] = {}
    for row in delta_reader.read_rows(stream_progress.TABLE.path(settings)):
        started = row["batch_at"].replace(tzinfo=row["batch_at"].tzinfo or UTC)
        if row["num_input_rows"] and started.timestamp() >= since:
            batches.setdefault(row["query_name"], []).append(row)
    profile = {}
    for name, rows in sorted(batches.items()):
        rows.sort(key=lambda row: row["batch_at"])
        gaps = [(later["batch_at"] - earlier["batch_at"]).total_seconds()
                for earlier, later in itertools.pairwise(rows)]
        profile[name] = {
            "batches": len(rows),
            "every_seconds": round(statistics.median(gaps), 1) if gaps else None,
            "duration_seconds": round(statistics.median(
                row["batch_duration_ms"] for row in rows) / 1000, 1),
            "records": round(statistics.median(row["num_input_rows"] for row in rows))}
    return profile


def _wait(condition: Callable[[], object], what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(POLL_SECONDS)


def bracket(try_rate: Callable[[int], dict[str, Any]], start_rate: int,
            max_trials: int = MAX_SUSTAINED_TRIALS) -> list[dict[str, Any]]:
    """Sustained trials (``try_rate(rate)``, each saying whether it ``kept_up``) from
    ``start_rate``: 25% up after one that kept up, 20% down after one that did not, until
    the rates tried hold one kept up just below one not kept up, or ``max_trials``."""
    trials = [try_rate(start_rate)]
    while len(trials) < max_trials and not bracketed(trials):
        last = trials[-1]
        trials.append(try_rate(round(last["rate"] * (STEP_UP if last["kept_up"]
                                                     else STEP_DOWN))))
    return trials


def bracketed(trials: list[dict[str, Any]]) -> bool:
    """Whether ``trials`` hold a rate kept up below every rate that was not."""
    kept = [t["rate"] for t in trials if t["kept_up"]]
    behind = [t["rate"] for t in trials if not t["kept_up"]]
    return bool(kept and behind and max(kept) < min(behind))


def run(spark: SparkSession, settings: Settings, scratch: Path, start_rate: int
        ) -> dict[str, Any]:
    """Sustained trials until they bracket the sustained rate (``bracket``), then latency
    at a third of the highest rate kept up."""
    trials = bracket(lambda rate: trial(spark, settings, scratch, rate, SUSTAIN_SECONDS),
                     start_rate)
    kept = [t["rate"] for t in trials if t["kept_up"]]
    behind = [t["rate"] for t in trials if not t["kept_up"]]
    sustained = max(kept) if kept else None
    latency = trial(spark, settings, scratch, round((sustained or min(behind)) / 3),
                    LATENCY_SECONDS)
    return {"trigger_interval": settings.trigger_interval,
            "table_poll_interval": settings.table_poll_interval,
            "max_files_per_trigger": settings.max_files_per_trigger,
            "sustained_events_per_second": sustained,
            # The lowest rate above the sustained one that fell behind: None when every
            # rate tried kept up (the sustained rate is then at least ``sustained``).
            "not_sustained_events_per_second": min((rate for rate in behind
                                                    if sustained is None or rate > sustained),
                                                   default=None),
            "bracketed": bracketed(trials),
            "trials": trials, "latency": latency,
            "targets": {"sustained_events_per_second": 15_000, "p99_latency_seconds": 15}}


def render(results: dict[str, Any]) -> str:
    lines = ["| feed trial | events/s | kept up | max backlog | latency p50 | p99 |",
             "| --- | --- | --- | --- | --- | --- |"]
    named = [(f"sustained {n + 1}", t) for n, t in enumerate(results["trials"])]
    for name, t in [*named, ("latency", results["latency"])]:
        latency = t["latency_seconds"] or {"p50": "-", "p99": "-"}
        lines.append(f"| {name} | {t['rate']:,} | {'yes' if t['kept_up'] else t['fell_behind']}"
                     f" | {t['max_backlog_seconds']} s | {latency['p50']} s "
                     f"| {latency['p99']} s |")
    sustained, above = (results["sustained_events_per_second"],
                        results["not_sustained_events_per_second"])
    if results.get("bracketed"):
        lines += ["", f"sustained: {sustained:,} events/s kept up, {above:,} not"]
    else:
        lines += ["", f"sustained: not bracketed in {len(results['trials'])} trials "
                      f"(highest kept up: {f'{sustained:,}' if sustained else 'none'})"]
    latency = results["latency"]
    lines += ["", f"stages in the latency trial ({latency['rate']:,} events/s; medians)", "",
              "| stream | batch every | batch ran | records a batch |",
              "| --- | --- | --- | --- |"]
    for name, stage in latency.get("stages", {}).items():
        lines.append(f"| {name} | {stage['every_seconds']} s | {stage['duration_seconds']} s "
                     f"| {stage['records']:,} |")
    return "\n".join(lines)
