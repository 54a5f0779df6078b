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

from airflow.sdk import CronTriggerTimetable, dag

from lakehouse_airflow.jobs import lakehouse_job


@dag(
    dag_id="lakehouse_maintenance",
    # No start_date, and no grace: the first run waits for the next 02:30, rather than
    # running the one just missed the moment the DAG is unpaused (beside the streams' own
    # start). Airflow 3.3 reads run_immediately=False like None, a grace of a tenth of the
    # period (2.4 hours after 02:30); only a zero grace waits.
    schedule=CronTriggerTimetable("30 2 * * *", timezone="UTC", run_immediately=timedelta(0)),
    catchup=False,
    max_active_runs=1,
    tags=["lakehouse", "maintenance"],
    doc_md=__doc__,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
)
def lakehouse_maintenance() -> None:
    lakehouse_job("maintain_tables", "maintain", execution_timeout=timedelta(hours=4))


lakehouse_maintenance()
