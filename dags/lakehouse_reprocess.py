"""
### lakehouse_reprocess

Rebuilds event dates of silver and gold from bronze with `lakehouse reprocess`
(idempotent: a second run changes nothing).

- **Nightly / backfill:** each run's data interval is the UTC day it rebuilds, so
  `airflow backfill create --dag-id lakehouse_reprocess --from-date 2026-11-01
  --to-date 2026-11-07` (or the UI's backfill) rebuilds those seven days, one run per day.
  The nightly run starts at midnight UTC and rebuilds the day that just ended.
  Every run also repairs the dates the late-data ledger lists (`--late`).
- **Manual runs** take `from` and `to` (YYYY-MM-DD, both included), `layers` and
  `quarantine` (re-validate quarantined records with the current rules first).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import Param, dag
from airflow.timetables.interval import CronDataIntervalTimetable

from lakehouse_airflow.jobs import assets, is_true, lakehouse_job

DATE = r"^(\d{4}-\d{2}-\d{2})?$"
REBUILDS = ("silver.ad_events", "gold.campaign_stats", "gold.ad_attribution")


@dag(
    dag_id="lakehouse_reprocess",
    # Midnight to midnight: a run's data interval is exactly the UTC day it rebuilds, so a
    # backfill's --from-date and --to-date are the first and last day rebuilt (an offset
    # schedule would shift the days and drop the last one). Later arrivals are repaired by
    # the late-data step of a later run.
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=4,
    tags=["lakehouse", "reprocessing"],
    doc_md=__doc__,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=2)},
    params={
        "from": Param("", type="string", pattern=DATE,
                      description="first event date (YYYY-MM-DD); empty: the run's day"),
        "to": Param("", type="string", pattern=DATE,
                    description="last event date, included; empty: the run's day"),
        "layers": Param("silver,gold", type="string", enum=["silver,gold", "silver", "gold"]),
        "quarantine": Param(False, type="boolean",
                            description="first move quarantined records that now pass"),
    },
)
def lakehouse_reprocess() -> None:
    quarantine_requested = ShortCircuitOperator(
        task_id="quarantine_requested", python_callable=is_true,
        op_args=["{{ params.quarantine }}"], ignore_downstream_trigger_rules=False,
        execution_timeout=timedelta(minutes=5))
    replay = lakehouse_job("replay_quarantine", "reprocess", "--quarantine",
                           "--layers", "{{ params.layers }}", outlets=assets(*REBUILDS))
    rebuild = lakehouse_job(
        "rebuild_dates", "reprocess",
        "--from", "{{ params['from'] or (data_interval_start | ds) }}",
        "--to", "{{ params['to'] or (data_interval_start | ds) }}",
        "--layers", "{{ params.layers }}", outlets=assets(*REBUILDS),
        trigger_rule="none_failed")
    repair_late = lakehouse_job("repair_late_dates", "reprocess", "--late",
                                outlets=assets(*REBUILDS[1:]))
    quarantine_requested >> replay >> rebuild >> repair_late


lakehouse_reprocess()
