"""Runs the streaming layers: once over everything present, or continuously until told to stop.

``--available-now`` runs each layer to completion once the layers it reads have, so silver
sees all of bronze and gold all of silver (the alert stream, reading bronze, runs beside
them). Continuous mode starts them side by side and, on
SIGTERM, SIGINT or a stop request (``lakehouse stop``), stops each query between two
micro-batches. Either way the driver holds each layer's lease while it runs; a continuous
driver running gold also carries out the gold rebuilds reprocesses ask of it
(``gold.writer``).
"""

from __future__ import annotations

import importlib
import logging
import signal
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from spark_jobs import checkpoints, registry, storage
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.config import ConfigError, Settings, interval_seconds, spark_interval
from spark_jobs.gold import writer as gold_writer
from spark_jobs.ops import heartbeat, stream_progress
from spark_jobs.ops.leases import leases, refuse_if_running

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

PROGRESS_FLUSH_SECONDS = 5.0
AWAIT_POLL_SECONDS = 0.1
POOL = "spark.scheduler.pool"

# Layer name -> the modules whose ``start`` launch its queries, in dependency order (the
# registry's order).
LAYERS: dict[str, tuple[str, ...]] = {
    layer: tuple(table.module for table in registry.streams() if table.layer == layer)
    for layer in registry.LAYERS}


class StreamFailed(RuntimeError):
    """A streaming query stopped with an error; its message says which and why."""


def parse_layers(text: str | None) -> list[str]:
    """``bronze,silver`` or ``all`` (the default) to layer names in dependency order."""
    if not text or text.strip() == "all":
        return list(LAYERS)
    asked = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in asked if name not in LAYERS]
    if unknown or not asked:
        raise ConfigError(f"unknown layer {', '.join(unknown) or repr(text)}: "
                          f"choose from {', '.join(LAYERS)} or all")
    return [name for name in LAYERS if name in asked]


def _start_layer(spark: SparkSession, settings: Settings, layer: str,
                 trigger: dict[str, object]) -> list[StreamingQuery]:
    return start_streams(spark, settings, registry.query_names(layer), trigger)


def start_streams(spark: SparkSession, settings: Settings, query_names: Iterable[str],
                  trigger: dict[str, object]) -> list[StreamingQuery]:
    """The streams named, each on its own trigger (``_own_trigger``) in a scheduler pool of
    its own, in the order they are given."""
    modules = {table.stream: table.module for table in registry.streams()}
    queries = []
    for name in query_names:
        stream = importlib.import_module(modules[name])
        # A scheduler pool per stream (a query runs its jobs in the pool set where it
        # starts): under FAIR scheduling, a long job of one stream does not hold every core
        # while the short jobs of the others wait behind it.
        spark.sparkContext.setLocalProperty(POOL, stream.QUERY_NAME)
        try:
            queries.append(stream.start(spark, settings,
                                        _own_trigger(settings, stream.QUERY_NAME, trigger)))
        finally:
            spark.sparkContext.setLocalProperty(POOL, None)
    return queries


def _own_trigger(settings: Settings, query_name: str, trigger: dict[str, object]
                 ) -> dict[str, object]:
    """The trigger a stream runs on in this driver: a processing-time one as the registry
    gives it for the stream (``registry.poll_of``: the alert path's own reading Kafka, the
    sessions' slower one, the streams reading the lake's tables polling them sooner);
    --available-now as asked."""
    if "processingTime" not in trigger:
        return trigger
    return {"processingTime": spark_interval(registry.poll_of(
        settings, query_name, str(trigger["processingTime"])))}


def _streams_of(layers: Sequence[str]) -> Iterator[tuple[str, ModuleType]]:
    """Each stream module of ``layers``, with its layer, in the order they start."""
    for layer in layers:
        for module in LAYERS[layer]:
            yield layer, importlib.import_module(module)


def _check_checkpoints(settings: Settings, layers: Sequence[str]) -> None:
    """Every stream of ``layers`` can resume on its checkpoint; checked before any starts,
    so a refused one leaves none running. What a kill left half-written goes first."""
    for layer, stream in _streams_of(layers):
        if removed := checkpoints.remove_interrupted_writes(settings, stream):
            log.info("%s: removed what a kill left half-written in its checkpoint: %s",
                     stream.QUERY_NAME, ", ".join(removed))
        checkpoints.check_compatible(settings, layer, stream)


