"""The stream health page, rendered from small inline snapshots: no Airflow, no Spark."""

from __future__ import annotations

import importlib
import json
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake

from spark_jobs.config import PROJECT_DIR
from spark_jobs.ops import heartbeat
from spark_jobs.ops.leases import leases
from tests.conftest import make_settings

# Airflow puts plugins/ on sys.path; so does this test.
sys.path.insert(0, str(PROJECT_DIR / "plugins"))
from lakehouse_airflow import views  # noqa: E402

NOW = datetime(2026, 11, 5, 12, 0, 0, 123456, tzinfo=UTC)
EVERY_LAYER = ["bronze", "silver", "gold", "ops"]


def batch(stream: str, batch_id: int, seconds_ago: float, **values: Any) -> dict[str, Any]:
    """An ``ops.stream_progress`` row as delta-rs reads it."""
    return {"query_name": stream, "batch_id": batch_id,
            "batch_at": NOW - timedelta(seconds=seconds_ago), "num_input_rows": 100,
            "input_rows_per_second": 20.0, "processed_rows_per_second": 250.0,
            "batch_duration_ms": 400, "watermark": None, "state_rows": None,
            "rows_dropped_by_watermark": None, "timers_fired": None, **values}


def beat(*, streams: tuple[str, ...] = views.STREAMS, progress_ago: float = 3,
         written_ago: float = 2, stopped: bool = False, active: bool = True
         ) -> dict[str, Any]:
    """A driver's heartbeat file, as ``heartbeat.beat`` writes it."""
    return {"pid": 4242, "layers": EVERY_LAYER, "stopped": stopped,
            "written_at": (NOW - timedelta(seconds=written_ago)).isoformat(),
            "trigger_interval": "5 seconds",
            "queries": {name: {"last_progress_at": (NOW - timedelta(seconds=progress_ago))
                               .isoformat().replace("+00:00", "Z"),
                               "batch_id": 9, "active": active,
                               # The alert path polls every second, the others every 5 s.
                               "trigger_interval": "1 second" if name == "ops_alerts"
                               else "5 seconds"} for name in streams}}


def snapshot(*, progress: list[dict[str, Any]] | None = None,
             heartbeats: list[dict[str, Any]] | None = None, live: bool = True,
             late: list[dict[str, Any]] | None = None,
             problems: list[str] | None = None) -> views.Snapshot:
    return views.Snapshot(
        now=NOW, progress=progress or [], late=late or [],
        heartbeats=heartbeats or [], live_layers=frozenset(EVERY_LAYER if live else []),
        problems=problems or [], stall_after=timedelta(minutes=2),
        trigger_interval="5 seconds", root="/lake")


def healthy_progress() -> list[dict[str, Any]]:
    return [
        batch("bronze_ad_events", 41, 8, num_input_rows=24818),
        batch("bronze_ad_events", 42, 3, num_input_rows=24818),
        batch("silver_ad_events", 17, 4, state_rows=24818, rows_dropped_by_watermark=0),
        batch("silver_ad_campaigns", 2, 60),
        batch("gold_campaign_stats", 11, 5),
        batch("gold_ad_attribution", 12, 5, state_rows=1520, rows_dropped_by_watermark=3,
              watermark=datetime(2026, 11, 5, 11, 49, 30, 500000, tzinfo=UTC)),
        batch("gold_user_sessions", 12, 5, state_rows=96, timers_fired=4,
              watermark=datetime(2026, 11, 5, 11, 49, 30, tzinfo=UTC)),
        batch("ops_alerts", 300, 4, state_rows=310,
              watermark=datetime(2026, 11, 5, 11, 58, 50, tzinfo=UTC)),
    ]


def statuses_by_name(shot: views.Snapshot) -> dict[str, views.StreamStatus]:
    return {status.stream: status for status in views.stream_statuses(shot)}


