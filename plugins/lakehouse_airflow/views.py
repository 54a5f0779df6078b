"""The lakehouse pages in the Airflow UI, served from the project's own data.

The stream health page lists every stream the pipeline runs, from the first second (a
stream with no progress yet says so), with its state, last micro-batch, rates, watermark,
state rows and late rows, and one verdict: green only when every stream is running and
keeping up. ``read_snapshot`` does all the reading (``ops.stream_progress``,
``ops.late_data`` with ``deltalake``, i.e. delta-rs: no
Spark in the API server; the drivers' heartbeats and leases); ``stream_statuses``,
``verdict`` and ``render_stream_health`` (``templates/stream_health.html.j2``) are pure
functions of it. ``latest_report`` finds
the newest data quality report.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from spark_jobs import config, delta_reader, pages, registry, storage
from spark_jobs.config import ConfigError, Settings
from spark_jobs.ops import heartbeat
from spark_jobs.ops.leases import driver

if TYPE_CHECKING:
    from spark_jobs.storage import LakePath

# Every streaming query the pipeline runs, in dependency order, from the registry (plain
# Python: the API server imports no PySpark).
STREAMS: tuple[str, ...] = registry.query_names()
# The windowed streams: their progress rows carry their event-time watermark (Spark's for
# the attribution join; the one campaign stats applies itself in ``foreachBatch``).
WINDOWED = frozenset(str(table.stream) for table in registry.streams() if table.windowed)
# Spark's own definition of falling behind is a batch taking longer than the trigger
# interval (``registry.trigger_of``, not the table poll: a stream reading the lake runs one
# batch per commit it reads); one slow batch (a compaction, a catch-up after a restart) is
# not a trend.
FALLING_BEHIND_BATCHES = 3
# Spark reports this watermark before a stream has seen any event.
NO_WATERMARK = datetime(1970, 1, 1, tzinfo=UTC)

PROGRESS_TABLE = registry.TABLES["ops.stream_progress"]
LATE_TABLE = registry.TABLES["ops.late_data"]
PROGRESS_COLUMNS = ["query_name", "batch_id", "batch_at", "num_input_rows",
                    "input_rows_per_second", "processed_rows_per_second",
                    "batch_duration_ms", "watermark", "state_rows",
                    "rows_dropped_by_watermark", "timers_fired"]

Level = Literal["ok", "warn", "bad"]

@dataclass(frozen=True)
class Snapshot:
    """Everything the stream health page shows, read at one moment."""

    now: datetime
    progress: list[dict[str, Any]]  # ops.stream_progress rows
    late: list[dict[str, Any]]  # ops.late_data rows
    heartbeats: list[dict[str, Any]]  # the drivers' heartbeat files
    live_layers: frozenset[str]  # layers whose lease a running driver holds
    problems: list[str]  # the drivers' health verdict (``heartbeat.health``)
    # How long a driver on the configured trigger may go without progress (a driver on a
    # trigger of its own, ``lakehouse stream --trigger``, is judged by that one).
    stall_after: timedelta
    trigger_interval: str  # the configured one, for drivers whose heartbeat has none
    root: str = ""


@dataclass(frozen=True)
class StreamStatus:
    """One row of the page: a stream's state and its latest micro-batch."""

    stream: str
    state: str
    level: Level
    last_batch_at: datetime | None = None
    batch_id: int | None = None
    input_rows_per_second: float | None = None
    processed_rows_per_second: float | None = None
    batch_duration_ms: int | None = None
    watermark: datetime | None = None
    windowed: bool = False
    state_rows: int | None = None
    rows_dropped_by_watermark: int | None = None
    timers_fired: int | None = None
    late_rows: int = 0


@dataclass(frozen=True)
class Verdict:
    level: Level
    headline: str
    reasons: list[str] = field(default_factory=list)


# -- reading -----------------------------------------------------------------------------