def refuse_early(settings: Settings, layers: Sequence[str]) -> None:
    """What refuses a start of ``layers``, looked at before Spark starts (a JVM's start is
    seconds a refusal need not wait): a driver running one of them, a checkpoint built
    under other settings. Checked again, for real, under the leases."""
    refuse_if_running(settings, layers)
    for layer, stream in _streams_of(layers):
        checkpoints.check_compatible(settings, layer, stream, record=False)


def _layer_of(query_name: str) -> str:
    return next(table.layer for table in registry.streams() if table.stream == query_name)


def _raise_if_failed(queries: Iterable[StreamingQuery]) -> None:
    for query in queries:
        error = query.exception()
        if error is None:
            continue
        text = str(error).strip()
        message = f"stream {query.name} failed: {text.splitlines()[0]}"
        if explained := bronze.explain_failure(text):
            message = f"stream {query.name} failed: {explained}"
        elif checkpoints.incompatible_state(text):
            message += (f"\n{checkpoints.INCOMPATIBLE_HINT}"
                        f"{checkpoints.runbook(_layer_of(query.name))}")
        raise StreamFailed(message)


def run_available_now(spark: SparkSession, settings: Settings, layers: Sequence[str]) -> None:
    with leases(settings, layers):
        checkpoints.refuse_if_reset_unfinished(settings, layers)
        catch_up(spark, settings, layers)


def catch_up(spark: SparkSession, settings: Settings, layers: Sequence[str]) -> None:
    """Each layer's streams over everything present, each layer once the layers it reads
    have caught up (so silver sees all of bronze, gold all of silver, and the alert stream,
    which reads bronze, runs beside silver and gold); the caller holds the layers' leases."""
    _check_checkpoints(settings, layers)
    recorder = stream_progress.ProgressRecorder()
    started: list[StreamingQuery] = []
    waiting = list(layers)
    running: dict[str, list[StreamingQuery]] = {}
    try:
        while waiting or running:
            for layer in [layer for layer in waiting
                          if not upstream(layer) & {*waiting, *running}]:
                running[layer] = _start_layer(spark, settings, layer, {"availableNow": True})
                started += running[layer]
                waiting.remove(layer)
            layer = _await_a_layer(running)
            _raise_if_failed(running.pop(layer))
            log.info("layer %s caught up", layer)
    finally:
        for query in started:  # a failure or Ctrl-C must leave none running
            if query.isActive:
                query.stop()
        # One append for the whole run, not one per layer: each is a Delta commit, about a
        # second of a run that may have nothing to do.
        recorder.flush(spark, settings, started)


def upstream(layer: str) -> set[str]:
    """The other layers whose tables ``layer``'s streams read (their ``SOURCE_TABLE``)."""
    sources = (getattr(stream, "SOURCE_TABLE", None) for _, stream in _streams_of([layer]))
    return {source.layer for source in sources if source is not None} - {layer}


def _await_a_layer(running: dict[str, list[StreamingQuery]]) -> str:
    """Wait until every --available-now query of one of the ``running`` layers has ended,
    and name that layer; how a query failed, if one did, is raised with its layer's
    context by ``_raise_if_failed``."""
    while True:
        for layer, queries in running.items():
            if not any(query.isActive for query in queries):
                return layer
        time.sleep(AWAIT_POLL_SECONDS)


def stop_at_batch_boundary(query: StreamingQuery, patience_seconds: float) -> None:
    """Stop between micro-batches: let the running batch commit (bounded wait), then stop.

    When batches run back to back the next one may already have begun; stopping it is
    safe too (the checkpoint replays it exactly once), so the wait is for one batch only.
    """
    def last_batch() -> int:
        progress = query.lastProgress
        return -1 if progress is None else int(progress["batchId"])

    running = last_batch()
    deadline = time.monotonic() + patience_seconds
    while (query.isActive and query.status["isTriggerActive"] and last_batch() == running
           and time.monotonic() < deadline):
        time.sleep(0.05)
    query.stop()


