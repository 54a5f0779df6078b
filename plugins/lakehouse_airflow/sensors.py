"""``StreamHealthSensor``: watches the continuous streams beside their driver task.

It pokes (in ``reschedule`` mode, so it holds no worker slot between pokes) the drivers'
heartbeats and leases (``spark_jobs.ops.heartbeat``):

- all drivers stopped on request (``lakehouse stop``): success, the run ends cleanly;
- a stream stalled, or its driver exited without a stop request: the driver, if still
  alive, is asked to stop at a batch boundary (SIGTERM), and the sensor fails the run
  without retry, which Airflow shows in red; the ``@continuous`` schedule then starts a
  fresh run, so the streams are back within a few minutes;
- otherwise: healthy, poke again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException

from spark_jobs import config
from spark_jobs.ops import heartbeat


class StreamHealthSensor(BaseSensorOperator):
    """Succeeds when the streams stop on request; fails when one stalls or dies."""

    def __init__(self, *, startup_grace: timedelta = timedelta(minutes=3),
                 **kwargs: Any) -> None:
        kwargs.setdefault("mode", "reschedule")
        kwargs.setdefault("poke_interval", 30)
        super().__init__(**kwargs)
        self.startup_grace = startup_grace

    def poke(self, context: Any) -> bool:
        settings = config.load()
        started = context["ti"].start_date or datetime.now(UTC)
        verdict = heartbeat.health(settings)
        if verdict.stopped_cleanly and not verdict.running:
            self.log.info("every stream stopped on request")
            return True
        if datetime.now(UTC) - started < self.startup_grace:
            return False  # the driver may still be starting
        if not verdict.running and not verdict.problems:
            raise AirflowFailException("no driver is running the streams")
        if verdict.problems:
            self._stop_local_drivers(settings)
            raise AirflowFailException("; ".join(verdict.problems))
        return False

    def _stop_local_drivers(self, settings: config.Settings) -> None:
        for who in heartbeat.live_drivers(settings):
            if who.get("host") == socket.gethostname() and who.get("pid"):
                self.log.warning("asking driver %s to stop", who["pid"])
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(who["pid"]), signal.SIGTERM)
