"""``gold.user_sessions``: what each user did in one sitting.

Grain: one row per session: a run of one ``user_id``'s silver events whose gaps in event
time are at most ``session_gap`` (30 minutes by default). An event without a
``user_id`` belongs to no session. ``session_end`` is the session's last event (the session
closes ``session_gap`` after it); ``campaigns`` are the distinct campaigns its events' ads
were mapped to at their times; ``ended_in_purchase`` tells whether its last event (by time,
then ``event_id``) was a purchase.

Two runners, one meaning. The batch recomputation (``user_sessions``) numbers each user's
runs of events with window functions over silver, the sessions Spark SQL's
``session_window`` makes. The stream keeps each user's open sessions in Spark's
state store (``transformWithState``, RocksDB) and closes a session with an event-time
timer once the watermark passes its last event plus the gap: from then on no event on
time can reach it. A closed session is written once, ``status = 'closed'``. A session
still open is in the table too, ``status = 'open'``, replaced (MERGE on ``user_id`` and
``session_start``) each time an event grows it; when an event joins two open sessions, or
an earlier event moves a session's start, the row it replaces is deleted in the same
commit. So the table answers "who is active now" as well as history, and a reader never
sees a session twice. An event at or behind the watermark cannot be added (the session it
belongs to may be closed and written): it goes to ``ops.late_data``.

A reprocess (``rebuild``) recomputes the closed sessions that touch its dates from one
snapshot of silver, late events included, and leaves the open ones to the stream, whose
state holds them (see the function).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import TYPE_CHECKING

from pyspark.sql import Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.config import Settings, interval_micros, interval_seconds, spark_interval
from spark_jobs.delta_writes import batch_time, idempotent_dml, start_exactly_once, time_bounds
from spark_jobs.faults import crash_point
from spark_jobs.gold import campaign_stats, writer
from spark_jobs.gold.watermark import carried_by_commit, latest_committed, micros, naive_utc
from spark_jobs.ops import late_data, stream_progress
from spark_jobs.range_rebuild import Change, read_current, rebuild_range
from spark_jobs.silver import ad_campaigns
from spark_jobs.silver import ad_events as silver
from spark_jobs.tables import TableSpec, ensure_table
from spark_jobs.tables import read as read_table

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    from spark_jobs.dates import DateRange

SESSION_COLUMNS = [
    StructField("user_id", StringType(), False),
    StructField("session_start", TimestampType(), False),
    StructField("session_end", TimestampType(), False),  # the last event's time
    StructField("events", LongType(), False),
    *campaign_stats.COUNT_FIELDS,
    StructField("campaigns", ArrayType(StringType(), False), False),  # sorted, distinct
    StructField("ended_in_purchase", BooleanType(), False),
]
SCHEMA = StructType([*SESSION_COLUMNS, StructField("status", StringType(), False)])

TABLE = TableSpec.declared("gold.user_sessions", SCHEMA)
QUERY_NAME = "gold_user_sessions"  # the stream this module starts
LAYER = TABLE.name  # in the late-data ledger
# The Delta table the stream reads: VACUUM of it keeps what the stream has yet to read.
SOURCE_TABLE = silver.TABLE
# The gap makes the sessions in state and in the table: they must not mix (``checkpoints``).
STATE_SETTINGS = ("session_gap",)
OPEN, CLOSED = "open", "closed"
# What the stateful step emits besides sessions: a row that the MERGE deletes (an open
# session another one absorbed), and an event too late to be added (for the ledger).
SUPERSEDED, LATE = "superseded", "late"
# Of two rows a micro-batch emits for one session, the one to keep: a session the timer
# closed after an event grew it in the same batch is closed.
PRECEDENCE = {OPEN: 0, SUPERSEDED: 1, CLOSED: 2, LATE: 3}
# The stateful step's rows: sessions, plus the watermark the step saw (for the ledger).
CHANGES = StructType([*SCHEMA.fields, StructField("watermark_ms", LongType(), False)])
# A change as the processor makes it: ``CHANGES`` with times in microseconds and revenue in
# cents, integers it computes with as they are (``session_changes`` makes the columns).
PROCESSOR_CHANGE = StructType([
    StructField("user_id", StringType(), False),
    StructField("session_start_us", LongType(), False),
    StructField("session_end_us", LongType(), False),
    *(StructField(name, LongType(), False)
      for name in ("events", "views", "clicks", "purchases", "revenue_cents")),
    StructField("campaigns", ArrayType(StringType(), False), False),
    StructField("ended_in_purchase", BooleanType(), False),
    StructField("status", StringType(), False),
    StructField("watermark_ms", LongType(), False),
])
CHANGE_NAMES = PROCESSOR_CHANGE.fieldNames()
# What the processor emits: each change as one JSON object (``PROCESSOR_CHANGE``), which the
# JVM parses. PySpark turns every frame a processor returns into Arrow column by column, at
# about 0.2 ms a column whatever its rows: twelve columns for each user's one or two rows
# cost more than all the rest of a steady feed's stateful step in Python (make bench).
PROCESSOR_OUTPUT = StructType([StructField("change", StringType(), False)])
# The silver columns a session is made of.
INPUTS = ("event_id", "event_time", "event_type", "user_id", "ad_id", "price")


# ----------------------------------------------------------------------------------------
# The batch recomputation.

def user_sessions(events: DataFrame, mapping: DataFrame, session_gap: str,
                  watermark: datetime | None) -> DataFrame:
    """Silver events and the SCD2 mapping to one row per session; a session is closed when
    ``watermark`` (naive UTC; None: no watermark yet) is past its end plus the gap, as the
    stream closes it (``Session.closed_under``)."""
    gap = spark_interval(session_gap)
    last_event = F.struct("event_time", "event_id")
    # Sessions as runs, the stream's way (``runs``): by time, an event more than the gap
    # after the one before starts a new session, and a running count of those starts
    # numbers each user's sessions. The same sessions as ``session_window``, which merges
    # an event starting at or before a session's end (its last event plus the gap), but
    # about 1.5x faster: its partial aggregation before the shuffle keeps one group per
    # event (each event starts a window of its own), so it reduces nothing.
    by_time = Window.partitionBy("user_id").orderBy("event_time", "event_id")
    event_us = F.unix_micros("event_time")
    starts_session = F.coalesce(event_us - F.lag(event_us).over(by_time)
                                > interval_micros(session_gap), F.lit(True))
    session_number = F.sum(starts_session.cast("int")).over(
        by_time.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    sessions = (ad_campaigns.campaign_at(events.where(F.col("user_id").isNotNull()), mapping)
                .withColumn("_session", session_number)
                .groupBy("user_id", "_session")
                .agg(F.min("event_time").alias("session_start"),
                     F.max("event_time").alias("session_end"),
                     F.count("*").alias("events"), *campaign_stats.event_counts(),
                     F.array_sort(F.collect_set("campaign_id")).alias("campaigns"),
                     (F.max_by("event_type", last_event) == "purchase")
                     .alias("ended_in_purchase")))
    closed = (F.lit(False) if watermark is None else
              F.col("session_end") + F.expr(f"INTERVAL {gap}")
              <= F.timestamp_micros(F.lit(micros(watermark))))
    return sessions.select(*(field.name for field in SESSION_COLUMNS),
                           F.when(closed, CLOSED).otherwise(OPEN).alias("status"))


# ----------------------------------------------------------------------------------------
# The stream's sessions, in plain Python: what the processor keeps per user.

@dataclass(frozen=True)
class Session:
    start: datetime  # naive UTC, as silver's timestamps
    end: datetime
    events: int
    views: int
    clicks: int
    purchases: int
    revenue_cents: int
    campaigns: frozenset[str]
    last: tuple[datetime, str, str]  # the last event: time, event_id, event_type

    def joins(self, other: Session, gap: timedelta) -> bool:
        """Whether the two are one session: at most ``gap`` between them, as
        ``session_window`` merges a session with an event that starts at or before the
        session's end (its last event plus the gap)."""
        return other.start - self.end <= gap and self.start - other.end <= gap

    def merged(self, other: Session) -> Session:
        return Session(min(self.start, other.start), max(self.end, other.end),
                       self.events + other.events, self.views + other.views,
                       self.clicks + other.clicks, self.purchases + other.purchases,
                       self.revenue_cents + other.revenue_cents,
                       self.campaigns | other.campaigns, max(self.last, other.last))

    def closes_at(self, gap: timedelta) -> datetime:
        return self.end + gap

    def closed_under(self, watermark: datetime, gap: timedelta) -> bool:
        """Once the watermark has reached its end plus the gap, no event on time (after the
        watermark) can join it: it would be more than the gap after its last event."""
        return self.closes_at(gap) <= watermark

    def row(self, user_id: str, status: str, watermark_ms: int) -> tuple:
        """The session as the processor makes it (``PROCESSOR_CHANGE``)."""
        return (user_id, micros(self.start), micros(self.end), self.events, self.views,
                self.clicks, self.purchases, self.revenue_cents, sorted(self.campaigns),
                self.last[2] == "purchase", status, watermark_ms)


