"""The events topic from Python, without Spark: where the broker is, the topic's creation,
its offsets, and a producer (``confluent-kafka``, librdkafka in the wheel).

Spark reads the topic (``bronze.ad_events``); everything else that talks to Kafka (the
services command, ``lakehouse generate --to kafka``, the tests) goes through here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_jobs.config import ConfigError, Settings
from spark_jobs.services import MAX_MESSAGE_BYTES, ServiceError

if TYPE_CHECKING:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

# How long a client waits for the broker before it says the broker does not answer.
ANSWER_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def bootstrap_address(settings: Settings) -> Address:
    """The first of ``kafka_bootstrap_servers`` as host and port."""
    first = settings.kafka_bootstrap_servers.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"kafka_bootstrap_servers: expected host:port, not {first!r}")
    return Address(host.strip("[]"), int(port))


def _client_settings(settings: Settings) -> dict[str, object]:
    return {"bootstrap.servers": settings.kafka_bootstrap_servers,
            # librdkafka logs every failed connection attempt to stderr; the caller reports
            # a broker that does not answer, once.
            "log_level": 0}


def admin(settings: Settings) -> AdminClient:
    from confluent_kafka.admin import AdminClient

    # Asking for a topic's metadata must not create it on a broker that allows that.
    return AdminClient({**_client_settings(settings), "allow.auto.create.topics": False})


def answers(settings: Settings, timeout: float = ANSWER_TIMEOUT_SECONDS) -> bool:
    """Whether the broker answers a metadata request within ``timeout`` seconds."""
    from confluent_kafka import KafkaException

    try:
        admin(settings).list_topics(timeout=timeout)
    except KafkaException:
        return False
    return True


def partitions(settings: Settings) -> int | None:
    """The topic's partition count, or None when it does not exist."""
    from confluent_kafka import KafkaException

    try:
        metadata = admin(settings).list_topics(settings.kafka_topic,
                                               timeout=ANSWER_TIMEOUT_SECONDS)
    except KafkaException as error:
        raise ServiceError(f"Kafka at {settings.kafka_bootstrap_servers} does not answer "
                           f"({error}): is it running? (lakehouse services start kafka)"
                           ) from None
    topic = metadata.topics.get(settings.kafka_topic)
    if topic is None or topic.error is not None:
        return None
    return len(topic.partitions)


def topic_id(settings: Settings) -> str | None:
    """The id the broker gave the topic when it was made: a topic deleted and made again
    under the same name gets a new one (and offsets from 0 again). None when it does not
    exist."""
    from confluent_kafka import KafkaError, KafkaException, TopicCollection

    client = admin(settings)  # held until the answer: a collected client drops it
    [future] = client.describe_topics(TopicCollection([settings.kafka_topic]),
                                      request_timeout=ANSWER_TIMEOUT_SECONDS).values()
    try:
        return str(future.result(timeout=ANSWER_TIMEOUT_SECONDS).topic_id)
    except KafkaException as error:
        if error.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        failure: object = error
    except TimeoutError:
        failure = f"no answer within {ANSWER_TIMEOUT_SECONDS:.0f} s"
    raise ServiceError(f"Kafka at {settings.kafka_bootstrap_servers} did not describe "
                       f"topic {settings.kafka_topic} ({failure}): is it running? "
                       f"(lakehouse services start kafka)")


def ensure_topic(settings: Settings) -> int:
    """Create ``kafka_topic`` with ``kafka_partitions`` partitions unless it exists; its
    partition count either way."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    existing = partitions(settings)
    if existing is not None:
        return existing
    client = admin(settings)  # held until the answer: a collected client drops it
    future = client.create_topics(
        [NewTopic(settings.kafka_topic, num_partitions=settings.kafka_partitions,
                  replication_factor=1)])[settings.kafka_topic]
    try:
        future.result(timeout=ANSWER_TIMEOUT_SECONDS)
    except KafkaException as error:
        if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # a racing creator
            raise ServiceError(f"cannot create topic {settings.kafka_topic}: {error}") from None
    return partitions(settings) or settings.kafka_partitions


def offsets(settings: Settings) -> dict[int, tuple[int, int]]:
    """Per partition, the oldest offset still held and the next offset to be written."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**_client_settings(settings), "group.id": "lakehouse-offsets",
                         "enable.auto.commit": False})
    try:
        count = partitions(settings) or 0
        return {partition: consumer.get_watermark_offsets(
                    TopicPartition(settings.kafka_topic, partition),
                    timeout=ANSWER_TIMEOUT_SECONDS)
                for partition in range(count)}
    finally:
        consumer.close()


def delete_before(settings: Settings, partition: int, offset: int) -> None:
    """Delete a partition's messages before ``offset``, as retention would age them out."""
    from confluent_kafka import TopicPartition

    client = admin(settings)  # held until the answer: a collected client drops it
    futures = client.delete_records(
        [TopicPartition(settings.kafka_topic, partition, offset)])
    for future in futures.values():
        future.result(timeout=ANSWER_TIMEOUT_SECONDS)


def producer(settings: Settings) -> Producer:
    """An idempotent producer: a retry inside the client never writes a message twice (the
    generator's own redeliveries are records it sends twice on purpose)."""
    from confluent_kafka import Producer

    return Producer({**_client_settings(settings), "enable.idempotence": True,
                     "linger.ms": 20, "compression.type": "lz4",
                     "message.max.bytes": MAX_MESSAGE_BYTES})


def send(producer: Producer, topic: str, records: Iterable[tuple[bytes | None, bytes]]
         ) -> int:
    """Send ``(key, value)`` pairs and wait until the broker has every one; their count."""
    sent = 0
    failures: list[str] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    for key, value in records:
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=delivered)
                break
            except BufferError:  # the client's queue is full: let it drain
                producer.poll(0.1)
        producer.poll(0)
        sent += 1
    if producer.flush(60) or failures:
        raise ServiceError(f"Kafka did not take every message sent to {topic}: "
                           f"{failures[:3] or 'the broker did not confirm within 60 s'}")
    return sent


def main() -> int:
    """``python -m spark_jobs.kafka_topic``: create the configured topic unless it exists
    (the Docker stack's one-shot set-up; ``lakehouse services start kafka`` does it too)."""
    from spark_jobs.config import load

    settings = load()
    count = ensure_topic(settings)
    print(f"topic {settings.kafka_topic} at {settings.kafka_bootstrap_servers}: "
          f"{count} partitions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