def page_of(shot: views.Snapshot) -> str:
    statuses = views.stream_statuses(shot)
    return views.render_stream_health(statuses, views.verdict(statuses, shot.problems),
                                      shot.now, shot.root)


def row_of(page: str, stream: str) -> list[str]:
    """The text of each cell of the stream's row."""
    row = re.search(rf"<tr><td>{stream}</td>(.*?)</tr>", page)
    assert row, f"no row for {stream}"
    return [re.sub(r"<[^>]+>", "", cell)
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", row.group(0))]


def test_the_page_names_the_streams_the_pipeline_runs() -> None:
    from spark_jobs import streaming

    started = [importlib.import_module(module).QUERY_NAME
               for modules in streaming.LAYERS.values() for module in modules]
    assert list(views.STREAMS) == started


def test_before_anything_ran_every_stream_is_listed_as_not_started_yet() -> None:
    shot = snapshot(live=False)
    page = page_of(shot)
    for stream in views.STREAMS:
        assert row_of(page, stream)[1] == "not started yet"
    outcome = views.verdict(views.stream_statuses(shot))
    assert outcome.level == "warn" and outcome.headline == "0 of 7 streams running"


def test_a_stream_whose_driver_is_up_but_not_yet_reporting_is_not_started_yet() -> None:
    starting = beat()
    starting["queries"]["silver_ad_campaigns"]["last_progress_at"] = None
    statuses = statuses_by_name(snapshot(progress=healthy_progress(), heartbeats=[starting]))
    assert statuses["silver_ad_campaigns"].state == "not started yet"
    outcome = views.verdict(list(statuses.values()))
    assert outcome.level == "warn"
    assert outcome.reasons == ["silver_ad_campaigns: not started yet"]


def test_every_stream_running_and_keeping_up_is_green() -> None:
    # Campaign stats applies its own watermark and its progress rows carry it; its newest
    # batch had nothing to do and applied none, so the one before it is shown.
    progress = [row for row in healthy_progress() if row["query_name"] != "gold_campaign_stats"]
    progress += [batch("gold_campaign_stats", 9, 15,
                       watermark=datetime(2026, 11, 5, 11, 49, tzinfo=UTC)),
                 batch("gold_campaign_stats", 10, 10,
                       watermark=datetime(2026, 11, 5, 11, 50, 7, 250000, tzinfo=UTC)),
                 batch("gold_campaign_stats", 11, 5)]
    shot = snapshot(progress=progress, heartbeats=[beat()],
                    late=[{"layer": "gold.campaign_stats", "late_rows": 3},
                          {"layer": "gold.campaign_stats", "late_rows": 4}])
    statuses = views.stream_statuses(shot)
    assert [s.state for s in statuses] == ["running"] * 7
    assert views.verdict(statuses) == views.Verdict(
        "ok", "all 7 streams running and keeping up")
    page = page_of(shot)
    assert 'id="verdict">all 7 streams running and keeping up<' in page
    bronze = row_of(page, "bronze_ad_events")
    # The latest batch, integers as integers, times to the second.
    assert bronze[2:5] == ["2026-11-05 11:59:57", "42", "20.0"]
    assert row_of(page, "silver_ad_events")[8] == "24,818"
    stats = row_of(page, "gold_campaign_stats")
    assert stats[7] == "2026-11-05 11:50:07"  # batch 10's
    assert stats[11] == "7"  # late rows: 3 + 4 in the ledger
    # Sessions: the state and the timers that closed sessions in its latest batch.
    assert row_of(page, "gold_user_sessions")[8:11] == ["96", "–", "4"]
    attribution = row_of(page, "gold_ad_attribution")
    assert attribution[7] == "2026-11-05 11:49:30" and attribution[8:10] == ["1,520", "3"]
    assert row_of(page, "bronze_ad_events")[7] == "not windowed"
    for stream in views.STREAMS:
        cells = row_of(page, stream)
        assert not any("." in cells[i] for i in (3, 8, 9, 10, 11)), cells  # counts
        assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|–|\D+", cells[i])
                   for i in (2, 7)), cells  # times to the second


