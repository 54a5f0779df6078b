"""Appends made once per micro-batch: how a replay finds whether its batch committed."""

from datetime import datetime

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