def absorb(sessions: Iterable[Session], event: Session, gap: timedelta) -> list[Session]:
    """``sessions`` (one user's, no two within the gap of each other) with ``event``
    added: it joins every session within the gap of it, which become one. One pass is
    enough: a session passed over could join the grown one only by lying between the event
    and a session it joined, and then it would be nearer the event than that one."""
    grown, rest = event, []
    for session in sessions:
        if session.joins(grown, gap):
            grown = grown.merged(session)
        else:
            rest.append(session)
    return [*rest, grown]


# An event as the processor reads it: (event time in microseconds since the epoch,
# event_id, event_type, price in cents (0 but on a purchase with a price), campaign_id);
# the processor's input columns of the same names, in that order.
Event = tuple[int, str, str, int, str]
EVENT_COLUMNS = ("event_us", "event_id", "event_type", "price_cents", "campaign_id")


def runs(events: list[Event], gap: timedelta) -> list[Session]:
    """``events`` (on time, any order) as the sessions they make on their own: sorted by
    time, a run goes on while the next event is at most ``gap`` after the last. Each run,
    absorbed into the sessions before (``absorb``), gives what absorbing its events one by
    one would: it joins a session exactly when one of its events does, and it is as far
    from every other session as its events are. In integers, once per run a ``Session``:
    the stream's per-event cost (a million events of a thousand users: about a fifth of
    the time ``absorb`` took event by event)."""
    gap_us = gap // timedelta(microseconds=1)
    result: list[Session] = []
    run: list[Event] = []
    # By time, then event_id: the last event of a run is its last by (time, event_id).
    for event in sorted(events, key=itemgetter(0, 1)):
        if run and event[0] - run[-1][0] > gap_us:
            result.append(_run_session(run))
            run = []
        run.append(event)
    if run:
        result.append(_run_session(run))
    return result