def test_counts_read_as_floats_still_show_as_integers() -> None:
    # pandas turned nullable integer columns into floats: "24,818.0".
    progress = [batch("silver_ad_events", 17.0, 4, state_rows=24818.0)]
    page = page_of(snapshot(progress=progress, heartbeats=[beat()]))
    assert row_of(page, "silver_ad_events")[3] == "17"
    assert row_of(page, "silver_ad_events")[8] == "24,818"


def test_a_windowed_stream_before_its_first_event_has_no_watermark_yet() -> None:
    # Spark reports the epoch as the watermark of a stream that has seen no event.
    progress = [batch("gold_ad_attribution", 0, 5, watermark=datetime(1970, 1, 1))]
    page = page_of(snapshot(progress=progress, heartbeats=[beat()]))
    assert row_of(page, "gold_ad_attribution")[7] == "none yet"
    assert row_of(page, "gold_campaign_stats")[7] == "none yet"


def test_a_stream_on_a_trigger_of_its_own_is_judged_by_it() -> None:
    # 1.5 s batches: behind the alert path's 1 s trigger, though well within the driver's 5 s.
    alert_batches = [batch("ops_alerts", 301 + n, 3 - n, batch_duration_ms=1500)
                     for n in range(3)]
    statuses = statuses_by_name(snapshot(progress=healthy_progress() + alert_batches,
                                         heartbeats=[beat()]))
    assert statuses["ops_alerts"].state == "falling behind"
    # The same batches on a silver stream, judged by the 5 s trigger, keep up.
    as_silver = [{**row, "query_name": "silver_ad_events", "batch_id": 18 + n}
                 for n, row in enumerate(alert_batches)]
    statuses = statuses_by_name(snapshot(progress=healthy_progress() + as_silver,
                                         heartbeats=[beat()]))
    assert statuses["silver_ad_events"].state == "running"


def test_batches_slower_than_the_trigger_interval_are_falling_behind() -> None:
    slow = [batch("silver_ad_events", 18 + n, 3 - n, batch_duration_ms=7000)
            for n in range(3)]
    statuses = statuses_by_name(snapshot(progress=healthy_progress() + slow,
                                         heartbeats=[beat()]))
    assert statuses["silver_ad_events"].state == "falling behind"
    outcome = views.verdict(list(statuses.values()))
    assert outcome.level == "bad" and outcome.reasons == ["silver_ad_events: falling behind"]
    # One slow batch (a catch-up, a compaction) is not a trend.
    one_slow = healthy_progress() + [batch("silver_ad_events", 18, 1, batch_duration_ms=9000)]
    assert statuses_by_name(snapshot(progress=one_slow, heartbeats=[beat()]))[
        "silver_ad_events"].state == "running"


def test_stalled_dead_and_stopped_streams_are_not_green() -> None:
    stalled = statuses_by_name(snapshot(progress=healthy_progress(),
                                        heartbeats=[beat(progress_ago=600)]))
    assert stalled["bronze_ad_events"].state == "stalled since 2026-11-05 11:50:00"
    assert stalled["bronze_ad_events"].level == "bad"

    dead = statuses_by_name(snapshot(progress=healthy_progress(), heartbeats=[beat()],
                                     live=False))
    assert {s.state for s in dead.values()} == {"driver exited without a stop request"}
    assert views.verdict(list(dead.values())).level == "bad"

    stopped = statuses_by_name(snapshot(progress=healthy_progress(),
                                        heartbeats=[beat(stopped=True)], live=False))
    assert {s.state for s in stopped.values()} == {"stopped on request"}
    assert views.verdict(list(stopped.values())).level == "warn"


