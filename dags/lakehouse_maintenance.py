"""
### lakehouse_maintenance

Nightly `lakehouse maintain` per table, one task each: OPTIMIZE (bin-packing and
Z-ordering on the columns queries filter on) then VACUUM with a retention never shorter
than the time-travel window or the longest stream lag plus a safety margin. Safe beside
the live streams; each task's figures (files, bytes, duration) go to
`ops.maintenance_history` and its log.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import dag

from lakehouse_airflow.jobs import lakehouse_job

TABLES = ("bronze.ad_events", "silver.ad_events", "silver.quarantine",
          "gold.campaign_stats", "gold.ad_attribution")


@dag(
    dag_id="lakehouse_maintenance",
    schedule="30 2 * * *",
    # No start_date: the first run waits for the next scheduled time, rather than running
    # the latest missed one the moment the DAG is unpaused.
    catchup=False,
    max_active_runs=1,
    # One table at a time: each task is a Spark application, and the streams need cores too.
    max_active_tasks=1,
    tags=["lakehouse", "maintenance"],
    doc_md=__doc__,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
)
def lakehouse_maintenance() -> None:
    for table in TABLES:
        lakehouse_job(f"maintain_{table.replace('.', '_')}", "maintain", "--tables", table,
                      execution_timeout=timedelta(hours=3))


lakehouse_maintenance()
