"""``make bench``'s alerts part: how long a click-fraud alert takes, from the click that
puts an address over the limit reaching Kafka to the alert reaching the alert topic.

A real broker (``lakehouse services start kafka``, under the bench's root) and the alert
stream (``spark_jobs.ops.alerts``) on its own trigger (``alert_trigger``) in this process's
Spark session, the way a continuous run starts it. A producer thread sends background
traffic (views and clicks of many addresses, none over the limit) at ``background_rate``
events a second; every ``burst_every`` seconds a new address sends ``limit + 1`` clicks at
once, all in the same minute of event time, so its last click is the one that crosses the
limit. Latency is the alert message's Kafka timestamp minus that click's (both stamped by
their producers on this machine's clock): what a consumer of ``ad-alerts`` waits.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import statistics
import threading
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from spark_jobs import kafka_topic, services
from spark_jobs.ops import alerts

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_jobs.config import Settings

TOPIC, ALERT_TOPIC = "bench-clicks", "bench-alerts"
WARM_UP_SECONDS = 15.0


def _click(event_id: str, ip: str, at: datetime, event_type: str = "click") -> bytes:
    return json.dumps({"event_id": event_id, "event_type": event_type, "ad_id": "ad-1",
                       "ip_address": ip, "event_time": at.isoformat().replace("+00:00", "Z")
                       }).encode()


class Traffic(threading.Thread):
    """Background events, and the fraud bursts whose crossing clicks are timed."""

    def __init__(self, settings: Settings, limit: int, background_rate: int,
                 burst_every: float, seconds: float) -> None:
        super().__init__(daemon=True)
        self.settings, self.limit = settings, limit
        self.background_rate, self.burst_every, self.seconds = (
            background_rate, burst_every, seconds)
        self.crossed_at_ms: dict[str, int] = {}  # address -> Kafka time of its crossing click
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self._send()
        except BaseException as error:  # reported by the caller
            self.failure = error

    def _send(self) -> None:
        producer = kafka_topic.producer(self.settings)
        rng = random.Random(7)
        started = time.monotonic()
        # The first burst after a warm-up: the stream's first batches compile its code.
        next_burst, bursts, sent = started + WARM_UP_SECONDS, 0, 0

        def crossed(ip: str) -> Any:
            def delivered(error: object, message: Any) -> None:
                if error is None:
                    self.crossed_at_ms[ip] = message.timestamp()[1]
            return delivered

        while (now := time.monotonic()) < started + self.seconds:
            at = datetime.now(UTC)
            due = int((now - started) * self.background_rate) - sent
            for n in range(due):  # many addresses, a click now and then: never an alert
                ip = f"10.1.{rng.randrange(256)}.{rng.randrange(256)}"
                kind = "click" if rng.random() < 0.3 else "view"
                producer.produce(TOPIC, _click(f"bg-{sent + n}", ip, at, kind))
            sent += due
            if now >= next_burst and at.second < 55:  # the whole burst in one minute
                ip = f"10.66.0.{bursts}"
                for k in range(self.limit):
                    producer.produce(TOPIC, _click(f"{ip}-{k}", ip, at))
                producer.produce(TOPIC, _click(f"{ip}-{self.limit}", ip, at),
                                 on_delivery=crossed(ip))
                bursts += 1
                next_burst += self.burst_every
            producer.poll(0)
            time.sleep(0.02)
        producer.flush(60)


def _alert_times(settings: Settings, expected: int, timeout: float) -> dict[str, int]:
    """Per address, the Kafka time of its alert message (the first, should one repeat)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "group.id": "bench-alerts", "enable.auto.commit": False})
    found: dict[str, int] = {}
    try:
        consumer.assign([TopicPartition(ALERT_TOPIC, partition, 0) for partition in range(
            kafka_topic.partitions(alerts.alert_topic_settings(settings)) or 1)])
        deadline = time.monotonic() + timeout
        while len(found) < expected and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                ip = json.loads(message.value())["ip_address"]
                found.setdefault(ip, message.timestamp()[1])
    finally:
        consumer.close()
    return found


def run(spark: SparkSession, settings: Settings, seconds: float = 105.0,
        background_rate: int = 1_000, burst_every: float = 2.0) -> dict[str, Any]:
    shutil.rmtree(settings.root, ignore_errors=True)
    settings = settings.replace(
        source="kafka", kafka_topic=TOPIC, alert_topic=ALERT_TOPIC,
        kafka_bootstrap_servers=f"{services.LOOPBACK}:{services.free_kafka_port()}")
    broker = services.SERVICES["kafka"]
    broker.start(settings)
    try:
        kafka_topic.ensure_topic(settings)
        query = alerts.start(spark, settings, {"processingTime": settings.alert_trigger})
        try:
            traffic = Traffic(settings, settings.alert_clicks_per_minute, background_rate,
                              burst_every, seconds)
            traffic.start()
            traffic.join()
            if traffic.failure is not None:
                raise traffic.failure
            raised = _alert_times(settings, len(traffic.crossed_at_ms), timeout=60)
            batches = [p for p in query.recentProgress if p["numInputRows"]]
        finally:
            query.stop()
    finally:
        broker.stop(settings)
    latencies = sorted((raised[ip] - crossed) / 1000 for ip, crossed
                       in traffic.crossed_at_ms.items() if ip in raised)
    return {
        "seconds_of_traffic": seconds, "background_events_per_second": background_rate,
        "limit": settings.alert_clicks_per_minute, "trigger": settings.alert_trigger,
        "bursts": len(traffic.crossed_at_ms), "alerts": len(raised),
        "missed": sorted(set(traffic.crossed_at_ms) - set(raised)),
        "latency_p50_seconds": round(statistics.median(latencies), 2) if latencies else None,
        # Nearest rank: of 40 bursts, the slowest but none.
        "latency_p99_seconds": (round(latencies[math.ceil(0.99 * len(latencies)) - 1], 2)
                                if latencies else None),
        "latency_max_seconds": round(latencies[-1], 2) if latencies else None,
        "batch_phases_median_ms": {
            phase: statistics.median(p["durationMs"].get(phase, 0) for p in batches)
            for phase in ("latestOffset", "queryPlanning", "walCommit", "addBatch",
                          "commitOffsets", "triggerExecution")} if batches else None,
        "batch_median_seconds": (round(statistics.median(
            p["durationMs"]["triggerExecution"] for p in batches) / 1000, 2)
            if batches else None),
    }


def render(results: dict[str, Any]) -> str:
    return (f"click-fraud alerts: {results['alerts']} of {results['bursts']} bursts alerted "
            f"beside {results['background_events_per_second']:,} events/s, trigger "
            f"{results['trigger']}: latency p50 {results['latency_p50_seconds']} s, p99 "
            f"{results['latency_p99_seconds']} s, max {results['latency_max_seconds']} s "
            f"(alert batch median {results['batch_median_seconds']} s)")
