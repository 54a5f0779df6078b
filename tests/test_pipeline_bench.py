"""The pipeline bench's arithmetic (no Spark)."""

from spark_jobs.pipeline_bench import _covered_seconds


def test_a_layer_s_time_counts_side_by_side_batches_once() -> None:
    # Gold's two queries from 0 to 10 s and 4 to 12 s, then a batch from 20 to 21 s:
    # something ran during 0-12 and 20-21, 13 s, not the 19 s the durations add up to.
    assert _covered_seconds([(4.0, 12.0), (0.0, 10.0), (20.0, 21.0)]) == 13.0
    # One batch inside another adds nothing; one query's batches in turn add up.
    assert _covered_seconds([(0.0, 10.0), (2.0, 3.0)]) == 10.0
    assert _covered_seconds([(0.0, 2.0), (2.0, 5.0)]) == 5.0
    assert _covered_seconds([]) == 0.0
