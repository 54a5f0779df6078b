"""Messy ad events for the landing zone (contract sections 1 to 3), with the counts to expect.

Every record is generated with at most one deliberate fault, so its fate is known in
advance: the generator records, per reason code, how many records silver must quarantine,
how many distinct valid events it must keep and how many redeliveries it must drop. Files
are written under a hidden name and renamed into place, so a reader never sees half a file.
"""

from __future__ import annotations

import gzip
import json
import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from spark_jobs import reasons
from spark_jobs.expected_counts import ExpectedCounts
from spark_jobs.progress import SILENT, Steps
from spark_jobs.storage import write_atomically

if TYPE_CHECKING:
    from confluent_kafka import Producer

    from spark_jobs.config import Settings

EVENT_TYPES = ("view", "click", "purchase")
# YSB's shares: mostly views, few clicks; purchases are this project's extension.
EVENT_TYPE_WEIGHTS = (0.80, 0.15, 0.05)
AD_TYPES = ("banner", "modal", "sponsored-search", "mail", "mobile")
FRAUD_ADDRESS = "10.66.6.6"  # the address of --click-fraud's clicks
NON_ASCII_PAGES = ("página-ñ", "страница", "ページ-日本", "σελίδα", "ad-💡")


@dataclass(frozen=True)
class Mess:
    """Share of records (or of files, for the file-level knobs) carrying each kind of mess."""

    malformed: float = 0.01  # not JSON, truncated, an array, null, {}, invalid UTF-8
    missing_field: float = 0.01  # a required field missing, null, empty or of the wrong type
    bad_time: float = 0.005  # an event_time that does not parse
    future_time: float = 0.002  # more than 24 h after ingestion (clock skew)
    unknown_type: float = 0.005
    bad_price: float = 0.005  # a purchase without a valid price, or a negative one
    duplicate: float = 0.03  # a producer retry: the same event delivered again
    late: float = 0.02  # event_time minutes to days in the past, out of order
    schema_drift: float = 0.05  # fields a newer producer added
    long_line: float = 0.0002  # a valid record about 1 MiB long
    non_ascii: float = 0.02
    blank_line: float = 0.005  # blank lines are not records
    unmapped_ad: float = 0.01  # an ad the campaign mapping does not know (yet)
    # Valid events that are clicks from one address (FRAUD_ADDRESS), in place of other valid
    # events: at 20 events a second, 0.15 is some 170 clicks a minute (valid events are
    # about 94% of a messy feed), over the alert path's default limit of 100. Off by
    # default, so a seed's corpus stays what it was.
    click_fraud: float = 0.0
    gzip_files: float = 0.3
    crlf_files: float = 0.1
    bom_files: float = 0.1

    @classmethod
    def clean(cls) -> Mess:
        """No mess at all: every record valid and distinct, every file plain."""
        return cls(**{name: 0.0 for name in cls.__dataclass_fields__})

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not 0 <= value <= 1:
                raise ValueError(f"--{name.replace('_', '-')} must be between 0 and 1, not {value}")
        faults = (self.malformed + self.missing_field + self.bad_time + self.future_time
                  + self.unknown_type + self.bad_price)
        if faults > 1:
            raise ValueError(f"the record-level mess rates add up to {faults:.2f}, more than 1")


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


