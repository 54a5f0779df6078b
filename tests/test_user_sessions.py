"""``gold.user_sessions``: the sessions' rules in plain Python, the batch recomputation on
small inline data, and the stream against the batch over many micro-batches."""

import random
import signal
import subprocess
import sys
from datetime import date, datetime, timedelta
from decimal import Decimal

from pyspark.sql import functions as F

from spark_jobs.dates import DateRange
from spark_jobs.gold import user_sessions
from spark_jobs.gold.user_sessions import CLOSED, OPEN, Session, absorb, runs
from spark_jobs.gold.watermark import micros
from spark_jobs.ops import late_data, stream_progress
from spark_jobs.silver import ad_campaigns
from spark_jobs.silver import ad_events as silver
from tests.conftest import cli_env
from tests.test_gold import mapping

GAP = timedelta(minutes=30)
EPOCH = datetime(2026, 1, 1)


def at(minute: int, hour: int = 12) -> datetime:
    return datetime(2026, 11, 22, hour, minute)


def event(minute: int, event_type: str = "view", hour: int = 12) -> Session:
    """The session of one event, as the stream makes it."""
    [session] = runs([(micros(at(minute, hour)), f"e-{hour}-{minute}", event_type,
                       250 if event_type == "purchase" else 0, "c-1")], GAP)
    return session


def spans(sessions: list[Session]) -> list[tuple[datetime, datetime, int]]:
    return sorted((s.start, s.end, s.events) for s in sessions)


def test_an_event_within_the_gap_of_two_sessions_makes_them_one() -> None:
    # 12:00 and 12:50 are 50 minutes apart: two sessions. 12:25 is under 30 minutes from
    # both, so it bridges them into one of three events.
    sessions = absorb(absorb([], event(0), GAP), event(50), GAP)
    assert spans(sessions) == [(at(0), at(0), 1), (at(50), at(50), 1)]
    assert spans(absorb(sessions, event(25), GAP)) == [(at(0), at(50), 3)]


def test_a_gap_of_exactly_session_gap_keeps_one_session_and_more_starts_a_new_one() -> None:
    # session_window merges an event starting at or before a session's end (its last
    # event plus the gap): 12:30 is 12:00's end, so one session, as the batch has it
    # (test_the_batch_recomputation_on_inline_data); 12:31 is past it.
    assert spans(absorb(absorb([], event(0), GAP), event(30), GAP)) == [(at(0), at(30), 2)]
    assert spans(absorb(absorb([], event(0), GAP), event(31), GAP)) == [
        (at(0), at(0), 1), (at(31), at(31), 1)]