def test_text_from_the_drivers_and_the_settings_is_escaped_never_markup() -> None:
    # A driver's problem carries an exception's message, the root is whatever the user
    # configured: both reach the page as text.
    statuses = views.stream_statuses(snapshot(progress=healthy_progress(),
                                              heartbeats=[beat()]))
    outcome = views.verdict(statuses, ["lease lost: <img src=x onerror=alert(1)>"])
    page = views.render_stream_health(statuses, outcome, datetime.now(UTC),
                                      root="/data/<script>alert(1)</script>")
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "/data/&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<img" not in page and "<script" not in page


def test_the_drivers_problems_are_never_shown_green() -> None:
    statuses = views.stream_statuses(snapshot(progress=healthy_progress(),
                                              heartbeats=[beat()]))
    outcome = views.verdict(statuses, ["the driver of gold stopped beating"])
    assert outcome == views.Verdict("bad", "a stream needs attention",
                                    ["the driver of gold stopped beating"])


def test_the_page_reads_the_ops_tables_with_delta_rs(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "lake")
    moment = pa.timestamp("us", tz="UTC")
    write_deltalake(views.PROGRESS_TABLE.path(settings), pa.table({
        "query_name": ["silver_ad_events", "silver_ad_events", "gold_campaign_stats"],
        "batch_id": pa.array([1, 2, 3], pa.int64()),
        "batch_at": pa.array([NOW - timedelta(seconds=9), NOW - timedelta(seconds=4),
                              NOW - timedelta(seconds=6)], moment),
        "num_input_rows": pa.array([5, 24818, 7], pa.int64()),
        "input_rows_per_second": [1.5, 2.5, 1.0], "processed_rows_per_second": [3.5, 4.5, 1.0],
        "batch_duration_ms": pa.array([100, 200, 300], pa.int64()),
        "watermark": pa.array([None, None, datetime(2026, 11, 5, 11, 50, tzinfo=UTC)], moment),
        # NULL in one row: pandas read this column as float ("24,818.0").
        "state_rows": pa.array([None, 24818, None], pa.int64()),
        "rows_dropped_by_watermark": pa.array([None, 0, None], pa.int64())}))

    shot = views.read_snapshot(settings, now=NOW)
    statuses = statuses_by_name(shot)
    assert [s.stream for s in views.stream_statuses(shot)] == list(views.STREAMS)
    assert statuses["silver_ad_events"].state_rows == 24818
    assert statuses["silver_ad_events"].last_batch_at == NOW.replace(microsecond=123456) - \
        timedelta(seconds=4)
    assert statuses["gold_campaign_stats"].watermark == datetime(2026, 11, 5, 11, 50,
                                                                 tzinfo=UTC)
    assert statuses["bronze_ad_events"].state == "not started yet"
    # No driver ever ran here: progress without a heartbeat is an earlier run's.
    assert statuses["silver_ad_events"].state == "not running (no driver runs it)"
    page = views.stream_health_page(settings)
    assert "24,818" in page and "24,818.0" not in page


def test_gold_streams_waiting_for_a_rebuild_are_busy_not_stalled() -> None:
    # Ten minutes without progress everywhere, but the driver runs a gold rebuild, which
    # the gold queries wait for by design; bronze has no such excuse.
    waiting = beat(progress_ago=600)
    waiting["rebuilding"] = {"days": "2026-11-04..2026-11-04",
                             "since": "2026-11-05T11:50:00+00:00",
                             "queries": ["gold_campaign_stats", "gold_ad_attribution",
                                         "gold_user_sessions"]}
    statuses = statuses_by_name(snapshot(progress=healthy_progress(), heartbeats=[waiting]))
    assert statuses["gold_campaign_stats"].state == (
        "waiting for the gold rebuild of 2026-11-04..2026-11-04 "
        "(since 2026-11-05T11:50:00+00:00)")
    assert statuses["gold_campaign_stats"].level == "warn"
    assert statuses["bronze_ad_events"].state == "stalled since 2026-11-05 11:50:00"