def _run_session(run: list[Event]) -> Session:
    views = clicks = purchases = cents = 0
    for _, _, event_type, price_cents, _ in run:
        if event_type == "view":
            views += 1
        elif event_type == "click":
            clicks += 1
        elif event_type == "purchase":
            purchases += 1
            cents += price_cents
    last_us, last_id, last_type, _, _ = run[-1]
    last_time = naive_utc(last_us)
    return Session(naive_utc(run[0][0]), last_time, len(run), views, clicks, purchases, cents,
                   frozenset(event[4] for event in run), (last_time, last_id, last_type))


def aware_utc(moment: datetime) -> datetime:
    """A naive UTC time as PySpark must be handed it (it reads a naive one in the worker's
    local time zone)."""
    return moment.replace(tzinfo=UTC)


def to_naive_utc(moment: datetime) -> datetime:
    """A timestamp as PySpark hands it to the processor (from state zone-aware, from input
    naive in the worker's local time) as naive UTC, silver's way."""
    return moment.astimezone(UTC).replace(tzinfo=None)


def from_epoch_ms(milliseconds: int) -> datetime:
    return naive_utc(milliseconds * 1000)


# ----------------------------------------------------------------------------------------
# The stream.

# A user's open sessions, as state keeps them (``Session``'s fields).
STATE = StructType([
    StructField("start", TimestampType(), False),
    StructField("end", TimestampType(), False),
    *(StructField(name, LongType(), False)
      for name in ("events", "views", "clicks", "purchases", "revenue_cents")),
    StructField("campaigns", ArrayType(StringType(), False), False),
    StructField("last_time", TimestampType(), False),
    StructField("last_event_id", StringType(), False),
    StructField("last_event_type", StringType(), False),
])


