"""
### lakehouse_quality

`lakehouse validate`: every table's Great Expectations suite (`expectations/`) over its
current snapshot. Runs hourly, and as soon as a producer (the scheduled streams, a
reprocess) updates silver or gold. A failed **critical** expectation fails the task;
warnings are reported only. Each run appends to `quality.results`, updates the Data Docs
and writes the data quality report, linked from the navigation bar under
*Browse → Data quality report*.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import AssetAny, AssetOrTimeSchedule, CronTriggerTimetable, dag

from lakehouse_airflow.jobs import assets, lakehouse_job
from spark_jobs import registry

# The layers a reprocess rebuilds: the streams' task updates them too, with bronze.
VALIDATED_ON_UPDATE = registry.published(registry.REPROCESSED_LAYERS)


@dag(
    dag_id="lakehouse_quality",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("0 * * * *", timezone="UTC",
                                       run_immediately=timedelta(0)),
        assets=AssetAny(*assets(*VALIDATED_ON_UPDATE))),
    # No start_date, and no grace: the first run waits for the next hour, rather than
    # running the one just missed the moment the DAG is unpaused (a tenth of the period
    # with run_immediately=False, which Airflow 3.3 reads like None).
    catchup=False,
    max_active_runs=1,
    tags=["lakehouse", "quality"],
    doc_md=__doc__,
    # One retry covers a lost executor; a critical failure fails again, as it should.
    default_args={"retries": 1, "retry_delay": timedelta(minutes=2)},
)
def lakehouse_quality() -> None:
    lakehouse_job("validate", "validate", execution_timeout=timedelta(hours=1))


lakehouse_quality()
