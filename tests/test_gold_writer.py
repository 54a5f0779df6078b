"""Gold has one writer at a time: a reprocess hands its rebuild to the driver holding the gold
lease, a gold micro-batch never runs beside a rebuild, a driver waits for a reprocess."""

from __future__ import annotations

import json
import threading
import time
from datetime import date

import pytest
from pyspark.sql import functions as F

from spark_jobs import streaming
from spark_jobs.dates import DateRange
from spark_jobs.gold import campaign_stats, writer
from spark_jobs.ops import gold_rebuilds
from spark_jobs.ops.leases import REPROCESS, LeaseHeld, leases
from spark_jobs.silver import ad_campaigns
from spark_jobs.silver import ad_events as silver
from tests.conftest import make_settings
from tests.processes import generate, run_lakehouse

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def streamed(spark, tmp_path_factory):
    """A small corpus carried through every layer once."""
    settings = make_settings(tmp_path_factory.mktemp("gold-writer") / "lake")
    generate(settings.root, "--events", "300", "--seed", "11")
    streaming.run_available_now(spark, settings, list(streaming.LAYERS))
    return settings


def busiest_date(spark, settings) -> date:
    return (spark.read.format("delta").load(silver.TABLE.path(settings))
            .groupBy("event_date").count().orderBy(F.desc("count")).first().event_date)


def gold_of(spark, settings, day: date) -> set[tuple]:
    return {tuple(row) for row in spark.read.format("delta")
            .load(campaign_stats.TABLE.path(settings))
            .where(F.to_date("window_start") == F.lit(day)).collect()}


def recomputed(spark, settings, day: date) -> set[tuple]:
    events = (spark.read.format("delta").load(silver.TABLE.path(settings))
              .where(F.col("event_date") == F.lit(day)))
    mapping = spark.read.format("delta").load(ad_campaigns.TABLE.path(settings))
    return {tuple(row) for row in campaign_stats.campaign_stats(
        events, mapping, settings.window_duration).collect()}


def test_a_reprocess_hands_its_gold_rebuild_to_the_driver_holding_the_gold_lease(
        spark, streamed) -> None:
    settings = streamed
    day = busiest_date(spark, settings)
    # Gold loses the day's windows (as after a faulty fix): the rebuild must bring them back.
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, campaign_stats.TABLE.path(settings)).delete(
        F.to_date("window_start") == F.lit(day))
    assert gold_of(spark, settings, day) == set()

    served: list[int] = []
    finished = threading.Event()

    def driver() -> None:  # what a continuous gold driver's rebuild thread does
        while not finished.is_set():
            served.append(writer.serve_requests(spark, settings))
            time.sleep(0.2)

    with leases(settings, ["gold"]):  # this process is the gold stream driver now
        thread = threading.Thread(target=driver)
        thread.start()
        try:
            done = run_lakehouse("reprocess", "--root", str(settings.root), "--from",
                                 str(day), "--to", str(day), "--layers", "gold", "--json",
                                 timeout=600)
        finally:
            finished.set()
            thread.join()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "handed to the gold stream driver" in done.stderr
    # Nothing to run in the reprocess's own process: it never started Spark.
    assert "log4j" not in done.stderr, done.stderr[-2000:]
    # The rebuild ran here, once, and its changes reached the reprocess's output.
    assert sum(served) == 1
    changes = {change["table"]: change for change in json.loads(done.stdout)["changes"]}
    assert changes["gold.campaign_stats"]["written"] is True
    assert changes["gold.campaign_stats"]["rows_before"] == {}
    assert gold_of(spark, settings, day) == recomputed(spark, settings, day) != set()
    rebuilt = spark.read.format("delta").load(gold_rebuilds.TABLE.path(settings))
    assert [row.event_date for row in rebuilt.collect()] == [day]
    assert list(writer.requests_dir(settings).iterdir()) == []  # nothing left behind


