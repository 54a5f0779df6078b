"""Schedules of the lakehouse DAGs that Airflow's own timetables do not offer.

Registered by the plugin (``lakehouse_plugin.py``): the scheduler and the API server
deserialize a DAG's timetable by its registered class.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from airflow.timetables import interval
from airflow.timetables.base import DagRunInfo
from airflow.timetables.interval import CronDataIntervalTimetable

if TYPE_CHECKING:
    from airflow.timetables.base import DataInterval, TimeRestriction


class NightlyDays(CronDataIntervalTimetable):
    """Midnight-to-midnight data intervals (a run rebuilds exactly its day, so a backfill's
    dates are the days rebuilt), each run starting at the midnight that ends its day, and
    within ``GRACE`` of it or not at all.

    Airflow's ``CronDataIntervalTimetable`` with ``catchup=False`` runs the day that ended
    last whenever the scheduler gets to it: the moment the DAG is unpaused (``make run``
    at any hour started a rebuild JVM beside the streams' own start), or right after a
    backfill of earlier days. A night missed by more than ``GRACE`` when the scheduler next
    works out the DAG's next run (the DAG unpaused later in the day, a backfill finished)
    is left to a backfill instead; the next night's late-data repair covers every date the
    ledger lists, missed night or not. (A run the scheduler had already worked out before
    it was itself stopped past its night may still start when it comes back: it creates
    runs from the times it stored.) Backfills use the intervals as they are.
    """

    GRACE = timedelta(hours=2)

    def next_dagrun_info(self, *, last_automated_data_interval: DataInterval | None,
                         restriction: TimeRestriction) -> DagRunInfo | None:
        info = super().next_dagrun_info(last_automated_data_interval=last_automated_data_interval,
                                        restriction=restriction)
        if info is None or restriction.catchup:
            return info
        # Airflow's own clock for timetables, read through its module (tests move it).
        now = interval.coerce_datetime(interval.utcnow())
        if info.run_after >= now - self.GRACE:
            return info
        # Too late for that night: the day under way, at the midnight that ends it.
        start = self._align_to_prev(now)
        end = self._get_next(start)
        if restriction.latest is not None and start > restriction.latest:  # as Airflow's own
            return None
        return DagRunInfo.interval(start, end)
