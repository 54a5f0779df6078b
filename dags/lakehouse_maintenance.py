"""
### lakehouse_maintenance

Nightly `lakehouse maintain` over every table, one after another in one Spark
application (one JVM to start, and the streams keep their cores): OPTIMIZE (bin-packing
and Z-ordering on the columns queries filter on) then VACUUM with a retention never
shorter than the time-travel window or the longest stream lag plus a safety margin. Safe
beside the live streams; the figures per table (files, bytes, duration) go to
`ops.maintenance_history` and the task log.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import dag

from lakehouse_airflow.jobs import lakehouse_job


@dag(
    dag_id="lakehouse_maintenance",
    schedule="30 2 * * *",
    # No start_date: the first run waits for the next scheduled time, rather than running
    # the latest missed one the moment the DAG is unpaused.
    catchup=False,
    max_active_runs=1,
    tags=["lakehouse", "maintenance"],
    doc_md=__doc__,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
)
def lakehouse_maintenance() -> None:
    lakehouse_job("maintain_tables", "maintain", execution_timeout=timedelta(hours=4))


lakehouse_maintenance()
