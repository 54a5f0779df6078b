"""Appends made once per micro-batch: how a replay finds whether its batch committed."""

from datetime import datetime

import pytest
from pyspark.sql import functions as F

from spark_jobs import delta_reader
from spark_jobs.delta_writes import append_once, last_batch_committed

PLANNED = datetime(2026, 11, 22, 12, 0, 5)  # the batch's own time, stamped on its rows


def rows(spark, keys: list[str], stamp: datetime = PLANNED):
    return spark.createDataFrame([(key,) for key in keys], "key string").withColumn(
        "stamped_at", F.lit(stamp))


def append(spark, path: str, frame, batch_id: int, app_id: str = "q") -> bool:
    # No checkpoint of a run in this process: every batch may be a replay, and looks.
    return append_once(frame, path, f"{path}-checkpoint", batch_id, app_id=app_id,
                       stamp_column="stamped_at", key_column="key")


def test_a_batch_is_found_by_the_name_its_commit_carries(spark, tmp_path) -> None:
    path = str(tmp_path / "table")
    assert append(spark, path, rows(spark, ["a", "b"]), 3)
    assert not append(spark, path, rows(spark, ["a", "b"]), 3)  # a replay: not again
    # Its rows deleted since (a quarantine replay moved them out): the commit still says.
    spark.sql(f"DELETE FROM delta.`{path}`")
    assert not append(spark, path, rows(spark, ["a", "b"]), 3)
    assert append(spark, path, rows(spark, ["c"]), 4)  # the next batch
    # Another query's batches are its own; a write that used Delta's transaction
    # identifier (before this way of writing) counts for its query.
    assert append(spark, path, rows(spark, ["d"]), 4, app_id="another query")
    (rows(spark, ["e"]).write.format("delta").mode("append")
        .options(txnAppId="older query", txnVersion="9").save(path))
    assert last_batch_committed(path, "older query", since_ms=0) == 9
    assert last_batch_committed(path, "q", since_ms=0) == 4
    assert last_batch_committed(path, "never wrote", since_ms=0) == -1
    assert sorted(row.key for row in spark.read.format("delta").load(path).collect()) == [
        "c", "d", "e"]


def test_where_the_log_no_longer_reaches_back_the_rows_answer(spark, tmp_path) -> None:
    path = str(tmp_path / "table")
    append(spark, path, rows(spark, ["a", "b"]), 0)
    for batch_id in range(1, 12):  # a checkpoint at version 10 lets the log lose its start
        append(spark, path, rows(spark, [f"k{batch_id}"], datetime(2026, 11, 23)), batch_id)
    (tmp_path / "table" / "_delta_log" / f"{0:020d}.json").unlink()
    # Batch 0's commit is gone from the log, and query "q" has none since: not known.
    assert last_batch_committed(path, "p", since_ms=0) is None
    # So its rows are looked for: any of the batch's keys with the batch's time.
    assert not append(spark, path, rows(spark, ["b", "z"]), 0, app_id="p")
    assert append(spark, path, rows(spark, ["y"]), 0, app_id="p")  # none of them there
    assert delta_reader.count_rows(path) == 2 + 11 + 1


def write_log(table, commits: list[dict], landed_s: list[int]) -> None:
    """A table's log by hand: one commit a dict (its commitInfo), landed at those times."""
    import json
    import os

    log = table / "_delta_log"
    log.mkdir(parents=True)
    for version, (info, landed) in enumerate(zip(commits, landed_s, strict=True)):
        entry = log / f"{version:020d}.json"
        entry.write_text(json.dumps({"commitInfo": info}) + "\n")
        os.utime(entry, (landed, landed))


def test_the_walk_stops_at_a_commit_that_landed_before_the_batch_was_planned(tmp_path
                                                                             ) -> None:
    table = tmp_path / "table"
    write_log(table, [
        {"timestamp": 1_000_000, "userMetadata": '{"appended_batch": ["q", 1]}'},
        # Retried after conflicts: its commitInfo says when its first attempt began, long
        # before it landed (above batch 1's commit).
        {"timestamp": 1, "operation": "OPTIMIZE"},
        {"timestamp": 3_000_000, "userMetadata": '{"appended_batch": "not ours"}'},
        {"timestamp": 3_000_000, "userMetadata": "free text"},
    ], landed_s=[1_000, 2_000, 3_000, 3_000])
    # Planned after batch 1 landed: the walk passes the retried commit and finds batch 1.
    assert last_batch_committed(str(table), "q", since_ms=1_500_000) == 1
    # Planned after everything landed: nothing of "q" since, and the walk stops there.
    assert last_batch_committed(str(table), "q", since_ms=2_500_000) == -1