def test_the_order_events_arrive_in_does_not_change_the_sessions() -> None:
    minutes = [0, 20, 40, 95, 100, 140, 125, 10]  # 0-40 chained, 95-140 chained
    expected = [(at(0), at(40), 4), (at(35, 13), at(20, 14), 4)]
    for seed in range(5):
        order = minutes[:]
        random.Random(seed).shuffle(order)
        sessions: list[Session] = []
        for minute in order:
            sessions = absorb(sessions, event(minute % 60, hour=12 + minute // 60), GAP)
        assert spans(sessions) == expected


def test_absorbing_a_batch_s_runs_gives_the_sessions_of_its_events_one_by_one() -> None:
    # The stream absorbs each batch's events as runs (events at most the gap apart): the
    # same sessions as absorbing every event on its own, whatever batches the events come in.
    rng = random.Random(11)
    for _ in range(200):
        events = [(micros(at(0)) + rng.randrange(0, 6 * 3600) * 1_000_000, f"e-{n}",
                   rng.choice(("view", "click", "purchase")), rng.choice((0, 125)),
                   rng.choice(("c-1", "c-2"))) for n in range(rng.randint(1, 12))]
        one_by_one: list[Session] = []
        for single in events:
            one_by_one = absorb(one_by_one, runs([single], GAP)[0], GAP)
        in_batches: list[Session] = []
        cut = rng.randint(0, len(events))
        for batch in (events[:cut], events[cut:]):
            for run in runs(batch, GAP):
                in_batches = absorb(in_batches, run, GAP)
        assert sorted(in_batches, key=lambda s: s.start) == sorted(
            one_by_one, key=lambda s: s.start)


def silver_frame(spark, rows: list[tuple]):
    """(event_id, event_time, event_type, user_id, ad_id, price) as silver rows."""
    full = [(event_id, time, time.date(), event_type, user, None, ad, None, None,
             None if price is None else Decimal(price), None, False, f"bronze-{event_id}",
             "test", time)
            for event_id, time, event_type, user, ad, price in rows]
    return spark.createDataFrame(full, silver.SCHEMA)


def test_the_batch_recomputation_on_inline_data(spark) -> None:
    move = at(10)
    campaigns = mapping(spark, [("ad-1", "c-1", EPOCH), ("ad-1", "c-2", move)])
    rows = silver_frame(spark, [
        # u-1: 12:00, 12:05 (campaign c-1 before the move), 12:20 purchase (c-2): one
        # session of three events ending in a purchase of 4.00.
        ("a", at(0), "view", "u-1", "ad-1", None),
        ("b", at(5), "click", "u-1", "ad-1", None),
        ("c", at(20), "purchase", "u-1", "ad-1", "4.00"),
        # u-1 again at 13:00, 40 minutes after 12:20: a second session; an ad without a
        # mapping counts under "unknown".
        ("d", at(0, 13), "view", "u-1", "ad-9", None),
        # u-2: a purchase "y" and a view "z", both at 12:00: the last event is the one
        # with the greater (time, event_id), the view, so no purchase ended the session.
        ("y", at(0), "purchase", "u-2", "ad-1", "1.00"),
        ("z", at(0), "view", "u-2", "ad-1", None),
        # No user: no session.
        ("n", at(1), "view", None, "ad-1", None),
        # u-3: 12:00 and 12:30, exactly the gap apart: one session.
        ("p", at(0), "view", "u-3", "ad-1", None),
        ("q", at(30), "view", "u-3", "ad-1", None),
    ])
    # The watermark 12:50 has reached 12:20 + 30 minutes (u-1's first session closes: an
    # event on time, after 12:50, would be more than the gap after its last) but not 13:00
    # + 30 minutes; u-2's 12:30 is behind it too, u-3's 13:00 not.
    result = {(r.user_id, r.session_start): r for r in user_sessions.user_sessions(
        rows, campaigns, "30 minutes", at(50)).collect()}
    assert set(result) == {("u-1", at(0)), ("u-1", at(0, 13)), ("u-2", at(0)), ("u-3", at(0))}
    first = result[("u-1", at(0))]
    assert (first.session_end, first.events, first.views, first.clicks, first.purchases,
            first.revenue, first.campaigns, first.ended_in_purchase, first.status) == (
        at(20), 3, 1, 1, 1, Decimal("4.00"), ["c-1", "c-2"], True, CLOSED)
    second = result[("u-1", at(0, 13))]
    assert (second.events, second.campaigns, second.ended_in_purchase, second.status) == (
        1, ["unknown"], False, OPEN)
    other = result[("u-2", at(0))]
    assert (other.events, other.revenue, other.ended_in_purchase, other.status) == (
        2, Decimal("1.00"), False, CLOSED)
    gap_apart = result[("u-3", at(0))]
    assert (gap_apart.session_end, gap_apart.events, gap_apart.status) == (at(30), 2, OPEN)
    # A microsecond before 12:50, u-1's first session is still open.
    just_before = {(r.user_id, r.session_start): r.status for r in user_sessions.user_sessions(
        rows, campaigns, "30 minutes", at(50) - timedelta(microseconds=1)).collect()}
    assert just_before[("u-1", at(0))] == OPEN


def test_the_batch_sessions_are_the_ones_session_window_makes(spark) -> None:
    """``user_sessions`` numbers runs with window functions (faster); Spark SQL's
    ``session_window`` is the reference meaning. Steps between a user's events drawn at
    and around the gap (a microsecond either side, exactly it) and at zero (ties)."""
    draw = random.Random(11)
    steps = [timedelta(0), GAP - timedelta(microseconds=1), GAP,
             GAP + timedelta(microseconds=1), timedelta(minutes=7), timedelta(hours=2)]
    rows, number = [], 0
    for user in ("u-1", "u-2", "u-3"):
        moment = at(0)
        for _ in range(40):
            moment += draw.choice(steps)
            number += 1
            rows.append((f"e-{number:03}", moment, draw.choice(("view", "click")), user,
                         "ad-1", None))
    events = silver_frame(spark, rows)
    ours = user_sessions.user_sessions(events, mapping(spark, [("ad-1", "c-1", EPOCH)]),
                                       "30 minutes", None)
    reference = (events.groupBy("user_id", F.session_window("event_time", "30 minutes"))
                 .agg(F.min("event_time").alias("session_start"),
                      F.max("event_time").alias("session_end"), F.count("*").alias("events")))
    sessions = {tuple(row) for row in ours.select(*reference.columns[2:], "user_id").collect()}
    expected = {tuple(row) for row in
                reference.select(*reference.columns[2:], "user_id").collect()}
    assert sessions == expected
    # The draw made sessions split at a step over the gap and kept whole at one of it:
    # fewer sessions than events, more than users.
    assert 3 < len(sessions) < len(rows)


def test_a_session_closes_once_the_watermark_reaches_its_end_plus_the_gap() -> None:
    session = event(20)
    # Reached: an event on time is after the watermark, more than the gap after 12:20.
    assert session.closed_under(at(50), GAP)
    assert not session.closed_under(at(50) - timedelta(microseconds=1), GAP)


def corpus(seed: int, batches: int) -> list[list[tuple]]:
    """Micro-batches of silver rows: 30 users, each active in a batch's quarter hour with
    probability 0.4 (so sessions open, grow, merge and close), 4% of events 20 to 90
    minutes older than their batch (late under a 10-minute watermark, or not), a few
    without a user, purchases with and without a price."""
    rng = random.Random(seed)
    users = [f"u-{i}" for i in range(30)]
    start = datetime(2026, 11, 22, 8, 0)
    result, number = [], 0
    for batch in range(batches):
        rows = []
        base = start + timedelta(minutes=15 * batch)
        for user in users:
            if rng.random() > 0.4:
                continue
            for _ in range(rng.randint(1, 4)):
                number += 1
                time = base + timedelta(seconds=rng.uniform(0, 900))
                if rng.random() < 0.04:
                    time -= timedelta(minutes=rng.uniform(20, 90))
                kind = rng.choice(("view", "view", "click", "purchase"))
                price = (None if kind != "purchase" or rng.random() < 0.2
                         else f"{rng.randint(1, 999) / 100:.2f}")
                rows.append((f"e-{number}", time, kind,
                             None if rng.random() < 0.03 else user, f"ad-{number % 3}", price))
        result.append(rows)
    return result


def late_by_spark_s_watermark(batches: list[list[tuple]], delay: timedelta
                              ) -> tuple[set[str], datetime]:
    """The events at or behind the watermark when their batch ran, and the watermark once
    all have run: the latest event time (of events with a user: the stream's input) in the
    batches before, less the delay, in milliseconds as Spark keeps it."""
    late, latest = set(), None
    for rows in batches:
        watermark = latest - delay if latest else datetime(1970, 1, 1)
        with_user = [row for row in rows if row[3] is not None]
        late |= {row[0] for row in with_user if row[1] <= watermark}
        # Spark keeps the latest event time in whole milliseconds.
        latest = max([*([latest] if latest else []), *(
            row[1] - timedelta(microseconds=row[1].microsecond % 1000) for row in with_user)])
    return late, latest - delay


def stream_corpus(spark, settings, batches: list[list[tuple]]):
    """Silver written a commit per micro-batch, the mapping beside it; the mapping."""
    campaigns = mapping(spark, [("ad-0", "c-0", EPOCH), ("ad-1", "c-1", EPOCH)])
    campaigns.write.format("delta").save(ad_campaigns.TABLE.path(settings))
    for rows in batches:  # a commit of one file each: one micro-batch each
        silver_frame(spark, rows).coalesce(1).write.format("delta").mode("append").save(
            silver.TABLE.path(settings))
    return campaigns


def sessions_table(spark, settings) -> dict:
    return {(r.user_id, r.session_start): r.asDict() for r in spark.read.format("delta")
            .load(user_sessions.TABLE.path(settings)).collect()}


def assert_the_stream_equals_the_batch(spark, settings, batches: list[list[tuple]],
                                       campaigns) -> dict:
    """The table and ledger the stream left, all ``batches`` read, against the batch
    recomputation; the table's sessions."""
    late, watermark = late_by_spark_s_watermark(batches, timedelta(minutes=10))
    assert late, "the corpus must have late events for the test to mean anything"
    # The ledger counts every late event once, under its date.
    ledger = (spark.read.format("delta").load(late_data.TABLE.path(settings))
              .where(F.col("layer") == user_sessions.LAYER))
    assert ledger.agg(F.sum("late_rows")).first()[0] == len(late)

    everything = spark.read.format("delta").load(silver.TABLE.path(settings))
    on_time = everything.where(~F.col("event_id").isin(sorted(late)))
    expected = {(r.user_id, r.session_start): r.asDict() for r in user_sessions.user_sessions(
        on_time, campaigns, settings.session_gap, watermark).collect()}
    streamed = sessions_table(spark, settings)
    # Without the late events, the stream's sessions are exactly the batch's, open and
    # closed alike: a late event is counted in the ledger and in no session.
    assert streamed == expected
    assert {row["status"] for row in streamed.values()} == {OPEN, CLOSED}
    # Sessions the late events would have touched are where the stream and a batch over
    # every event differ; a reprocess repairs them (the ledger lists their dates).
    with_late = {(r.user_id, r.session_start): r.asDict() for r in user_sessions.user_sessions(
        everything, campaigns, settings.session_gap, watermark).collect()}
    assert with_late != streamed
    return streamed


def overlaps(row: dict, other: dict) -> bool:
    return (row["user_id"] == other["user_id"] and row["session_start"] <= other["session_end"]
            and row["session_end"] >= other["session_start"])


def test_the_stream_equals_the_batch_recomputation_over_many_micro_batches(
        spark, settings) -> None:
    batches = corpus(seed=3, batches=8)
    settings = settings.model_copy(update={"max_files_per_trigger": 1})
    campaigns = stream_corpus(spark, settings, batches)

    query = user_sessions.start(spark, settings, {"availableNow": True})
    query.awaitTermination()
    assert query.exception() is None
    assert len(query.recentProgress) >= len(batches)
    streamed = assert_the_stream_equals_the_batch(spark, settings, batches, campaigns)
    # Its progress rows, as the runner records them, carry the state, the timers fired and
    # the late events: every closed session was closed by a timer (one each, or fewer if
    # one closed two), every late event is counted once.
    stream_progress.ProgressRecorder().flush(spark, settings, [query])
    progress = spark.read.format("delta").load(stream_progress.TABLE.path(settings)).agg(
        F.sum("timers_fired"), F.sum("late_rows"), F.max("state_rows")).first()
    closed = sum(row["status"] == CLOSED for row in streamed.values())
    late, _ = late_by_spark_s_watermark(batches, timedelta(minutes=10))
    assert 0 < progress[0] <= closed and progress[1] == len(late) and progress[2] > 0

    # The stream's last MERGE carries the watermark it closed sessions under: the one
    # after every batch (Spark's batch without data fires the last timers).
    _, watermark = late_by_spark_s_watermark(batches, timedelta(minutes=10))
    assert user_sessions.closed_watermark(settings) == watermark
    # A reprocess of the day adds the late events to the closed sessions: they are the
    # batch recomputation's over every event. Open sessions stay the stream's, and so does a
    # closed one that late events join to an open one (which cases
    # test_what_a_rebuild_writes_replaces_and_leaves shows one by one).
    everything = spark.read.format("delta").load(silver.TABLE.path(settings))
    with_late = [r.asDict() for r in user_sessions.user_sessions(
        everything, campaigns, settings.session_gap, watermark).collect()]
    expected = {(r["user_id"], r["session_start"]): r for r in with_late
                if r["status"] == CLOSED}
    expected |= {key: row for key, row in streamed.items() if row["status"] == OPEN or any(
        overlaps(row, r) for r in with_late if r["status"] == OPEN)}
    day = DateRange(date(2026, 11, 22), date(2026, 11, 22))
    assert user_sessions.rebuild(spark, settings, everything, day, False, lambda: None).written
    assert sessions_table(spark, settings) == expected
    # Once rebuilt, the same rebuild writes nothing.
    again = user_sessions.rebuild(spark, settings, everything, day, False, lambda: None)
    assert (again.written, again.note) == (False, "unchanged")


def test_a_batch_failing_after_its_ledger_or_its_merge_replays_to_the_same_result(
        spark, settings, monkeypatch) -> None:
    batches = corpus(seed=5, batches=6)
    settings = settings.model_copy(update={"max_files_per_trigger": 1})
    campaigns = stream_corpus(spark, settings, batches)

    # The first batch with a late event fails after its ledger rows are appended, before
    # its MERGE; two batches later one fails after its MERGE committed, before Spark
    # records the batch done. Each run stops there, and the next replays the batch from
    # the checkpoint, state as it was before it.
    late, _ = late_by_spark_s_watermark(batches, timedelta(minutes=10))
    first_late = next(number for number, rows in enumerate(batches)
                      if any(row[0] in late for row in rows))
    failures = {first_late: "merge", first_late + 2: "after"}
    merge, process = user_sessions.merge, user_sessions._process

    def failing_merge(spark, settings, sessions, starts):
        if failures.get(current[0]) == "merge":
            del failures[current[0]]
            raise RuntimeError("injected: after the ledger, before the MERGE")
        merge(spark, settings, sessions, starts)

    def failing_process(spark, settings, changed, query_id, batch_id):
        current[0] = batch_id
        process(spark, settings, changed, query_id, batch_id)
        if failures.get(batch_id) == "after":
            del failures[batch_id]
            raise RuntimeError("injected: after the MERGE")

    current = [-1]
    monkeypatch.setattr(user_sessions, "merge", failing_merge)
    monkeypatch.setattr(user_sessions, "_process", failing_process)
    runs = 0
    while True:
        runs += 1
        query = user_sessions.start(spark, settings, {"availableNow": True})
        try:
            query.awaitTermination()
            break
        except Exception as failure:  # the injected one, through Spark
            assert "injected" in str(failure)
            if runs == 1:  # the ledger append the failed batch made is there
                ledger = spark.read.format("delta").load(late_data.TABLE.path(settings))
                assert ledger.where(F.col("batch_id") == first_late).count() > 0
    assert runs == 3 and not failures
    # As if nothing had failed: no ledger row twice, no session lost or doubled.
    assert_the_stream_equals_the_batch(spark, settings, batches, campaigns)


# The stream in a driver of its own, as the chaos battery kills them.
DRIVER = """
import sys
from spark_jobs import config
from spark_jobs.dates import DateRange
from spark_jobs.gold import user_sessions
from spark_jobs.session import build_spark

settings = config.load({"root": sys.argv[1], "shuffle_partitions": 2,
                        "max_files_per_trigger": 1}, environ={})
spark = build_spark(settings, app_name="user-sessions-driver")
user_sessions.start(spark, settings, {"availableNow": True}).awaitTermination()
"""


def test_a_driver_killed_inside_a_merge_resumes_to_the_same_result(spark, settings) -> None:
    batches = corpus(seed=5, batches=6)
    settings = settings.model_copy(update={"max_files_per_trigger": 1})
    campaigns = stream_corpus(spark, settings, batches)
    # SIGKILL of the driver and its JVM 0.3 s after the first ledger append: inside the
    # MERGE that follows it, state committed for no batch after the last one done.
    killed = subprocess.run(
        [sys.executable, "-c", DRIVER, str(settings.root)], capture_output=True, text=True,
        env=cli_env(LAKEHOUSE_CRASH_AT="gold_user_sessions.after_ledger+0.3"),
        start_new_session=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "crash point gold_user_sessions.after_ledger" in killed.stderr
    # Resumed in this process, as the restarted driver would: the same settings on the
    # checkpoint and tables the killed one left (a JVM start less).
    user_sessions.start(spark, settings, {"availableNow": True}).awaitTermination()
    assert_the_stream_equals_the_batch(spark, settings, batches, campaigns)


def test_what_a_rebuild_writes_replaces_and_leaves(spark) -> None:
    # A rebuild of 22 November under the watermark 23 November 02:00; all events are views
    # of ad-1 (campaign c-1). Each user is one case; the table holds what the stream wrote.
    day = DateRange(date(2026, 11, 22), date(2026, 11, 22))
    d22, d23 = (lambda h, m=0: datetime(2026, 11, 22, h, m)), (
        lambda h, m=0: datetime(2026, 11, 23, h, m))
    events, table = [], []

    def views(user: str, *times: datetime) -> None:
        events.extend((f"{user}-{t:%d%H%M}", t, "view", user, "ad-1", None) for t in times)

    def row(user: str, start: datetime, end: datetime, n: int, status: str = CLOSED) -> None:
        table.append((user, start, end, n, n, 0, 0, Decimal("0.00"), ["c-1"], False, status))

    # u-1: a late event at 10:20 joins the stream's 10:00-10:10: replaced by three events.
    views("u-1", d22(10), d22(10, 10), d22(10, 20))
    row("u-1", d22(10), d22(10, 10), 2)
    # u-2: a late 23:30 starts earlier the session the stream had from 23:50 to 00:10,
    # across midnight: the old row goes, the whole session from 23:30 comes.
    views("u-2", d22(23, 30), d22(23, 50), d23(0, 10))
    row("u-2", d22(23, 50), d23(0, 10), 2)
    # u-3: a closed session of the day whose events left silver: it goes.
    row("u-3", d22(8), d22(8, 5), 2)
    # u-4: the 23rd's session is not rebuilt, although silver has a late event of it.
    views("u-4", d23(1), d23(1, 5), d23(1, 10))
    row("u-4", d23(1), d23(1, 5), 2)
    # u-5: late events bridge the closed 23:00-23:05 to the open 01:40-01:50: the session
    # they make is still open, the stream's: both rows stay as they are.
    views("u-5", d22(23), d22(23, 5), d22(23, 30), d23(0), d23(0, 30), d23(1), d23(1, 20),
          d23(1, 40), d23(1, 50))
    row("u-5", d22(23), d22(23, 5), 2)
    row("u-5", d23(1, 40), d23(1, 50), 2, OPEN)
    # u-6: silver lost the later events of an open session from 23:59: what is left of it
    # would be closed, under the open row's key; the open row is the stream's: no write.
    views("u-6", d22(23, 59))
    row("u-6", d22(23, 59), d23(1, 45), 5, OPEN)
    # u-7: active every 20 minutes since 20 November 23:50: the session reaches past the
    # day read before (from the 21st): not whole, so it stays as the stream wrote it.
    start = datetime(2026, 11, 20, 23, 50)
    chain = [start + timedelta(minutes=20 * i) for i in range(76)]  # to 22 November 00:50
    views("u-7", *chain)
    row("u-7", start, chain[-1], len(chain) - 1)

    campaigns = mapping(spark, [("ad-1", "c-1", EPOCH)])
    current = spark.createDataFrame(table, user_sessions.SCHEMA)
    recomputed = user_sessions.recomputed_sessions(silver_frame(spark, events), campaigns,
                                                   "30 minutes", d23(2), day)
    rows, scope = user_sessions.rebuilt_sessions(recomputed, current, "30 minutes", day)
    result = {(r.user_id, r.session_start): (r.events, r.status) for r in rows.collect()}
    assert result == {
        ("u-1", d22(10)): (3, CLOSED),
        ("u-2", d22(23, 30)): (3, CLOSED),
        ("u-4", d23(1)): (2, CLOSED),
        ("u-5", d22(23)): (2, CLOSED),
        ("u-7", start): (75, CLOSED),
    }
    # What the rows replace: the table's closed rows within a day of the 22nd (open ones
    # are not in the scope, so u-5's and u-6's stay).
    in_scope = {(r.user_id, r.session_start) for r in current.where(scope).collect()}
    assert in_scope == {("u-1", d22(10)), ("u-2", d22(23, 50)), ("u-3", d22(8)),
                        ("u-4", d23(1)), ("u-5", d22(23)), ("u-7", start)}
