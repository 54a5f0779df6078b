"""Runs the streaming layers: once over everything present, or continuously until told to stop.

``--available-now`` runs the layers one after another, each to completion, so silver sees
all of bronze and gold all of silver. Continuous mode starts them side by side and, on
SIGTERM or SIGINT, stops each query between two micro-batches.
"""

from __future__ import annotations

import importlib
import logging
import signal
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from spark_jobs.config import ConfigError, Settings, interval_seconds, spark_interval
from spark_jobs.ops import stream_progress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

PROGRESS_FLUSH_SECONDS = 5.0

# Layer name -> the modules whose ``start`` launch its queries, in dependency order.
LAYERS: dict[str, tuple[str, ...]] = {
    "bronze": ("spark_jobs.bronze.ad_events",),
    "silver": ("spark_jobs.silver.ad_events", "spark_jobs.silver.ad_campaigns"),
    "gold": ("spark_jobs.gold.campaign_stats", "spark_jobs.gold.ad_attribution"),
}


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
    return [importlib.import_module(module).start(spark, settings, trigger)
            for module in LAYERS[layer]]


def _raise_if_failed(queries: Iterable[StreamingQuery]) -> None:
    for query in queries:
        error = query.exception()
        if error is not None:
            raise StreamFailed(f"stream {query.name} failed: {error.desc.splitlines()[0]}")


def run_available_now(spark: SparkSession, settings: Settings, layers: Sequence[str]) -> None:
    recorder = stream_progress.ProgressRecorder()
    for layer in layers:
        queries = _start_layer(spark, settings, layer, {"availableNow": True})
        try:
            for query in queries:
                query.awaitTermination()
        finally:
            recorder.flush(spark, settings, queries)
        _raise_if_failed(queries)
        log.info("layer %s caught up", layer)


def stop_at_batch_boundary(query: StreamingQuery, patience_seconds: float) -> None:
    """Stop between micro-batches: wait (bounded) for the running batch to commit first.

    Stopping mid-batch would be safe too (checkpoints make the batch replay exactly once),
    but a clean boundary makes upgrades quick to resume and easy to reason about.
    """
    deadline = time.monotonic() + patience_seconds
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.2)
    query.stop()


def run_continuously(spark: SparkSession, settings: Settings, layers: Sequence[str],
                     trigger_interval: str, stop: threading.Event) -> None:
    trigger = {"processingTime": spark_interval(trigger_interval)}
    recorder = stream_progress.ProgressRecorder()
    queries = [query for layer in layers
               for query in _start_layer(spark, settings, layer, trigger)]
    try:
        while not stop.is_set():
            if any(not query.isActive for query in queries):
                _raise_if_failed(queries)
                raise StreamFailed("a stream stopped on its own: "
                                   + ", ".join(q.name for q in queries if not q.isActive))
            recorder.flush(spark, settings, queries)
            stop.wait(PROGRESS_FLUSH_SECONDS)
    finally:
        patience = max(60.0, 3 * interval_seconds(trigger_interval))
        for query in queries:
            stop_at_batch_boundary(query, patience)
        recorder.flush(spark, settings, queries)
    _raise_if_failed(queries)


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
