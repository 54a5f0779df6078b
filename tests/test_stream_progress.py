"""``ops.stream_progress`` records each micro-batch as Spark reported it, and nothing else."""

import json
import uuid

from pyspark.sql.streaming.listener import StreamingQueryProgress

from spark_jobs import delta_reader
from spark_jobs.ops import stream_progress

QUERY_ID, RUN_ID = str(uuid.uuid4()), str(uuid.uuid4())


def delta_offset(version: int, index: int) -> str:
    return json.dumps({"sourceVersion": 1, "reservoirId": "r", "reservoirVersion": version,
                       "index": index, "isStartingVersion": False})


def report(batch_id: int, rows: int, ends: list[str], ran: bool) -> StreamingQueryProgress:
    """A progress report as Spark gives it: with ``addBatch`` in its durations only when
    the trigger ran a batch."""
    durations = {"triggerExecution": 5, "latestOffset": 1, **({"addBatch": 3} if ran else {})}
    return StreamingQueryProgress.fromJson({
        "id": QUERY_ID, "runId": RUN_ID, "name": "gold_ad_attribution",
        "timestamp": f"2026-11-27T10:00:{batch_id:02d}.000Z", "batchId": batch_id,
        "batchDuration": 5, "durationMs": durations, "numInputRows": rows,
        "stateOperators": [], "sink": {"description": "foreachBatch", "numOutputRows": -1},
        "sources": [{"description": "DeltaSource", "startOffset": None, "endOffset": end,
                     "latestOffset": None, "numInputRows": rows, "inputRowsPerSecond": 0.0,
                     "processedRowsPerSecond": 0.0} for end in ends]})


class Query:
    def __init__(self, *reports: StreamingQueryProgress) -> None:
        self.recentProgress = list(reports)


def test_an_idle_trigger_does_not_stand_for_the_batch_after_it(spark, settings) -> None:
    # Batch 4 read silver's versions up to 7 (a file of version 7 read: index 0); an idle
    # trigger then reports under batch 5's id, where 4 stopped; batch 5 itself read up to 9
    # (version 9 not started: index -1), one side of the join a version behind the other.
    batch_4 = report(4, 30, [delta_offset(7, 0)] * 2, ran=True)
    idle = report(5, 0, [delta_offset(7, 0)] * 2, ran=False)
    batch_5 = report(5, 12, [delta_offset(9, -1), delta_offset(10, -1)], ran=True)
    recorder = stream_progress.ProgressRecorder()
    recorder.collect([Query(batch_4, idle)])
    recorder.flush(spark, settings, [Query(batch_4, idle, batch_5)])
    rows = delta_reader.read_rows(stream_progress.TABLE.path(settings),
                                  ["batch_id", "num_input_rows", "query_id",
                                   "source_read_before"])
    # What the side behind reached was read by both: 9 for batch 5.
    assert sorted((r["batch_id"], r["num_input_rows"], r["source_read_before"]) for r in rows
                  ) == [(4, 30, 8), (5, 12, 9)]
    assert {r["query_id"] for r in rows} == {QUERY_ID}
    assert stream_progress.read_position(settings, QUERY_ID, 5) == 9
    assert stream_progress.read_position(settings, QUERY_ID, 6) is None  # not recorded yet