class EventGenerator:
    """Deterministic for a given seed and start time."""

    def __init__(self, seed: int, start: datetime, mess: Mess,
                 derive_missing_event_id: bool = False, campaigns: int = 100,
                 ads_per_campaign: int = 10, purchase_requires_price: bool = True) -> None:
        self.rng = random.Random(seed)
        self.start = start
        self.mess = mess
        self.derive_missing_event_id = derive_missing_event_id
        self.purchase_requires_price = purchase_requires_price
        self.campaign_ids = [self._uuid() for _ in range(campaigns)]
        self.ad_campaign = {self._uuid(): campaign for campaign in self.campaign_ids
                            for _ in range(ads_per_campaign)}
        self.ad_ids = list(self.ad_campaign)
        self.user_ids = [self._uuid() for _ in range(1000)]
        self.page_ids = [self._uuid() for _ in range(100)]
        self._delivered: list[str] = []  # valid records already sent, for redelivery
        self._recent_views: list[tuple[str, str]] = []  # (user, ad): what clicks follow
        self._sequence = 0

    def _uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    # -- campaign mapping ---------------------------------------------------------------

    def campaign_mappings(self) -> list[list[dict[str, object]]]:
        """Two mapping files: every ad from 30 days back, then some ads moved an hour ago."""
        initial = [{"ad_id": ad, "campaign_id": campaign,
                    "valid_from": iso(self.start - timedelta(days=30))}
                   for ad, campaign in self.ad_campaign.items()]
        moved = [{"ad_id": ad, "campaign_id": self.rng.choice(self.campaign_ids),
                  "valid_from": epoch_ms(self.start - timedelta(hours=1))}
                 for ad in self.rng.sample(self.ad_ids, max(1, len(self.ad_ids) // 20))]
        return [initial, moved]

    # -- events ---------------------------------------------------------------------------

    def _event_time(self, now: datetime) -> datetime:
        if self.rng.random() < self.mess.late:
            return now - timedelta(seconds=self.rng.uniform(60, 3 * 86400))
        return now - timedelta(milliseconds=self.rng.uniform(0, 5000))

    def _time_value(self, moment: datetime) -> object:
        """The accepted spellings of a time, in the mix producers send them."""
        style = self.rng.random()
        if style < 0.4:
            return iso(moment)
        if style < 0.6:
            zone = timezone(timedelta(hours=self.rng.choice((-5, 1, 5.5))))
            return moment.astimezone(zone).isoformat(timespec="milliseconds")
        if style < 0.8:
            return epoch_ms(moment)
        return str(epoch_ms(moment))  # YSB sends epoch milliseconds as a string

    def valid_event(self, now: datetime) -> dict[str, object]:
        if self.mess.click_fraud and self.rng.random() < self.mess.click_fraud:
            return self._fraudulent_click(now)
        event_type = self.rng.choices(EVENT_TYPES, EVENT_TYPE_WEIGHTS)[0]
        ad_id = (self._uuid() if self.rng.random() < self.mess.unmapped_ad
                 else self.rng.choice(self.ad_ids))
        user_id = self.rng.choice(self.user_ids)
        follows_view = self.rng.random() < 0.7  # most clicks follow a view of the same ad
        if event_type == "click" and follows_view and self._recent_views:
            user_id, ad_id = self.rng.choice(self._recent_views)
        elif event_type == "view":
            self._recent_views.append((user_id, ad_id))
            del self._recent_views[:-200]
        event: dict[str, object] = {
            "event_id": self._uuid(),
            "event_time": self._time_value(self._event_time(now)),
            "event_type": self.rng.choice((event_type, event_type.upper(), f" {event_type} ")),
            "ad_id": ad_id,
            "user_id": user_id,
            "page_id": (self.rng.choice(NON_ASCII_PAGES) if self.rng.random() < self.mess.non_ascii
                        else self.rng.choice(self.page_ids)),
            "ad_type": self.rng.choice(AD_TYPES),
            "ip_address": f"10.{self.rng.randrange(256)}.{self.rng.randrange(256)}.1",
        }
        if event_type == "purchase":
            price = round(self.rng.uniform(0.5, 500), 2)
            event["price"] = price if self.rng.random() < 0.7 else f"{price:.2f}"
        if self.rng.random() < self.mess.schema_drift:
            event["user_agent"] = self.rng.choice(("Mozilla/5.0", "curl/8.0", "Ω-bot"))
            event["experiment"] = {"arm": self.rng.choice("AB"), "since": 3}
        if self.rng.random() < self.mess.long_line:
            event["payload"] = "x" * (1024 * 1024 - 600)
        return event

    def _fraudulent_click(self, now: datetime) -> dict[str, object]:
        """A click of ``FRAUD_ADDRESS`` on an ad of the mapping, as a bot would make it."""
        return {"event_id": self._uuid(), "event_time": iso(now), "event_type": "click",
                "ad_id": self.rng.choice(self.ad_ids), "user_id": self.rng.choice(self.user_ids),
                "page_id": self.rng.choice(self.page_ids), "ad_type": self.rng.choice(AD_TYPES),
                "ip_address": FRAUD_ADDRESS}

    def _faulty(self, now: datetime) -> tuple[bytes, str] | None:
        """A record with exactly one fault and its reason code, or None for a clean record."""
        mess = self.mess
        choices: list[tuple[float, Callable[[datetime], tuple[bytes, str]]]] = [
            (mess.malformed, self._malformed),
            (mess.missing_field, self._missing_field),
            (mess.bad_time, self._bad_time),
            (mess.future_time, self._future_time),
            (mess.unknown_type, self._unknown_type),
            (mess.bad_price, self._bad_price),
        ]
        draw = self.rng.random()
        for share, make in choices:
            if draw < share:
                return make(now)
            draw -= share
        return None

    def _malformed(self, now: datetime) -> tuple[bytes, str]:
        text = json.dumps(self.valid_event(now))
        kind = self.rng.randrange(6)
        if kind == 0:
            return b"this is not json", reasons.MALFORMED_JSON
        if kind == 1:
            return text[: len(text) // 2].encode(), reasons.MALFORMED_JSON
        if kind == 2:
            return (self.rng.choice((b"[1, 2, 3]", b"null", b"42", b'"text"')),
                    reasons.NOT_AN_OBJECT)
        if kind == 3:
            return b"{}", reasons.EMPTY_RECORD
        if kind == 4:
            # Bytes that are not UTF-8 inside an otherwise valid record.
            return (text.encode().replace(b'"ad_type": "', b'"ad_type": "\xff\xfe', 1),
                    reasons.INVALID_ENCODING)
        return text.encode()[:-1] + b",}", reasons.MALFORMED_JSON

    def _missing_field(self, now: datetime) -> tuple[bytes, str]:
        event = self.valid_event(now)
        name = self.rng.choice(("event_id", "event_time", "event_type", "ad_id"))
        how = self.rng.choice(("absent", "null", "empty", "wrong_type"))
        if how == "absent":
            del event[name]
        elif how == "null":
            event[name] = None
        elif how == "empty":
            event[name] = ""
        else:
            event[name] = self.rng.choice(([1, 2], {"nested": True}, True))
        if name == "event_id" and how != "wrong_type" and self.derive_missing_event_id:
            return json.dumps(event).encode(), reasons.VALID
        code = {
            "event_id": reasons.INVALID_EVENT_ID if how == "wrong_type"
            else reasons.MISSING_EVENT_ID,
            "event_time": reasons.BAD_EVENT_TIME if how in ("wrong_type", "empty")
            else reasons.MISSING_EVENT_TIME,
            "event_type": reasons.UNKNOWN_EVENT_TYPE if how in ("wrong_type",)
            else reasons.MISSING_EVENT_TYPE,
            "ad_id": reasons.INVALID_AD_ID if how == "wrong_type" else reasons.MISSING_AD_ID,
        }[name]
        return json.dumps(event).encode(), code

    def _bad_time(self, now: datetime) -> tuple[bytes, str]:
        event = self.valid_event(now)
        event["event_time"] = self.rng.choice((
            "yesterday", "2026-13-45T00:00:00Z", "2026-11-22 10:15:30",
            "2026-11-22T10:15:30", "1e999", "12:00", "-5",
        ))
        return json.dumps(event).encode(), reasons.BAD_EVENT_TIME

    def _future_time(self, now: datetime) -> tuple[bytes, str]:
        event = self.valid_event(now)
        # Well past the 24 h tolerance, so a few hours between generating and ingesting
        # cannot change the verdict. From the start at the earliest: a corpus spread over a
        # past day (``span``) is ingested after its start, and an event 30 hours after the
        # first file's time was only 6 hours ahead of that (make bench's corpus counted
        # 202 of 1,837 such records as valid events).
        base = max(now, self.start)
        event["event_time"] = iso(base + timedelta(hours=self.rng.uniform(30, 96)))
        return json.dumps(event).encode(), reasons.FUTURE_EVENT_TIME

    def _unknown_type(self, now: datetime) -> tuple[bytes, str]:
        event = self.valid_event(now)
        event["event_type"] = self.rng.choice(("impression", "hover", "clik", "VIEWS"))
        return json.dumps(event).encode(), reasons.UNKNOWN_EVENT_TYPE

    def _bad_price(self, now: datetime) -> tuple[bytes, str]:
        event = self.valid_event(now)
        event["event_type"] = "purchase"
        problem = self.rng.randrange(4)
        if problem == 0:
            event.pop("price", None)
        elif problem == 1:
            event["price"] = -round(self.rng.uniform(0.01, 100), 2)
        elif problem == 2:
            event["price"] = "free"
        else:
            event["price"] = None
        if problem in (0, 3) and not self.purchase_requires_price:
            return json.dumps(event).encode(), reasons.VALID  # no price: allowed, no revenue
        return json.dumps(event).encode(), reasons.BAD_PRICE

    def records(self, count: int, now: datetime, expected: ExpectedCounts) -> Iterator[bytes]:
        """``count`` records (blank lines come on top), counted into ``expected``."""
        for _ in range(count):
            if self.rng.random() < self.mess.blank_line:
                expected.blank_lines += 1
                yield self.rng.choice((b"", b"   "))
            # Draw before looking at the pool, so the random sequence (and so every later
            # record) does not depend on which records were valid.
            redeliver = self.rng.random() < self.mess.duplicate
            if redeliver and self._delivered:
                expected.delivered += 1
                expected.duplicates += 1
                yield self.rng.choice(self._delivered).encode()
                continue
            faulty = self._faulty(now)
            if faulty is not None and faulty[1] != reasons.VALID:
                expected.delivered += 1
                expected.invalid_by_reason[faulty[1]] += 1
                yield faulty[0]
                continue
            line = faulty[0].decode() if faulty else json.dumps(
                self.valid_event(now), ensure_ascii=self.rng.random() < 0.5)
            expected.delivered += 1
            expected.valid_distinct += 1
            if len(self._delivered) < 50_000:
                self._delivered.append(line)
            else:
                self._delivered[self.rng.randrange(len(self._delivered))] = line
            yield line.encode()

    def file_bytes(self, lines: list[bytes]) -> tuple[bytes, str]:
        """The file's content and extension, with the file-level mess applied."""
        ending = b"\r\n" if self.rng.random() < self.mess.crlf_files else b"\n"
        body = ending.join(lines) + ending
        if self.rng.random() < self.mess.bom_files:
            body = b"\xef\xbb\xbf" + body
        if self.rng.random() < self.mess.gzip_files:
            return gzip.compress(body, mtime=0), ".jsonl.gz"
        return body, ".jsonl"

    def next_file_name(self, prefix: str) -> str:
        self._sequence += 1
        return f"{prefix}-{self._sequence:06d}-{self._uuid()[:8]}"


@dataclass(frozen=True)
class GenerateRequest:
    events: int
    seed: int
    start: datetime
    mess: Mess
    events_per_file: int = 5000
    rate: float | None = None  # events per second; None writes everything at once
    # Event time spread evenly over this span, ending at ``start`` (without a rate): a day
    # of traffic exercises windows, watermarks and dates as production does.
    span: timedelta = timedelta(0)
    derive_missing_event_id: bool = False
    purchase_requires_price: bool = True


class EventSink(Protocol):
    """Where generated records go, if not to files in the landing zone."""

    def deliver(self, records: list[bytes], counts: ExpectedCounts) -> None:
        """Send ``records``; correct ``counts`` for what the sink does not deliver."""


class KafkaSink:
    """Each record a message of the topic, keyed by its ``user_id`` (the contract's key; none
    for a record without one). Blank lines are an artefact of files, not records: a producer
    sends no message for them, so they are neither sent nor counted."""

    def __init__(self, producer: Producer, topic: str) -> None:
        self.producer = producer
        self.topic = topic

    def __str__(self) -> str:
        return f"Kafka topic {self.topic}"

    def deliver(self, records: list[bytes], counts: ExpectedCounts) -> None:
        from spark_jobs.kafka_topic import send

        messages = [(message_key(record), record) for record in records if record.strip()]
        counts.blank_lines = 0
        counts.files = 0
        send(self.producer, self.topic, messages)


def message_key(record: bytes) -> bytes | None:
    try:
        user = json.loads(record).get("user_id")
    except (ValueError, AttributeError):  # not JSON, or JSON but not an object
        return None
    return user.encode() if isinstance(user, str) else None


def rules_of(settings: Settings) -> dict[str, bool]:
    """The validation settings a generator must know to say which records are valid."""
    return {"derive_missing_event_id": settings.derive_missing_event_id,
            "purchase_requires_price": settings.purchase_requires_price}


def generate(request: GenerateRequest, landing_events: Path, landing_campaigns: Path,
             expected_file: Path, should_stop: Callable[[], bool] = lambda: False,
             steps: Steps = SILENT, sink: EventSink | None = None) -> ExpectedCounts:
    """Write events and the campaign mapping; add what to expect to ``expected_file``.

    The events go to files in ``landing_events``, or to ``sink`` when one is given; the
    mapping always goes to ``landing_campaigns``."""
    generator = EventGenerator(request.seed, request.start, request.mess,
                               request.derive_missing_event_id,
                               purchase_requires_price=request.purchase_requires_price)
    run_name = f"seed{request.seed}-{request.start:%Y%m%dT%H%M%S}"
    for number, mapping in enumerate(generator.campaign_mappings()):
        lines = "".join(json.dumps(row) + "\n" for row in mapping).encode()
        write_atomically(landing_campaigns, f"campaigns-{run_name}-{number}.jsonl", lines)

    total = ExpectedCounts()
    remaining = request.events
    steps.start(f"writing events to {landing_events if sink is None else sink}",
                None if request.rate else request.events)
    while (remaining > 0 or request.rate) and not should_stop():
        batch = min(remaining, request.events_per_file) if not request.rate else max(
            1, int(request.rate))
        started = time.monotonic()
        done = request.events - remaining
        now = (datetime.now(UTC) if request.rate
               else request.start - request.span * (1 - done / max(request.events, 1)))
        file_counts = ExpectedCounts(files=1)
        lines = list(generator.records(batch, now, file_counts))
        if sink is not None:
            sink.deliver(lines, file_counts)
        else:
            content, extension = generator.file_bytes(lines)
            write_atomically(landing_events, generator.next_file_name(f"events-{run_name}")
                             + extension, content)
        total.add(file_counts)
        _record(expected_file, file_counts)
        remaining -= batch
        steps.advance(batch)
        if request.rate:
            time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    return total


def _record(expected_file: Path, counts: ExpectedCounts) -> None:
    """Add to the running totals, so several generate runs can be checked together."""
    totals = ExpectedCounts.load(expected_file)
    totals.add(counts)
    expected_file.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(expected_file.parent, expected_file.name,
                     json.dumps(totals.as_json(), indent=2).encode())
