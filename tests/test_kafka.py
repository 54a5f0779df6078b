"""The Kafka source against a real broker, started by the project's own command (``lakehouse
services start kafka``): one broker for the module, a topic and a lake per test."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from spark_jobs import audit, kafka_topic, streaming
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.config import ConfigError, Settings
from spark_jobs.ops import alerts
from spark_jobs.services import free_kafka_port
from spark_jobs.tables import read as read_table
from tests.conftest import make_settings
from tests.processes import (
    committed_versions,
    generate,
    run_lakehouse,
    start_stream,
    wait_for_commits,
)

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Broker:
    root: Path  # the services root: the broker's data and log
    port: int

    @property
    def env(self) -> dict[str, str]:
        return {"LAKEHOUSE_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{self.port}"}

    def services(self, action: str) -> subprocess.CompletedProcess[str]:
        return run_lakehouse("services", action, "kafka", "--root", str(self.root),
                             env=self.env)

    def lake(self, root: Path, topic: str, **overrides: object) -> Settings:
        """The settings of a lake reading ``topic`` from this broker, for in-process runs."""
        return make_settings(root, source="kafka", kafka_topic=topic,
                             kafka_bootstrap_servers=f"127.0.0.1:{self.port}", **overrides)

    def topic_env(self, topic: str, **extra: str) -> dict[str, str]:
        """What a lake reading ``topic`` from this broker is configured with."""
        return {**self.env, "LAKEHOUSE_SOURCE": "kafka", "LAKEHOUSE_KAFKA_TOPIC": topic,
                **extra}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    broker = Broker(tmp_path_factory.mktemp("kafka-services"), free_kafka_port())
    started = broker.services("start")
    assert started.returncode == 0, started.stderr
    yield broker
    stopped = broker.services("stop")
    assert stopped.returncode == 0, stopped.stderr


def listening_addresses(port: int) -> set[str]:
    listed = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True,
                            text=True, check=True).stdout
    return {line.split()[3].rsplit(":", 1)[0] for line in listed.splitlines()}


def test_services_start_once_answer_on_loopback_and_say_so_in_one_line(broker, tmp_path) -> None:
    again = broker.services("start")
    # Already running: left alone, and the line says where and what topic.
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == (f"kafka: already running, 127.0.0.1:{broker.port}, "
                                    f"topic ad-events (2 partitions)")
    status = broker.services("status")
    assert status.returncode == 0 and len(status.stdout.strip().splitlines()) == 1
    assert status.stdout.startswith("kafka: running (broker pid ")
    # Loopback only, the listener and the controller alike (Java shows IPv4 as mapped).
    for port in (broker.port, broker.port + 1):
        assert listening_addresses(port) <= {"127.0.0.1", "[::ffff:127.0.0.1]"}, port
        assert listening_addresses(port), f"nothing listens on {port}"
    # A second root cannot start a broker on a port the first one holds.
    other = run_lakehouse("services", "start", "kafka", "--root", str(tmp_path / "other"),
                          env=broker.env)
    assert other.returncode == 1
    assert f"port 127.0.0.1:{broker.port} is taken by another program" in other.stderr
    assert not (tmp_path / "other" / "services" / "kafka" / "data").exists()


def bronze_offsets(spark, lake: Path) -> list[tuple[int, int]]:
    rows = (spark.read.format("delta").load(bronze.TABLE.path(make_settings(lake)))
            .select("kafka_partition", "kafka_offset").collect())
    return sorted((row.kafka_partition, row.kafka_offset) for row in rows)


def test_exactly_once_from_kafka_across_a_driver_kill_and_a_broker_restart(
        spark, broker, tmp_path) -> None:
    lake = tmp_path / "lake"
    # Small batches, so the kill lands with most of the topic still unread.
    env = broker.topic_env("kill-restart", LAKEHOUSE_KAFKA_MAX_OFFSETS_PER_TRIGGER="250")
    first = generate(lake, "--to", "kafka", "--events", "3000", "--seed", "21", env=env)
    table = Path(bronze.TABLE.path(make_settings(lake)))

    stream = start_stream(lake, "bronze", "--trigger", "1s", env=env)
    wait_for_commits(table, 3, stream)
    os.killpg(stream.pid, signal.SIGKILL)
    stream.wait(timeout=60)
    assert committed_versions(table) < 12, "the topic was read whole before the kill: no test"

    # A new driver resumes from its checkpoint; the broker restarts under it while it runs,
    # and more events arrive after.
    stream = start_stream(lake, "bronze", "--trigger", "1s", env=env)
    wait_for_commits(table, committed_versions(table) + 2, stream)
    for action in ("stop", "start"):
        done = broker.services(action)
        assert done.returncode == 0, done.stderr
    second = generate(lake, "--to", "kafka", "--events", "1000", "--seed", "22", env=env)
    wait_for_commits(table, committed_versions(table) + 2, stream)
    assert stream.poll() is None, f"the stream died with the broker:\n{stream.log()[-3000:]}"
    stream.send_signal(signal.SIGTERM)
    assert stream.wait(timeout=120) == 0, stream.log()[-3000:]

    # Drained in this process's session (a driver's start spared), every layer.
    settings = broker.lake(lake, "kill-restart")
    streaming.run_available_now(spark, settings, streaming.parse_layers(None))
    # Every offset the topic holds is in bronze exactly once (blank lines are not sent).
    held = kafka_topic.offsets(settings)
    expected = sorted((partition, offset) for partition, (low, high) in held.items()
                      for offset in range(low, high))
    assert len(expected) == first["delivered"] + second["delivered"]
    assert bronze_offsets(spark, lake) == expected
    # And through silver: the generator's promise, reason by reason.
    accounting = audit.account(spark, settings, settings.expected_counts_file)
    assert accounting.identity_holds and accounting.matches_expected, accounting.as_json()


def read_into_bronze(spark, broker: Broker, lake: Path, topic: str, events: int, seed: int
                     ) -> tuple[dict[str, str], Settings, dict]:
    """A lake reading ``topic``: ``events`` sent, then read into bronze. Its environment,
    settings and what the generator delivered."""
    env = broker.topic_env(topic)
    settings = broker.lake(lake, topic)
    delivered = generate(lake, "--to", "kafka", "--events", str(events), "--seed", str(seed),
                         env=env)
    streaming.run_available_now(spark, settings, ["bronze"])
    return env, settings, delivered


def accept_the_loss_then_resume(spark, settings: Settings, env: dict[str, str], seed: int
                                ) -> dict:
    """The loss accepted once; then, with the check back on, 50 more events read as
    before. What the generator delivered the second time."""
    streaming.run_available_now(spark, settings.replace(kafka_fail_on_data_loss=False),
                                ["bronze"])
    delivered = generate(settings.root, "--to", "kafka", "--events", "50", "--seed",
                         str(seed), env=env)
    streaming.run_available_now(spark, settings, ["bronze"])
    return delivered


def test_offsets_lost_while_the_stream_was_down_stop_it_until_the_loss_is_accepted(
        spark, broker, tmp_path) -> None:
    lake = tmp_path / "lake"
    env, settings, first = read_into_bronze(spark, broker, lake, "data-loss", 400, 31)
    read = kafka_topic.offsets(settings)

    # More events, then every message bronze has not read deleted, as retention would.
    generate(lake, "--to", "kafka", "--events", "400", "--seed", "32", env=env)
    held = kafka_topic.offsets(settings)
    for partition, (_, high) in held.items():
        kafka_topic.delete_before(settings, partition, high)
    lost = [f"data-loss-{partition} offsets {read[partition][1]} to {high - 1}"
            for partition, (_, high) in held.items() if high > read[partition][1]]

    # The command a user runs says so in its last line and exits 1 ...
    refused = run_lakehouse("stream", "--root", str(lake), "--layers", "bronze",
                            "--available-now", env=env)
    assert refused.returncode == 1
    message = refused.stderr.strip().splitlines()[-1]
    assert message.startswith("lakehouse stream: stream bronze_ad_events failed: Kafka "
                              "no longer holds messages bronze had not read ("), message
    assert any(range_text in message for range_text in lost), (lost, message)
    # ... and a second try does not skip by itself either.
    with pytest.raises(streaming.StreamFailed, match="no longer holds messages"):
        streaming.run_available_now(spark, settings, ["bronze"])
    assert len(bronze_offsets(spark, lake)) == first["delivered"]

    # Accepted once, the stream goes on from the oldest message still held; then new
    # events flow as before.
    third = accept_the_loss_then_resume(spark, settings, env, 33)
    offsets = bronze_offsets(spark, lake)
    assert len(offsets) == first["delivered"] + third["delivered"]
    assert len(set(offsets)) == len(offsets)


def made_again(settings: Settings) -> None:
    """The topic deleted, then made again under its name, empty, offsets from 0 again."""
    client = kafka_topic.admin(settings)
    for future in client.delete_topics([settings.kafka_topic]).values():
        future.result(timeout=30)
    deadline = time.monotonic() + 60
    while kafka_topic.partitions(settings) is not None:  # deletion completes in the back
        assert time.monotonic() < deadline, "the topic was not deleted within a minute"
        time.sleep(0.5)
    kafka_topic.ensure_topic(settings)


def test_a_topic_made_again_stops_the_stream_until_the_loss_is_accepted(
        spark, broker, tmp_path) -> None:
    lake = tmp_path / "lake"
    env, settings, first = read_into_bronze(spark, broker, lake, "made-again", 300, 61)
    old_id = kafka_topic.topic_id(settings)

    # Deleted and made again: its offsets start at 0 again, with fewer messages than bronze
    # has read, so on the old offsets the stream would wait past them. A running stream's
    # check between batches, and every start, stop on it, naming both ids.
    made_again(settings)
    second = generate(lake, "--to", "kafka", "--events", "100", "--seed", "62", env=env)
    new_id = kafka_topic.topic_id(settings)
    assert new_id != old_id
    made_again_message = re.escape(
        f"made again since bronze last read it (topic id {old_id}, now {new_id})")
    with pytest.raises(ConfigError, match=made_again_message):
        bronze.check_topic_unchanged(settings)  # the runner's check between batches
    with pytest.raises(ConfigError, match=made_again_message):
        streaming.run_available_now(spark, settings, ["bronze"])
    assert len(bronze_offsets(spark, lake)) == first["delivered"]  # nothing read or skipped

    # Accepted once: the new topic from its first message; its offsets repeat the old
    # topic's, its messages are new rows all the same. Then new events flow as before.
    third = accept_the_loss_then_resume(spark, settings, env, 63)
    ids = [row.bronze_id for row in spark.read.format("delta")
           .load(bronze.TABLE.path(settings)).select("bronze_id").collect()]
    assert len(ids) == len(set(ids)) == (first["delivered"] + second["delivered"]
                                         + third["delivered"])
    assert sum(f"@{new_id}:" in bronze_id for bronze_id in ids) == (second["delivered"]
                                                                   + third["delivered"])
    held = kafka_topic.offsets(settings)
    assert sum(high - low for low, high in held.values()) == (second["delivered"]
                                                              + third["delivered"])


def test_the_lines_of_files_sent_by_any_client_give_the_accounting_of_the_files(
        spark, broker, tmp_path) -> None:
    import gzip

    # A landing zone's files, every kind of file-level mess included ...
    files_lake = tmp_path / "files"
    generate(files_lake, "--events", "1500", "--events-per-file", "300", "--seed", "51")
    from_files = make_settings(files_lake)
    # ... and exactly their records as messages of a plain client: no key, one line each
    # (what a file holds, less its encoding: BOM, CRLF, gzip; blank lines are not records).
    kafka_lake = broker.lake(tmp_path / "kafka", "same-records")
    kafka_topic.ensure_topic(kafka_lake)
    records: list[bytes] = []
    for path in sorted(from_files.landing_events.iterdir()):
        content = path.read_bytes()
        text = gzip.decompress(content) if path.name.endswith(".gz") else content
        for line in text.removeprefix(b"\xef\xbb\xbf").split(b"\n"):
            if line.strip():
                records.append(line.removesuffix(b"\r"))
    kafka_topic.send(kafka_topic.producer(kafka_lake), "same-records",
                     ((None, record) for record in records))
    shutil.copytree(from_files.landing_campaigns, kafka_lake.landing_campaigns)

    accountings = []
    for settings in (from_files, kafka_lake):
        streaming.run_available_now(spark, settings, ["bronze", "silver"])
        accountings.append(audit.account(spark, settings))
    by_files, by_kafka = accountings
    # bronze == messages, and the same silver, quarantine (reason by reason) and
    # duplicates as the files gave.
    assert by_kafka.delivered == len(records) == by_files.delivered
    assert (by_kafka.silver_rows, by_kafka.quarantine_by_reason, by_kafka.duplicates) == (
        by_files.silver_rows, by_files.quarantine_by_reason, by_files.duplicates)
    assert by_kafka.identity_holds and by_files.identity_holds


def alert_messages(settings: Settings) -> list[tuple[str, dict]]:
    """Every message of the alert topic, as (key, value), oldest first per partition."""
    import json

    from confluent_kafka import Consumer, TopicPartition

    alert_settings = alerts.alert_topic_settings(settings)
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "group.id": "test-alerts", "enable.auto.commit": False})
    try:
        ends = kafka_topic.offsets(alert_settings)
        consumer.assign([TopicPartition(settings.alert_topic, partition, low)
                         for partition, (low, _) in ends.items()])
        remaining = sum(high - low for low, high in ends.values())
        messages = []
        deadline = time.monotonic() + 60
        while len(messages) < remaining and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                messages.append((message.key().decode(), json.loads(message.value())))
        assert len(messages) == remaining, "the alert topic could not be read whole"
        return messages
    finally:
        consumer.close()


def fraud_clicks() -> list[bytes]:
    """Clicks of three addresses over the limit (6 > 5) in three minutes, each with a
    redelivery that must not count, and a busy address at the limit."""
    import json

    def click(event_id: str, ip: str, minute: int, second: int) -> bytes:
        return json.dumps({"event_id": event_id, "event_type": "click", "ad_id": "ad-1",
                           "ip_address": ip,
                           "event_time": f"2026-11-27T10:{minute:02d}:{second:02d}Z"}).encode()

    records = []
    for n, ip in enumerate(("10.6.6.1", "10.6.6.2", "10.6.6.3")):
        records += [click(f"{ip}-{k}", ip, n, 5 * k) for k in range(6)]
        records.append(click(f"{ip}-0", ip, n, 0))  # a redelivery of the first
        records += [click(f"busy-{n}-{k}", "10.0.0.1", n, 5 * k) for k in range(5)]
    return records


def test_alerts_from_kafka_are_published_at_least_once_and_recorded_once_across_a_kill(
        spark, broker, tmp_path) -> None:
    lake = tmp_path / "lake"
    env = broker.topic_env("clicks", LAKEHOUSE_ALERT_TOPIC="clicks-alerts",
                           LAKEHOUSE_ALERT_CLICKS_PER_MINUTE="5")
    settings = broker.lake(lake, "clicks", alert_topic="clicks-alerts",
                           alert_clicks_per_minute=5)
    kafka_topic.ensure_topic(settings)
    records = fraud_clicks()
    kafka_topic.send(kafka_topic.producer(settings), "clicks", ((None, r) for r in records))

    # The driver dies after publishing its first batch's alerts, before it records them.
    crashed = start_stream(lake, "ops", "--trigger", "1s",
                           env={**env, "LAKEHOUSE_CRASH_AT": "ops_alerts.after_publish"})
    assert crashed.wait(timeout=180) != 0
    assert "crash point ops_alerts.after_publish" in crashed.log()
    published_before_the_kill = alert_messages(settings)
    assert published_before_the_kill, "nothing was published before the kill: no test"

    # The next driver replays that batch: the same alerts, published again, recorded once.
    stream = start_stream(lake, "ops", "--trigger", "1s", env=env)
    recorded_table = Path(alerts.TABLE.path(settings))
    wait_for_commits(recorded_table, 2, stream)  # created, then the append
    stream.send_signal(signal.SIGTERM)
    assert stream.wait(timeout=120) == 0, stream.log()[-3000:]

    recorded = {row.alert_id: row for row in read_table(spark, settings, alerts.TABLE).collect()}
    assert sorted(row.ip_address for row in recorded.values()) == [
        "10.6.6.1", "10.6.6.2", "10.6.6.3"]
    assert all(row.clicks == 6 for row in recorded.values())  # the redelivery counted once
    published = alert_messages(settings)
    # At least once: every recorded alert was published, and nothing else was; a message
    # published twice is the same alert (id and content) both times.
    assert {key for key, _ in published} == set(recorded)
    assert len(published) == len(recorded) + len(published_before_the_kill)
    for key, value in published:
        assert value["alert_id"] == key and value["clicks"] == recorded[key].clicks
        assert value == next(v for k, v in published if k == key)