def _utc(value: Any) -> datetime | None:
    """Delta timestamps as aware UTC datetimes (delta-rs gives UTC-aware or naive UTC)."""
    if not isinstance(value, datetime):
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _table_rows(settings: Settings, table: registry.Table,
                columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """A Delta table's rows as plain Python values (ints stay ints, NULL is None); of
    ``columns``, those the table has (one recorded before a column was added lacks it)."""
    path = table.path(settings)
    if columns is not None and delta_reader.is_delta_table(path):
        present = set(delta_reader.column_names(path))
        columns = [column for column in columns if column in present]
    return delta_reader.read_rows(path, columns)


def read_snapshot(settings: Settings, now: datetime | None = None) -> Snapshot:
    """Read what the page shows: the ops tables, the heartbeats, the leases, the verdict."""
    now = now or datetime.now(UTC)
    beats = heartbeat.heartbeats(settings)
    layers = {layer for beat in beats for layer in beat.get("layers", [])}
    return Snapshot(
        now=now,
        progress=_table_rows(settings, PROGRESS_TABLE, PROGRESS_COLUMNS),
        late=_table_rows(settings, LATE_TABLE, ["layer", "late_rows"]),
        heartbeats=beats,
        live_layers=frozenset(layer for layer in layers if driver(settings, layer)),
        problems=heartbeat.health(settings, now).problems,
        stall_after=heartbeat.stall_after(settings),
        trigger_interval=settings.trigger_interval,
        root=str(settings.root))


# -- deciding ----------------------------------------------------------------------------


def _latest_batches(progress: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each stream's recorded batches, newest first."""
    batches: dict[str, list[dict[str, Any]]] = {}
    for row in progress:
        batches.setdefault(row["query_name"], []).append(row)
    for rows in batches.values():
        rows.sort(key=lambda row: (_utc(row["batch_at"]) or NO_WATERMARK, row["batch_id"]),
                  reverse=True)
    return batches


def _late_rows(late: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Late rows per stream: the ledger names the table (``gold.campaign_stats``)."""
    totals: dict[str, int] = {}
    for row in late:
        stream = str(registry.TABLES[row["layer"]].stream)
        totals[stream] = totals.get(stream, 0) + int(row["late_rows"] or 0)
    return totals


def _heartbeat_of(stream: str, heartbeats: Iterable[dict[str, Any]]
                  ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The newest heartbeat naming the stream, and the stream's entry in it."""
    found = [(beat, beat["queries"][stream]) for beat in heartbeats
             if stream in beat.get("queries", {})]
    return max(found, key=lambda pair: str(pair[0].get("written_at")), default=None)


def _interval_ms(text: str | None, fallback: str) -> float:
    try:
        return config.interval_seconds(text or fallback) * 1000
    except ConfigError:
        return config.interval_seconds(fallback) * 1000


def _falling_behind(batches: Sequence[dict[str, Any]], interval_ms: float,
                    snapshot: Snapshot, stall_after: timedelta) -> bool:
    """Its last batches each took longer than the trigger interval, and still do."""
    recent = batches[:FALLING_BEHIND_BATCHES]
    latest_at = _utc(recent[0]["batch_at"]) if recent else None
    return (len(recent) == FALLING_BEHIND_BATCHES and latest_at is not None
            and snapshot.now - latest_at <= stall_after
            and all((row["batch_duration_ms"] or 0) > interval_ms for row in recent))


def _state(stream: str, batches: Sequence[dict[str, Any]], snapshot: Snapshot
           ) -> tuple[str, Level]:
    seen = _heartbeat_of(stream, snapshot.heartbeats)
    if seen is None:
        return ("not running (no driver runs it)", "warn") if batches else (
            "not started yet", "warn")
    beat, query = seen
    if beat.get("stopped"):
        return "stopped on request", "warn"
    if not any(layer in snapshot.live_layers for layer in beat.get("layers", [])):
        return "driver exited without a stop request", "bad"
    if not query.get("active"):
        return "not active", "bad"
    stall_after = heartbeat.stall_after_beat(snapshot.stall_after, snapshot.trigger_interval,
                                             beat)
    written = heartbeat.parse_time(beat.get("written_at"))
    if written is None or snapshot.now - written > stall_after:
        return "driver stopped beating", "bad"
    progressed = heartbeat.last_progress(beat, stream)
    if progressed is None:
        return "not started yet", "warn"  # the driver is up; Spark has not reported yet
    if snapshot.now - progressed > stall_after:
        waiting = heartbeat.waiting_for_rebuild(beat, stream)
        return (waiting, "warn") if waiting else (f"stalled since {_when(progressed)}", "bad")
    trigger = query.get("trigger_interval") or beat.get("trigger_interval")
    if _falling_behind(batches, _interval_ms(trigger, snapshot.trigger_interval), snapshot,
                       stall_after):
        return "falling behind", "bad"
    return ("running" if batches else "running, no data yet"), "ok"


def stream_statuses(snapshot: Snapshot) -> list[StreamStatus]:
    """One status per stream the pipeline runs (and any other that recorded progress)."""
    batches = _latest_batches(snapshot.progress)
    late = _late_rows(snapshot.late)
    names = list(STREAMS) + sorted(set(batches) - set(STREAMS))
    statuses = []
    for name in names:
        rows = batches.get(name, [])
        state, level = _state(name, rows, snapshot)
        latest = rows[0] if rows else {}
        # The newest batch that applied one (a batch with nothing to do may report none).
        watermark = next((mark for row in rows if (mark := _utc(row["watermark"])) is not None),
                         None)
        statuses.append(StreamStatus(
            stream=name, state=state, level=level,
            last_batch_at=_utc(latest.get("batch_at")), batch_id=latest.get("batch_id"),
            input_rows_per_second=latest.get("input_rows_per_second"),
            processed_rows_per_second=latest.get("processed_rows_per_second"),
            batch_duration_ms=latest.get("batch_duration_ms"),
            watermark=None if watermark is None or watermark <= NO_WATERMARK else watermark,
            windowed=name in WINDOWED, state_rows=latest.get("state_rows"),
            rows_dropped_by_watermark=latest.get("rows_dropped_by_watermark"),
            timers_fired=latest.get("timers_fired"), late_rows=late.get(name, 0)))
    return statuses


def verdict(statuses: Sequence[StreamStatus], problems: Sequence[str] = ()) -> Verdict:
    """Green only when every stream is running and keeping up and no driver has a problem.

    ``problems`` is the drivers' verdict, the one the health sensor fails runs on. The
    streams' states already say each of them per stream; it is listed only if no stream
    does, so the page is never green while the sensor sees a problem.
    """
    bad = [f"{s.stream}: {s.state}" for s in statuses if s.level == "bad"]
    if problems or bad:
        return Verdict("bad", "a stream needs attention", bad or list(problems))
    waiting = [f"{s.stream}: {s.state}" for s in statuses if s.level == "warn"]
    if waiting:
        return Verdict("warn", f"{len(statuses) - len(waiting)} of {len(statuses)} streams "
                               "running", waiting)
    return Verdict("ok", f"all {len(statuses)} streams running and keeping up")


# -- rendering ---------------------------------------------------------------------------


def _when(moment: datetime | None) -> str:
    """A UTC time to the second."""
    return "–" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _count(value: int | float | None) -> str:
    """A count as an integer with thousands separators, whatever type it was read as."""
    return "–" if value is None or value != value else f"{int(value):,}"


def _rate(value: float | None) -> str:
    return "–" if value is None or value != value else f"{value:,.1f}"


def _seconds(milliseconds: int | None) -> str:
    return "–" if milliseconds is None else f"{milliseconds / 1000:,.1f} s"


COLUMNS = ("stream", "state", "last batch (UTC)", "batch", "input rows/s", "processed rows/s",
           "batch duration", "watermark (UTC)", "state rows", "rows dropped by watermark",
           "timers fired", "late rows")


def _row(status: StreamStatus) -> dict[str, object]:
    """One stream's cells as the page shows them (the template escapes them)."""
    return {
        "stream": status.stream, "level": status.level, "state": status.state,
        "last_batch_at": _when(status.last_batch_at), "batch_id": _count(status.batch_id),
        "input_rows_per_second": _rate(status.input_rows_per_second),
        "processed_rows_per_second": _rate(status.processed_rows_per_second),
        "batch_duration": _seconds(status.batch_duration_ms),
        "watermark": _when(status.watermark) if status.windowed and status.watermark else "",
        "no_watermark": "not windowed" if not status.windowed else "none yet",
        "state_rows": _count(status.state_rows),
        "rows_dropped_by_watermark": _count(status.rows_dropped_by_watermark),
        "timers_fired": _count(status.timers_fired),
        "late_rows": _count(status.late_rows)}


def render_stream_health(statuses: Sequence[StreamStatus], outcome: Verdict,
                         now: datetime, root: str = "") -> str:
    """The page: the verdict, then one row per stream. It refreshes itself every 30 s."""
    return pages.render(__package__, "stream_health.html.j2", root=root, now=_when(now),
                        verdict=outcome, columns=COLUMNS,
                        rows=[_row(status) for status in statuses],
                        falling_behind_batches=FALLING_BEHIND_BATCHES)


def stream_health_page(settings: Settings | None = None) -> str:
    settings = settings or config.load()
    snapshot = read_snapshot(settings)
    statuses = stream_statuses(snapshot)
    return render_stream_health(statuses, verdict(statuses, snapshot.problems),
                                snapshot.now, snapshot.root)


def latest_report(settings: Settings | None = None) -> Path | None:
    settings = settings or config.load()
    reports = sorted(settings.reports_dir.glob("quality-*.html"))
    return reports[-1] if reports else None


def report_file(relative: str, settings: Settings | None = None) -> LakePath | None:
    """A file of the reports folder (the report, its Data Docs), never one outside it."""
    settings = settings or config.load()
    if storage.is_object_store(settings.reports_dir):  # keys, not a file system to resolve
        parts = PurePosixPath(relative).parts
        if not parts or relative.startswith("/") or {".", ".."} & set(parts):
            return None
        path = settings.reports_dir / relative
        return path if path.is_file() else None
    folder = settings.reports_dir.resolve()
    path = (folder / relative).resolve()
    return path if path.is_relative_to(folder) and path.is_file() else None