def _from_state(values: tuple) -> Session:
    start, end, events, views, clicks, purchases, cents, campaigns, *last = values
    return Session(to_naive_utc(start), to_naive_utc(end), events, views, clicks, purchases, cents,
                   frozenset(campaigns), (to_naive_utc(last[0]), last[1], last[2]))


def _to_state(session: Session) -> tuple:
    last_time, *last_event = session.last
    return (aware_utc(session.start), aware_utc(session.end), session.events, session.views,
            session.clicks, session.purchases, session.revenue_cents,
            sorted(session.campaigns), aware_utc(last_time), *last_event)


def changes(user_id: str, before: list[Session], after: list[Session], watermark_ms: int
            ) -> list[tuple]:
    """The rows that bring the table from a user's open sessions ``before`` to ``after``:
    each new or grown session, and each one that no longer starts where it did (merged
    into another, or started earlier), for the MERGE to delete."""
    starts_after = {session.start for session in after}
    return ([session.row(user_id, SUPERSEDED, watermark_ms) for session in before
             if session.start not in starts_after]
            + [session.row(user_id, OPEN, watermark_ms) for session in after
               if session not in before])


def _processor(gap: timedelta) -> StatefulProcessor:
    # Defined when called: the stateful processor API imports pandas and pyarrow, which the
    # Airflow processes reading this module's names need not.
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class OpenSessions(StatefulProcessor):
        """A user's open sessions in one list state, and an event-time timer at or before
        the earliest time one of them closes."""

        def __reduce__(self):  # noqa: ANN204 (pickle's signature)
            # Made again where it is unpickled, a Python worker, with the reader of its
            # input by key slices there first (``arrow_groups``).
            return _processor_in_worker, (gap,)

        def init(self, handle):  # noqa: ANN001, ANN202 (Spark's signature)
            self.handle = handle
            # No TTL: Spark allows it in processing-time mode only. The timer bounds the
            # state instead: every session closes once the watermark passes it, and a user
            # with no open session keeps no state.
            self.open = handle.getListState("open_sessions", STATE)

        def _load(self) -> list[Session]:
            # A user without state has an empty list (no call to ask first).
            return [_from_state(values) for values in self.open.get()]

        def _keep(self, before: list[Session], sessions: list[Session]) -> None:
            """Keep ``sessions`` in place of ``before``, with a timer at or before the
            earliest time one of them can close (``close_timer``).

            A timer that fires before any session can close closes none and is set again
            (``handleExpiredTimer``); so one is registered only when the earliest close
            comes sooner than before. A steady user's session grows every micro-batch and
            its timer stays, where moving it would be two calls to the state store more,
            each micro-batch, for every active user (make bench)."""
            self.open.put([_to_state(session) for session in sessions])
            earliest = close_timer(sessions, gap)
            if not before or earliest < close_timer(before, gap):
                self.handle.registerTimer(earliest)

        def handleInputRows(self, key, rows, timerValues):  # noqa: ANN001, ANN202, N802, N803
            watermark_ms = timerValues.getCurrentWatermarkInMs()
            watermark_us = watermark_ms * 1000
            before = self._load()
            on_time: list[Event] = []
            late = []
            for frame in rows:  # pandas, column by column to Python values
                for event in zip(*(frame[name].tolist() for name in EVENT_COLUMNS),
                                 strict=True):
                    # At or behind the watermark (Spark's rule for late rows), the event's
                    # session may be closed and written.
                    if event[0] <= watermark_us:
                        late.append(_run_session([event]).row(key[0], LATE, watermark_ms))
                    else:
                        on_time.append(event)
            sessions = before
            for run in runs(on_time, gap):
                sessions = absorb(sessions, run, gap)
            if sessions != before:
                self._keep(before, sessions)
            return _frames(late + changes(key[0], before, sessions, watermark_ms))

        def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):  # noqa: ANN001, ANN202, N802, N803
            watermark_ms = timerValues.getCurrentWatermarkInMs()
            watermark = from_epoch_ms(watermark_ms)
            sessions = self._load()
            closed = [s for s in sessions if s.closed_under(watermark, gap)]
            still_open = [s for s in sessions if s not in closed]
            if closed and still_open:
                self.open.put([_to_state(session) for session in still_open])
            elif closed:
                self.open.clear()
            # Spark deletes the timer handled: the next one, at the sessions left.
            if still_open:
                self.handle.registerTimer(close_timer(still_open, gap))
            return _frames([session.row(key[0], CLOSED, watermark_ms) for session in closed])

        def close(self) -> None:
            pass

    return OpenSessions()