def test_a_request_nobody_serves_is_withdrawn_when_the_driver_exits(tmp_path) -> None:
    settings = make_settings(tmp_path / "lake")
    held, release = threading.Event(), threading.Event()

    def short_lived_driver() -> None:  # holds the lease, never serves, then exits
        with leases(settings, ["gold"]):
            held.set()
            release.wait()

    thread = threading.Thread(target=short_lived_driver)
    thread.start()
    held.wait()
    threading.Timer(2.0, release.set).start()
    asked = time.monotonic()
    # None: the caller runs the rebuild itself, now that the lease is free; not before.
    assert writer._hand_over(settings, DateRange(date(2026, 11, 20), date(2026, 11, 20))) is None
    assert time.monotonic() - asked >= 1.5
    thread.join()
    assert list(writer.requests_dir(settings).iterdir()) == []


def test_a_driver_waits_for_a_reprocess_but_not_for_another_driver(tmp_path) -> None:
    settings = make_settings(tmp_path / "lake")
    acquired: list[float] = []

    def starting_driver() -> None:
        with leases(settings, ["gold"]):
            acquired.append(time.monotonic())

    with leases(settings, ["gold"], purpose=REPROCESS):
        thread = threading.Thread(target=starting_driver)
        thread.start()
        time.sleep(2.0)
        assert acquired == []  # still waiting for the reprocess
        released = time.monotonic()
    thread.join(timeout=30)
    assert len(acquired) == 1 and acquired[0] >= released

    with (leases(settings, ["gold"]), pytest.raises(LeaseHeld, match="already running"),
          leases(settings, ["gold"])):
        pass


def test_a_gold_batch_waits_for_a_rebuild_under_way(spark, streamed) -> None:
    settings = streamed
    # Three silver events moved to a day nothing else touched (and no rebuild covered).
    day = date(2020, 1, 1)
    batch = (spark.read.format("delta").load(silver.TABLE.path(settings)).limit(3)
             .withColumn("event_time", F.to_timestamp(F.lit("2020-01-01 10:00:00")))
             .withColumn("event_date", F.lit(day)))

    def counted() -> int:
        return sum(views + clicks + purchases
                   for _, _, _, views, clicks, purchases, _ in gold_of(spark, settings, day))

    with writer.LOCK.rebuild():
        thread = threading.Thread(target=campaign_stats.process, args=(
            spark, batch, "test-gold-writer", 0), kwargs={"settings": settings})
        thread.start()
        time.sleep(5.0)
        assert thread.is_alive() and counted() == 0
    thread.join(timeout=300)
    assert not thread.is_alive() and counted() == 3  # it ran once the rebuild was done


def test_gold_batches_overlap_and_a_rebuild_runs_alone_without_being_starved() -> None:
    lock = writer.BatchesOrRebuild()
    entered: list[str] = []

    def hold(side: str, name: str) -> threading.Event:
        """A thread holding ``side`` of the lock until the returned event is set."""
        release = threading.Event()

        def run() -> None:
            with getattr(lock, side)():
                entered.append(name)
                release.wait(timeout=30)
        threading.Thread(target=run, daemon=True).start()
        return release

    def soon(condition) -> bool:
        deadline = time.monotonic() + 10
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.01)
        return condition()

    batches = [hold("batch", "stats"), hold("batch", "attribution")]
    assert soon(lambda: sorted(entered) == ["attribution", "stats"])  # both at once
    rebuild = hold("rebuild", "rebuild")
    assert soon(lambda: lock._rebuilds_waiting == 1)
    next_batch = hold("batch", "next batch")  # starts while the rebuild waits
    time.sleep(0.5)
    assert len(entered) == 2  # the rebuild waits for the batches, the next one for it
    for release in batches:
        release.set()
    assert soon(lambda: entered[2:] == ["rebuild"])
    time.sleep(0.5)
    assert entered[2:] == ["rebuild"]  # alone
    rebuild.set()
    assert soon(lambda: entered[2:] == ["rebuild", "next batch"])
    next_batch.set()

    with lock.rebuild(), lock.rebuild(), lock.batch(), lock.batch():  # its own, again
        pass
    with (lock.batch(), lock.batch(),
          pytest.raises(RuntimeError, match="inside a gold micro-batch"), lock.rebuild()):
        pass
    with lock.rebuild():  # everything was released
        pass
