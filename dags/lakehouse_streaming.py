"""
### lakehouse_streaming

Carries ad events from the landing zone (or Kafka) into bronze, silver and gold, and
raises click-fraud alerts within seconds (`ops.alerts`, and the `ad-alerts` topic with
Kafka), as one Spark driver submitted with `SparkSubmitOperator` on the `lakehouse_spark`
connection.

- **continuous** mode (`streaming_mode = "continuous"`, the default): a `@continuous` DAG.
  `run_streams` runs the streams until stopped; `watch_health` watches their heartbeats
  and fails the run when a stream stalls or its driver dies, and the next run restarts
  them. A second driver on the same checkpoints fails fast on the layer's lease.
  **Graceful stop for an upgrade:** pause this DAG, then `lakehouse stop`: every stream
  stops at a batch boundary and both tasks succeed.
- **scheduled** mode: the same job with `--available-now` on `streaming_schedule`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import dag

from lakehouse_airflow.jobs import assets, lakehouse_job
from lakehouse_airflow.sensors import StreamHealthSensor
from spark_jobs import config, registry

SETTINGS = config.load()
CONTINUOUS = SETTINGS.streaming_mode == "continuous"
PRODUCES = registry.published()


@dag(
    dag_id="lakehouse_streaming",
    schedule="@continuous" if CONTINUOUS else SETTINGS.streaming_schedule,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["lakehouse", "streaming"],
    doc_md=__doc__,
    # A killed driver's leases die with it, so its restart need not wait: the streams are
    # back in seconds (a minute was the longest gap of the kill test). A driver that keeps
    # failing fails its run, and @continuous starts the next one at once anyway.
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
)
def lakehouse_streaming() -> None:
    if CONTINUOUS:
        # A day, then a clean restart (SIGTERM stops at a batch boundary): long-lived but
        # never unbounded.
        lakehouse_job("run_streams", "stream", "--layers", "all",
                      execution_timeout=timedelta(days=1), outlets=assets(*PRODUCES))
        StreamHealthSensor(task_id="watch_health", retries=0, timeout=86_400,
                           execution_timeout=timedelta(days=1, minutes=10))
    else:
        lakehouse_job("run_streams", "stream", "--layers", "all", "--available-now",
                      outlets=assets(*PRODUCES))


lakehouse_streaming()