def stop_request_file(settings: Settings) -> Path:
    return settings.root / "control" / "stop-request"


def request_stop(settings: Settings) -> Path:
    """Ask every continuous stream of this root that started earlier to stop at a batch
    boundary; drivers started later (after an upgrade) run normally."""
    path = stop_request_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(datetime.now(UTC).isoformat() + "\n", encoding="utf-8")
    return path


def _store_time(settings: Settings) -> float:
    """Now by the clock of the file system holding the root's control files."""
    if not storage.is_object_store(settings.root):
        return time.time()
    marker = stop_request_file(settings).with_name(f"started-{uuid.uuid4().hex}")
    marker.write_text("", "utf-8")
    try:
        return marker.stat().st_mtime
    finally:
        marker.unlink()


def _stop_requested_since(settings: Settings, started: float) -> bool:
    path = stop_request_file(settings)
    return path.exists() and path.stat().st_mtime >= started


def run_continuously(spark: SparkSession, settings: Settings, layers: Sequence[str],
                     trigger_interval: str, stop: threading.Event) -> None:
    # A stop requested while the leases are awaited counts too. The start's time as the
    # file system tells it, where the stop request's is read: on the object store that is
    # the store's clock, in whole seconds, not this machine's.
    started = _store_time(settings)
    with leases(settings, layers):
        checkpoints.refuse_if_reset_unfinished(settings, layers)
        _run_continuously(spark, settings, layers, trigger_interval, stop, started)


def _run_continuously(spark: SparkSession, settings: Settings, layers: Sequence[str],
                      trigger_interval: str, stop: threading.Event, started: float) -> None:
    _check_checkpoints(settings, layers)
    trigger = {"processingTime": spark_interval(trigger_interval)}
    recorder = stream_progress.ProgressRecorder()
    by_layer = {layer: _start_layer(spark, settings, layer, trigger) for layer in layers}
    queries = [query for layer in layers for query in by_layer[layer]]
    # This driver is gold's one writer: a reprocess elsewhere hands its rebuilds to it.
    rebuilds_stop = threading.Event()
    rebuilds = (gold_writer.serve_in_background(spark, settings, rebuilds_stop)
                if gold_writer.LAYER in layers else None)
    # A Kafka topic made again while bronze reads it stops the streams, as at a start.
    watch_topic = settings.source == "kafka" and "bronze" in layers
    try:
        while not stop.is_set():
            if any(not query.isActive for query in queries):
                _raise_if_failed(queries)
                raise StreamFailed("a stream stopped on its own: "
                                   + ", ".join(q.name for q in queries if not q.isActive))
            if watch_topic:
                bronze.check_topic_unchanged(settings)
            recorder.flush(spark, settings, queries)
            heartbeat.beat(settings, layers, queries, trigger_interval,
                           rebuilding=_rebuilding(by_layer.get(gold_writer.LAYER, [])))
            stop.wait(PROGRESS_FLUSH_SECONDS)
            if _stop_requested_since(settings, started):
                log.info("stop requested (%s): stopping streams at the next batch boundary",
                         stop_request_file(settings))
                stop.set()
    finally:
        rebuilds_stop.set()
        if rebuilds is not None:
            rebuilds.join()  # a rebuild under way finishes: its reprocess waits for it
        patience = max(60.0, 3 * interval_seconds(trigger_interval))
        for query in queries:
            stop_at_batch_boundary(query, patience)
        recorder.flush(spark, settings, queries)
    _raise_if_failed(queries)
    heartbeat.beat(settings, layers, queries, trigger_interval, stopped=True)


def _rebuilding(gold_queries: Sequence[StreamingQuery]) -> dict[str, object] | None:
    """The latest gold rebuild this driver ran, and the gold queries that wait for it."""
    rebuild = gold_writer.last_rebuild()
    if rebuild is None:
        return None
    return {**rebuild, "queries": [query.name for query in gold_queries]}


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT, instead of dying mid-batch."""
    stop = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        log.info("%s received: stopping streams at the next batch boundary",
                 signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    return stop