def close_timer(sessions: list[Session], gap: timedelta) -> int:
    """The millisecond from which the first of ``sessions`` can close: a timer fires once
    the watermark (whole milliseconds) reaches it, and a session closes once the watermark
    reaches its end plus the gap to the microsecond (``closed_under``), so the millisecond
    rounded up."""
    return -(-min(micros(session.closes_at(gap)) for session in sessions) // 1000)


def _processor_in_worker(gap: timedelta) -> StatefulProcessor:
    """The processor as a Python worker unpickles it: ``arrow_groups``' reader in place of
    PySpark's, before the worker reads its input."""
    from spark_jobs.gold import arrow_groups

    arrow_groups.install()
    return _processor(gap)


def _frames(rows: list[tuple]) -> Iterator[pd.DataFrame]:
    """The processor's rows (``PROCESSOR_CHANGE``) as the one pandas frame Spark takes them
    in (none if none)."""
    import pandas as pd

    if rows:
        yield pd.DataFrame({"change": [json.dumps(dict(zip(CHANGE_NAMES, row, strict=True)))
                                       for row in rows]})


def session_changes(events: DataFrame, mapping: DataFrame, session_gap: str,
                    watermark_delay: str) -> DataFrame:
    """The stream of session rows (``CHANGES``) from a stream of silver events."""
    with_campaign = ad_campaigns.campaign_at(
        events.select(*INPUTS).where(F.col("user_id").isNotNull())
        .withWatermark("event_time", spark_interval(watermark_delay)), mapping)
    # Spark drops the rows behind the watermark before a stateful step; the processor must
    # see them to count them in the ledger, so it gets the time as a column of its own.
    # Integers (microseconds, cents) the processor compares and adds without a conversion.
    # A price only counts on a purchase; 0 otherwise, so the column has no NULL (pandas
    # would make it floats).
    price_cents = F.coalesce(F.when(F.col("event_type") == "purchase",
                                    (F.col("price") * 100).cast("long")), F.lit(0))
    changed = (with_campaign.select("user_id", F.unix_micros("event_time").alias("event_us"),
                                    "event_id", "event_type", price_cents.alias("price_cents"),
                                    "campaign_id")
               .groupBy("user_id")
               # pandas, not Rows: PySpark builds each Row cell by cell from Arrow (a million
               # events, 15 s of the stateful step), a pandas frame a column at a time.
               .transformWithStateInPandas(
                   _processor(timedelta(seconds=interval_seconds(session_gap))),
                   PROCESSOR_OUTPUT, "Append", "EventTime"))
    revenue_type = SCHEMA["revenue"].dataType
    parsed = changed.select(F.from_json("change", PROCESSOR_CHANGE).alias("c")).select("c.*")
    return parsed.select(
        "user_id", F.timestamp_micros("session_start_us").alias("session_start"),
        F.timestamp_micros("session_end_us").alias("session_end"),
        "events", "views", "clicks", "purchases",
        (F.col("revenue_cents").cast(revenue_type) / 100).cast(revenue_type).alias("revenue"),
        # JSON makes every element nullable; the table's are not (none is NULL).
        F.transform("campaigns", lambda campaign: F.coalesce(campaign, F.lit(""))
                    ).alias("campaigns"),
        "ended_in_purchase", "status", "watermark_ms")


def latest_per_session(changed: DataFrame) -> DataFrame:
    """One row per session of a micro-batch's changes, the one that stands (``PRECEDENCE``)."""
    rank = F.element_at(F.create_map(*(F.lit(x) for pair in PRECEDENCE.items() for x in pair)),
                        F.col("status"))
    latest = Window.partitionBy("user_id", "session_start").orderBy(rank.desc())
    return (changed.where(F.col("status") != LATE)
            .withColumn("_rank", F.row_number().over(latest)).where("_rank = 1")
            .select(*SCHEMA.fieldNames()))


def late_events(changed: DataFrame) -> DataFrame:
    """The late events among a micro-batch's changes, as the ledger counts them: by event
    date, with no window (a session has none)."""
    return (changed.where(F.col("status") == LATE)
            .select(F.to_date("session_start").alias("event_date"),
                    F.lit(None).cast("timestamp").alias("window_start")))



def process(spark: SparkSession, batch: DataFrame, query_id: str, batch_id: int, *,
            settings: Settings) -> None:
    with writer.LOCK.batch():  # never beside a gold rebuild (see ``gold.writer``)
        # Cached: the summary, the ledger and the MERGE read it, and reading it again would
        # run the stateful step again.
        changed = batch.persist()
        try:
            _process(spark, settings, changed, query_id, batch_id)
        finally:
            changed.unpersist()


def _process(spark: SparkSession, settings: Settings, changed: DataFrame, query_id: str,
             batch_id: int) -> None:
    """One micro-batch of changes: late events to the ledger, sessions MERGEd in."""
    is_late = F.col("status") == LATE
    summary = changed.agg(F.count_if(is_late).alias("late"),
                          F.count_if(F.col("status") == CLOSED).alias("closed"),
                          F.max("watermark_ms").alias("watermark_ms"),
                          *time_bounds(F.when(~is_late, F.col("session_start")))).first()
    stream_progress.report_late_rows(query_id, batch_id, summary["late"])
    # A session is closed by its timer, in the batch whose watermark reached it.
    stream_progress.report_timers_fired(query_id, batch_id, summary["closed"])
    if summary["late"]:
        checkpoint = settings.checkpoint(QUERY_NAME)
        late_data.append(settings, late_data.entries(
            late_events(changed), LAYER, summary["watermark_ms"] * 1000, query_id, batch_id,
            batch_time(checkpoint, batch_id)), checkpoint, query_id, batch_id)
        crash_point("gold_user_sessions.after_ledger")
    if summary["first"] is not None:
        # The commit carries the watermark the batch closed sessions under, for a rebuild
        # to tell the sessions the stream has closed (as gold.watermark's figure: the
        # latest event time it stands for, the watermark plus the delay).
        latest = summary["watermark_ms"] * 1000 + delay_micros(settings)
        with (idempotent_dml(spark, query_id, batch_id),
              carried_by_commit(spark, query_id, batch_id, latest)):
            merge(spark, settings, latest_per_session(changed),
                  (summary["first"], summary["last"]))


def merge(spark: SparkSession, settings: Settings, sessions: DataFrame,
          starts: tuple[str, str]) -> None:
    """Insert new sessions, replace grown or closed ones, delete the superseded. Scoped to
    the batch's session starts (timestamp literal text), so Delta skips the files of other
    times by their statistics."""
    from delta.tables import DeltaTable

    scope = f"t.session_start BETWEEN TIMESTAMP'{starts[0]}' AND TIMESTAMP'{starts[1]}'"
    superseded = f"s.status = '{SUPERSEDED}'"
    (DeltaTable.forPath(spark, TABLE.path(settings)).alias("t")
        .merge(sessions.alias("s"), f"{scope} AND t.user_id = s.user_id "
                                    f"AND t.session_start = s.session_start")
        .whenMatchedDelete(condition=superseded)
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll(condition=f"NOT ({superseded})")
        .execute())


def delay_micros(settings: Settings) -> int:
    return interval_micros(settings.watermark_delay)


# ----------------------------------------------------------------------------------------
# The reprocess.

# How far beyond the rebuilt dates silver is read, each side: a session touching the dates
# is recomputed whole if it starts and ends within that much of them (one not, a user
# active all day without a pause of ``session_gap``, is left as the stream wrote it).
REBUILD_MARGIN = timedelta(days=1)


def closed_watermark(settings: Settings) -> datetime | None:
    """The watermark the stream's latest MERGE closed sessions under (naive UTC); None
    before it closed any."""
    latest = latest_committed(TABLE.path(settings))
    return None if latest is None else naive_utc(latest - delay_micros(settings))


def day_bounds(days: DateRange) -> tuple[datetime, datetime]:
    """The first moment of ``days`` and the first one after them (naive UTC)."""
    return (datetime.combine(days.first, datetime.min.time()),
            datetime.combine(days.last + timedelta(days=1), datetime.min.time()))


def read_range(days: DateRange) -> tuple[datetime, datetime]:
    """The event times a rebuild of ``days`` reads: a margin each side of them."""
    low, high = day_bounds(days)
    return low - REBUILD_MARGIN, high + REBUILD_MARGIN


def recomputed_sessions(events: DataFrame, mapping: DataFrame, session_gap: str,
                        closed_by: datetime | None, days: DateRange) -> DataFrame:
    """The batch recomputation over ``events`` (silver at one version, late events
    included) in the range a rebuild of ``days`` reads; closed under ``closed_by``, the
    watermark the stream has closed sessions under."""
    read_from, read_to = read_range(days)
    in_read = (F.col("event_time") >= F.lit(read_from)) & (F.col("event_time") < F.lit(read_to))
    dates = F.col("event_date").between(F.lit(read_from.date()), F.lit(read_to.date()))
    return user_sessions(events.where(dates & in_read), mapping, session_gap, closed_by)


def rebuilt_sessions(recomputed: DataFrame, current: DataFrame, session_gap: str,
                     days: DateRange) -> tuple[DataFrame, str]:
    """What a rebuild of ``days`` writes: the rows that stand for the table's closed
    sessions within a margin of them, and that scope's predicate.

    ``recomputed``: ``recomputed_sessions``; ``current``: the table now. A recomputed
    session touching ``days`` is written, closed, when it is closed, whole within the
    margin, and not within the gap of a session open in the table (those are the stream's
    state: its next change would overwrite a rebuilt row, so they wait for it). Closed rows
    in the scope that such a session overlaps go; so do those touching ``days`` that no
    recomputed session overlaps (their events left silver); the others stay."""
    gap = timedelta(seconds=interval_seconds(session_gap))
    low, high = day_bounds(days)
    read_from, read_to = read_range(days)
    sessions = recomputed.alias("r")
    touches_days = (F.col("r.session_start") < F.lit(high)) & (F.col("r.session_end") >= F.lit(low))
    # An event before ``read_from`` or at or after ``read_to`` is unread: a session nearer
    # than the gap to either may go on there.
    whole = ((F.col("r.session_start") > F.lit(read_from + gap))
             & (F.col("r.session_end") < F.lit(read_to - gap)))
    open_rows = current.where(F.col("status") == OPEN).alias("o")
    near_open = sessions.join(open_rows, (F.col("o.user_id") == F.col("r.user_id"))
                              & (F.col("o.session_start") - F.col("r.session_end")
                                 <= F.expr(f"INTERVAL {spark_interval(session_gap)}"))
                              & (F.col("r.session_start") - F.col("o.session_end")
                                 <= F.expr(f"INTERVAL {spark_interval(session_gap)}")),
                              "left_semi")
    candidates = sessions.where(touches_days)
    written = (candidates.where(whole & (F.col("r.status") == CLOSED))
               .join(near_open, ["user_id", "session_start"], "left_anti"))
    held = candidates.join(written, ["user_id", "session_start"], "left_anti")

    scope = (f"status = '{CLOSED}' AND session_end >= TIMESTAMP'{read_from}' "
             f"AND session_start < TIMESTAMP'{read_to}'")
    closed_rows = current.where(scope).alias("t")

    def overlapping(other: DataFrame) -> DataFrame:
        other = other.alias("x")
        return closed_rows.join(other, (F.col("t.user_id") == F.col("x.user_id"))
                                & (F.col("t.session_start") <= F.col("x.session_end"))
                                & (F.col("t.session_end") >= F.col("x.session_start")),
                                "left_semi")

    row_touches_days = ((F.col("session_start") < F.lit(high))
                        & (F.col("session_end") >= F.lit(low)))
    # Closed rows that no written session replaces stay if they are outside the dates or
    # overlap a session held back; one touching the dates that overlaps nothing goes.
    unreplaced = closed_rows.join(overlapping(written), ["user_id", "session_start"],
                                  "left_anti")
    beside_held = overlapping(held).select("user_id", "session_start",
                                           F.lit(True).alias("_held"))
    kept = (unreplaced.join(beside_held, ["user_id", "session_start"], "left")
            .where(~row_touches_days | F.col("_held").isNotNull()))
    columns = SCHEMA.fieldNames()
    return written.select(*columns).unionByName(kept.select(*columns)), scope


def rebuild(spark: SparkSession, settings: Settings, events: DataFrame, days: DateRange,
            dry_run: bool, before_write: Callable[[], None]) -> Change:
    """Replace the closed sessions touching ``days`` with the batch recomputation over
    ``events`` (silver at one version) where they differ (``rebuilt_sessions``);
    ``before_write`` runs just before the replace commits. Runs where gold's one writer is,
    between two of the stream's micro-batches (``gold.writer``), so the table's open rows
    are the stream's state."""
    current = read_current(spark, settings, TABLE)  # created first if it is not yet
    # Cached: what is written, what is held back and what stays all read it.
    recomputed = recomputed_sessions(
        events, read_current(spark, settings, ad_campaigns.TABLE), settings.session_gap,
        closed_watermark(settings), days).persist()
    try:
        rows, scope = rebuilt_sessions(recomputed, current, settings.session_gap, days)
        return rebuild_range(spark, settings, TABLE, rows, scope, F.to_date("session_start"),
                             scope, dry_run, before_write)
    finally:
        recomputed.unpersist()


def start(spark: SparkSession, settings: Settings, trigger: dict[str, object]
          ) -> StreamingQuery:
    for table in (TABLE, ad_campaigns.TABLE, late_data.TABLE):
        ensure_table(spark, settings, table)
    changes_stream = session_changes(silver.read_stream(spark, settings),
                                     read_table(spark, settings, ad_campaigns.TABLE),
                                     settings.session_gap, settings.watermark_delay)
    return start_exactly_once(changes_stream, settings, QUERY_NAME, process, trigger)