def test_after_a_rebuild_its_waiting_queries_count_from_its_end() -> None:
    def gold_state(ended_ago: float) -> str:
        waited = beat(progress_ago=600)
        waited["rebuilding"] = {"days": "2026-11-04..2026-11-04",
                                "since": (NOW - timedelta(seconds=900)).isoformat(),
                                "ended": (NOW - timedelta(seconds=ended_ago)).isoformat(),
                                "queries": ["gold_campaign_stats"]}
        return statuses_by_name(snapshot(progress=healthy_progress(), heartbeats=[waited])
                                )["gold_campaign_stats"].state

    # 30 s after the rebuild the queued batch may still run (the limit is 2 minutes) ...
    assert gold_state(ended_ago=30) == "running"
    # ... 5 minutes after it, no progress since the rebuild is a stall again.
    assert gold_state(ended_ago=300) == "stalled since 2026-11-05 11:55:00"


def test_the_supervisors_verdict_excuses_only_the_queries_waiting_for_a_rebuild(
        tmp_path: Path) -> None:
    # The sensor stops a driver with a stalled query: a gold rebuild must not trigger that.
    settings = make_settings(tmp_path / "lake")
    waiting = beat(progress_ago=600)
    waiting["rebuilding"] = {"days": "2026-11-04..2026-11-04", "since": NOW.isoformat(),
                             "queries": ["gold_campaign_stats", "gold_ad_attribution",
                                         "gold_user_sessions"]}
    path = heartbeat.heartbeat_file(settings, EVERY_LAYER)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(waiting))
    with leases(settings, EVERY_LAYER):  # the driver is alive
        problems = heartbeat.health(settings, now=NOW).problems
    stalled = {problem.split()[1] for problem in problems if "stalled" in problem}
    assert stalled == {"bronze_ad_events", "silver_ad_events", "silver_ad_campaigns",
                       "ops_alerts"}


class RunningQuery:
    """What ``heartbeat.beat`` reads of a running Spark query."""

    def __init__(self, name: str) -> None:
        self.name, self.isActive = name, True
        self.lastProgress = {"timestamp": "2026-11-05T11:59:57.000Z", "batchId": 9}


def test_a_driver_on_a_trigger_of_its_own_is_judged_by_it(tmp_path) -> None:
    # lakehouse stream --trigger "1 minute": the heartbeat carries the driver's trigger, not
    # the configured 5 s, and each stream's own where it has one that is longer.
    settings = make_settings(tmp_path / "lake")
    names = ["silver_ad_events", "gold_user_sessions"]
    heartbeat.beat(settings, ["silver", "gold"], [RunningQuery(name) for name in names],
                   "1 minute")
    written = json.loads(heartbeat.heartbeat_file(settings, ["silver", "gold"]).read_text())
    assert written["trigger_interval"] == "1 minute"
    assert {name: written["queries"][name]["trigger_interval"] for name in names} == {
        "silver_ad_events": "1 minute", "gold_user_sessions": "1 minute"}
    # Its silver batches of 7 s every minute keep up, though they would be behind a 5 s
    # trigger; and its last progress 3 minutes ago is 3 triggers, not a stall (the
    # configured limit is 2 minutes: 24 intervals of 5 s).
    on_a_minute = beat(progress_ago=180)
    on_a_minute["trigger_interval"] = "1 minute"
    for query in on_a_minute["queries"].values():
        query["trigger_interval"] = "1 minute"
    slow = [batch("silver_ad_events", 18 + n, 150 - 60 * n, batch_duration_ms=7000)
            for n in range(3)]
    statuses = statuses_by_name(snapshot(progress=healthy_progress() + slow,
                                         heartbeats=[on_a_minute]))
    assert statuses["silver_ad_events"].state == "running"
    assert {status.state for status in statuses.values()} == {"running"}
    # The same heartbeat on the configured 5 s would be a stall.
    on_a_minute["trigger_interval"] = "5 seconds"
    statuses = statuses_by_name(snapshot(progress=healthy_progress() + slow,
                                         heartbeats=[on_a_minute]))
    assert statuses["silver_ad_events"].state.startswith("stalled since")

