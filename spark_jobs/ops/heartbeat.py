"""Liveness of continuous streams: a heartbeat file per driver, and the health verdict.

``ops.stream_progress`` records micro-batches that moved data; a stream with nothing to do
is idle, not stalled. The driver therefore writes, every few seconds, each query's latest
progress event (Spark emits one for idle triggers too) to
``<root>/control/heartbeat-<layers>.json``. A stream is stalled when that event is older
than ``stall_trigger_intervals`` trigger intervals, or the file itself stopped changing.
Plain files and the standard library only: Airflow reads them without Spark.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from spark_jobs import registry, storage
from spark_jobs.config import ConfigError, Settings, interval_seconds
from spark_jobs.ops.leases import driver

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

# Spark reports an idle query's progress only every 10 s, whatever the trigger.
MIN_STALL_SECONDS = 30.0


def heartbeat_file(settings: Settings, layers: Sequence[str]) -> Path:
    return settings.root / "control" / f"heartbeat-{'-'.join(layers)}.json"


def _now() -> datetime:
    return datetime.now(UTC)


def beat(settings: Settings, layers: Sequence[str], queries: Iterable[StreamingQuery],
         trigger_interval: str, stopped: bool = False,
         rebuilding: dict[str, object] | None = None) -> None:
    """Write the driver's heartbeat atomically (write, then rename). ``trigger_interval``:
    the driver's own (``lakehouse stream --trigger`` may differ from the configured one),
    which its streams are judged by. ``rebuilding``: the latest gold rebuild this driver
    ran (``days``, ``since``, ``ended`` or None while it runs) and the ``queries`` that
    wait for it: busy, not stalled."""
    entries = {}
    for query in queries:
        progress = query.lastProgress
        entries[query.name] = {
            "last_progress_at": progress["timestamp"] if progress else None,
            "batch_id": progress["batchId"] if progress else None,
            "active": query.isActive,
            # A stream on a trigger of its own (the alert path's) is judged by that one.
            "trigger_interval": (registry.trigger_of(settings, query.name, trigger_interval)
                                 if query.name in registry.query_names()
                                 else trigger_interval),
        }
    path = heartbeat_file(settings, layers)
    storage.write_atomically(path.parent, path.name, json.dumps(
        {"pid": os.getpid(), "layers": list(layers), "written_at": _now().isoformat(),
         "stopped": stopped, "trigger_interval": trigger_interval,
         "queries": entries, "rebuilding": rebuilding}).encode())


def parse_time(text: str | None) -> datetime | None:
    """A heartbeat's ISO-8601 time, as aware UTC (a naive one is taken as UTC)."""
    if not text:
        return None
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _rebuild_waited_for(heartbeat: dict, query_name: str) -> dict:
    """The driver's latest gold rebuild, if the query is one that waits for it; else {}."""
    rebuilding = heartbeat.get("rebuilding") or {}
    return rebuilding if query_name in rebuilding.get("queries", []) else {}


def waiting_for_rebuild(heartbeat: dict, query_name: str) -> str | None:
    """What the query waits for, while its driver runs a gold rebuild it must not overlap."""
    rebuild = _rebuild_waited_for(heartbeat, query_name)
    if not rebuild or rebuild.get("ended"):
        return None
    return f"waiting for the gold rebuild of {rebuild['days']} (since {rebuild['since']})"


def last_progress(heartbeat: dict, query_name: str) -> datetime | None:
    """When the query last reported progress; a query that waited for a gold rebuild counts
    from the rebuild's end, since its next batch could only start then."""
    progressed = parse_time(heartbeat["queries"][query_name].get("last_progress_at"))
    ended = parse_time(_rebuild_waited_for(heartbeat, query_name).get("ended"))
    return progressed if progressed is None or ended is None else max(progressed, ended)


@dataclass(frozen=True)
class Health:
    running: bool  # some driver holds a lease and beats
    stopped_cleanly: bool  # every heartbeat says its driver stopped on request
    problems: list[str]


def stall_after(settings: Settings) -> timedelta:
    """How long a driver on the configured trigger may go without a heartbeat, and its
    streams without progress, before they count as stalled."""
    seconds = interval_seconds(settings.trigger_interval) * settings.stall_trigger_intervals
    return timedelta(seconds=max(seconds, MIN_STALL_SECONDS))


def stall_after_beat(configured: timedelta, configured_trigger: str, heartbeat: dict
                     ) -> timedelta:
    """The stall limit of the driver that wrote ``heartbeat``: ``configured`` (the limit on
    ``configured_trigger``) scaled up to the trigger that driver runs on, if longer
    (``lakehouse stream --trigger``); never shorter, so a driver on a quicker trigger is not
    restarted for a batch the configured limit allows."""
    try:
        scale = (interval_seconds(heartbeat.get("trigger_interval") or configured_trigger)
                 / interval_seconds(configured_trigger))
    except ConfigError:  # a heartbeat from another version of the project
        return configured
    return max(configured, configured * scale)


def heartbeats(settings: Settings) -> list[dict]:
    """Every driver's last heartbeat under the root: what the health sensor and the Stream
    health page both read."""
    return [json.loads(path.read_text("utf-8"))
            for path in sorted((settings.root / "control").glob("heartbeat-*.json"))]


def live_drivers(settings: Settings) -> list[dict[str, object]]:
    """The lease holders (pid, host, since) of every layer a heartbeat names."""
    layers = sorted({layer for beat in heartbeats(settings) for layer in beat["layers"]})
    return [who for layer in layers if (who := driver(settings, layer))]


def health(settings: Settings, now: datetime | None = None) -> Health:
    """The verdict over every driver's heartbeat under the root."""
    now = now or _now()
    configured = stall_after(settings)
    problems: list[str] = []
    beats = heartbeats(settings)
    running = False
    for heartbeat in beats:
        layers = heartbeat["layers"]
        limit = stall_after_beat(configured, settings.trigger_interval, heartbeat)
        alive = any(driver(settings, layer) for layer in layers)
        running = running or alive
        if heartbeat["stopped"]:
            continue
        if not alive:
            problems.append(f"the driver of {', '.join(layers)} exited without a stop request")
            continue
        written = parse_time(heartbeat["written_at"])
        if written is None or now - written > limit:
            problems.append(f"the driver of {', '.join(layers)} stopped beating "
                            f"(last heartbeat {heartbeat['written_at']})")
        for name, query in heartbeat["queries"].items():
            progressed = last_progress(heartbeat, name)
            if not query["active"]:
                problems.append(f"stream {name} is not active")
            elif (progressed is not None and now - progressed > limit
                  and not waiting_for_rebuild(heartbeat, name)):
                problems.append(f"stream {name} stalled: no progress since {progressed:%F %T}Z "
                                f"(limit {limit})")
    stopped_cleanly = bool(beats) and all(beat["stopped"] for beat in beats)
    return Health(running, stopped_cleanly, problems)