def test_the_latest_version_is_found_from_the_last_checkpoint(tmp_path) -> None:
    table = tmp_path / "table"
    write_log(table, [{"timestamp": 0}] * 13, landed_s=[0] * 13)
    log = table / "_delta_log"
    assert delta_reader.latest_version(table) == 12  # no checkpoint: counted from the first
    (log / "_last_checkpoint").write_text('{"version": 10, "size": 3}')
    for version in range(10):  # cleaned up below the checkpoint
        (log / f"{version:020d}.json").unlink()
    (log / f"{10:020d}.checkpoint.parquet").write_text("")
    assert delta_reader.latest_version(table) == 12
    (log / "_last_checkpoint").write_text('{"vers')  # caught being rewritten
    assert delta_reader.latest_version(table) == 12
    assert delta_reader.latest_version(tmp_path / "none") == -1


def test_only_a_run_s_first_batch_looks_for_an_earlier_attempt(tmp_path, monkeypatch
                                                               ) -> None:
    """Spark plans a batch again only when a query starts: later batches of a run append
    without looking (no table state to rebuild), and so does none after a failure."""
    from delta.exceptions import ConcurrentAppendException

    from spark_jobs import delta_writes
    from spark_jobs.delta_writes import exactly_once_batches, may_be_replay

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text('{"id":"q-1"}\n')
    asked: list[tuple[int, bool]] = []

    def process(session, batch, app_id, batch_id) -> None:
        asked.append((batch_id, may_be_replay(str(checkpoint), batch_id)))
        if asked == [(4, True), (5, False), (6, False), (7, False)]:
            raise RuntimeError("the batch fails after its append")
        if asked[-1] == (9, False):
            raise ConcurrentAppendException("a conflict after a first commit: retried")

    class Batch:
        sparkSession = None

    monkeypatch.setattr(delta_writes.time, "sleep", lambda seconds: None)  # the retry's pause
    run = exactly_once_batches(str(checkpoint), process)
    for batch_id in (4, 5, 6):
        run(Batch(), batch_id)
    with pytest.raises(RuntimeError):
        run(Batch(), 7)
    another_run = exactly_once_batches(str(checkpoint), process)
    another_run(Batch(), 7)
    another_run(Batch(), 8)
    another_run(Batch(), 9)
    assert asked == [(4, True), (5, False), (6, False), (7, False), (7, True), (8, False),
                     (9, False), (9, True)]


def test_a_query_reading_kafka_holds_no_delta_position(tmp_path) -> None:
    # The alert stream reads bronze's table with the landing zone, the topic with Kafka:
    # VACUUM asks every stream what it has yet to read of its Delta source.
    from spark_jobs.delta_writes import fully_read_before

    checkpoint = tmp_path / "ops_alerts"
    for folder in ("offsets", "commits"):
        (checkpoint / folder).mkdir(parents=True)
    (checkpoint / "commits" / "0").write_text("v1\n{}\n")
    metadata = '{"batchWatermarkMs":0,"batchTimestampMs":1795800000000,"conf":{}}'
    (checkpoint / "offsets" / "0").write_text(f'v1\n{metadata}\n{{"clicks":{{"0":42}}}}\n')
    assert fully_read_before(str(checkpoint)) is None
    (checkpoint / "offsets" / "0").write_text(
        f'v1\n{metadata}\n{{"sourceVersion":1,"reservoirId":"r","reservoirVersion":7,'
        f'"index":-1,"isStartingVersion":false}}\n')
    assert fully_read_before(str(checkpoint)) == 7
    # Any other shape is an error, not a reason to let VACUUM remove what may be unread.
    (checkpoint / "offsets" / "0").write_text(f'v1\n{metadata}\n{{"logOffset":3}}\n')
    with pytest.raises(ValueError, match="no known source"):
        fully_read_before(str(checkpoint))
