"""Crash points: named places in a micro-batch where the chaos battery kills a driver.

A random SIGKILL lands mostly where a driver spends its time; the windows that exactly-once
hinges on (the quarantine appended but no event inserted yet, one of silver's two MERGEs
committed, gold's late-data ledger written before its MERGE, a batch written but not yet in
the checkpoint's commit log) are short, so they are named here and hit on purpose.

``LAKEHOUSE_CRASH_AT=<point>`` makes the driver kill its JVM and itself with SIGKILL the
first time it passes that point; ``<point>+<seconds>`` does it that long after passing it,
from a timer, so the kill lands inside the work that follows (a MERGE under way). Unset, a
crash point costs one dictionary lookup. Only ``lakehouse chaos`` and the tests set it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from spark_jobs import registry

log = logging.getLogger(__name__)

CRASH_AT_VARIABLE = "LAKEHOUSE_CRASH_AT"

# Every point the code passes, so a chaos schedule (or a typo in one) is checked up front:
# each stream's batch boundaries (``delta_writes.start_exactly_once``), and the points
# inside a batch that its table's module passes.
INSIDE_BATCHES = (
    "silver_ad_events.after_quarantine",
    "silver_ad_events.between_merges",
    "gold_campaign_stats.after_ledger",
    "gold_user_sessions.after_ledger",
    "ops_alerts.after_publish",
)
POINTS = (*(f"{query}.{edge}" for query in registry.query_names()
            for edge in ("before_batch", "after_batch")), *INSIDE_BATCHES)


def parse(spec: str) -> tuple[str, float]:
    """``point`` or ``point+seconds`` as (point, delay); a ValueError names what is wrong."""
    point, _, delay_text = spec.partition("+")
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}: one of {', '.join(POINTS)}")
    try:
        delay = float(delay_text) if delay_text else 0.0
    except ValueError:
        raise ValueError(f"crash point {spec!r}: the delay after '+' must be seconds") from None
    if delay < 0:
        raise ValueError(f"crash point {spec!r}: the delay must not be negative")
    return point, delay


def crash_point(point: str) -> None:
    """Kill this driver here if ``LAKEHOUSE_CRASH_AT`` names ``point``."""
    spec = os.environ.get(CRASH_AT_VARIABLE)
    if not spec or spec.partition("+")[0] != point:
        return
    _, delay = parse(spec)
    if delay:
        timer = threading.Timer(delay, _kill, args=(point, delay))
        timer.daemon = True
        timer.start()
    else:
        _kill(point, 0.0)


def _kill(point: str, delay: float) -> None:
    # Said on stderr first, so the battery can tell its kill from an unrelated death.
    print(f"crash point {point} (+{delay:g}s): SIGKILL of the driver and its JVM",
          file=sys.stderr, flush=True)
    if os.getpgrp() == os.getpid():  # a process group of its own: the JVM is in it
        os.killpg(os.getpid(), signal.SIGKILL)
    from pyspark import SparkContext

    gateway = SparkContext._gateway  # noqa: SLF001 - the JVM's process, to kill it too
    if gateway is not None and getattr(gateway, "proc", None) is not None:
        os.kill(gateway.proc.pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
