"""
### lakehouse_reprocess

Rebuilds event dates of silver and gold from bronze with `lakehouse reprocess`
(idempotent: a second run changes nothing).

- **Nightly / backfill:** each run's data interval is the UTC day it rebuilds (midnight to
  midnight), so `airflow backfill create --dag-id lakehouse_reprocess --from-date
  2026-11-01 --to-date 2026-11-07`, or the UI's *Run Backfill* with only the two dates,
  rebuilds those seven days, one run per day. Leave `from` and `to` empty in a backfill:
  given, every run of the backfill would rebuild that whole range. The nightly run starts
  at midnight UTC and rebuilds the day that just ended, then repairs the dates the
  late-data ledger lists (`--late`), in the same Spark application. A night's run starts
  within two hours of its midnight: unpausing the DAG (as `make run` does) or finishing a
  backfill does not rebuild a night long over; backfill a missed day.
  Backfill and manual runs rebuild their days and nothing else.
- **Manual runs** (*Trigger*) take `from` and `to` (YYYY-MM-DD, both included; empty: the
  run's day), `layers` and `quarantine` (re-validate quarantined records with the current
  rules first). No parameter is required; a bad date is refused, naming the parameter.

**Which day did a run rebuild?** The run's *data interval start* (run details), which for
scheduled and backfill runs is also the *logical date* the grid's tooltip shows. Not the date
in the run id: Airflow names a scheduled or backfill run after the moment it may start, the
end of its interval, so `backfill__2026-11-23T00:00:00+00:00` rebuilt 2026-11-22 (Airflow
3.3 builds backfill run ids itself; a timetable cannot rename them). A manual
run triggered at a given logical date rebuilds the day before it (the last complete day),
or `from`..`to` when given; one triggered without a logical date, the day before it ran.
At most `reprocess_parallel_days` days rebuild at once (2 on the embedded default), whatever
started them (a backfill, with whatever *max active runs* it was given, the nightly run, a
manual trigger): the rebuild tasks carry the bound; the other days wait their turn. The
*Run Backfill* dialog's *Max Active Runs* (1 unless changed) lets only that many of its days
run at once.
The task *rebuild the run's day (or from..to)* states the exact range: its *Rendered
Templates* tab shows `--from … --to …`, and its log the submitted command. (A task cannot
write the run's note in Airflow 3: the Task SDK has no call for it; add a note when
triggering instead.)
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import Param, dag

from lakehouse_airflow.jobs import assets, is_true, lakehouse_job
from lakehouse_airflow.timetables import NightlyDays
from spark_jobs import config, registry

REBUILDS = registry.published(registry.REPROCESSED_LAYERS)
ALL_LAYERS = ",".join(registry.REPROCESSED_LAYERS)
# Rebuilds at once, whatever started them: a backfill's runs are bounded by the backfill's
# own max_active_runs (the dialog's field, 10 over the REST API), not the DAG's, so the
# Spark tasks carry the bound themselves.
PARALLEL_DAYS = config.load().reprocess_parallel_days


def run_day(dag_run: Any) -> str:
    """The UTC day (YYYY-MM-DD) a run rebuilds when no ``from``/``to`` is given.

    It is the start of the run's data interval. A run triggered without a logical date
    has no data interval (Airflow 3), so it takes the day before it ran, as the nightly
    run and a manual run at that moment would.
    """
    start = dag_run.data_interval_start
    if start is None:
        start = dag_run.run_after - timedelta(days=1)
    return start.astimezone(UTC).date().isoformat()


def optional_date(description: str) -> Param:
    """A date param the UI shows as optional (a ``null`` type) with a date picker.

    A plain ``"string"`` type is required in Airflow 3's UI: its Trigger and Run Backfill
    buttons stay disabled until a date is typed, and an emptied field is sent as null.
    """
    return Param(None, type=["null", "string"], format="date",
                 pattern=r"^\d{4}-\d{2}-\d{2}$", description=description)


@dag(
    dag_id="lakehouse_reprocess",
    # Midnight to midnight: a run's data interval is exactly the UTC day it rebuilds, so a
    # backfill's --from-date and --to-date are the first and last day rebuilt (an offset
    # schedule would shift the days and drop the last one). Later arrivals are repaired by
    # the late-data step of a later run. Unpausing does not start a rebuild for a night
    # long over (NightlyDays).
    schedule=NightlyDays("0 0 * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=PARALLEL_DAYS,
    tags=["lakehouse", "reprocessing"],
    doc_md=__doc__,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=2)},
    user_defined_macros={"run_day": run_day},
    params={
        "from": optional_date("first event date (YYYY-MM-DD); empty: the run's day "
                              "(leave empty for a backfill)"),
        "to": optional_date("last event date, included; empty: the run's day "
                            "(leave empty for a backfill)"),
        "layers": Param(ALL_LAYERS, type="string",
                        enum=[ALL_LAYERS, *registry.REPROCESSED_LAYERS],
                        description="the layers to rebuild"),
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
                           "--layers", "{{ params.layers }}", outlets=assets(*REBUILDS),
                           max_active_tis_per_dag=PARALLEL_DAYS)
    rebuild = lakehouse_job(
        "rebuild_dates", "reprocess",
        "--from", "{{ params['from'] or run_day(dag_run) }}",
        "--to", "{{ params['to'] or run_day(dag_run) }}",
        "--layers", "{{ params.layers }}",
        "{{ '--late' if dag_run.run_type == 'scheduled' else '--no-late' }}",
        outlets=assets(*REBUILDS), max_active_tis_per_dag=PARALLEL_DAYS,
        trigger_rule="none_failed", task_display_name="rebuild the run's day (or from..to)",
        doc_md="Rebuilds the run's data interval day, or `from`..`to` when given; the "
               "nightly run then repairs the dates the late-data ledger lists (`--late`, in "
               "the same Spark application). The *Rendered Templates* tab shows the exact "
               "`--from` and `--to`.")
    quarantine_requested >> replay >> rebuild


lakehouse_reprocess()
