"""One driver per stream: an exclusive lease on each layer's checkpoints.

Two drivers on one checkpoint would race for the same micro-batch ids. A driver therefore
holds an OS lock (``flock``) on ``<root>/checkpoints/<layer>.lease`` for as long as it
lives; the lock dies with the process, so a crashed driver never leaves a stale lease, and
a retry that starts beside a lingering driver fails at once with the holder's identity.
With the checkpoints on an object store, where no OS lock reaches, the lease is an object
changed only by S3's conditional writes, renewed while held (``store_leases``).
The lease files also say who runs what, which the stop request and health checks read.
A reprocess that writes gold while no driver runs it holds the gold lease too; a driver
starting meanwhile waits for it instead of failing.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path

from spark_jobs import storage
from spark_jobs.config import ConfigError, Settings
from spark_jobs.ops import store_leases

log = logging.getLogger(__name__)

# Who holds a lease: a stream driver for as long as it runs, or a reprocess writing the
# layer's tables while no driver runs it (``spark_jobs.gold.writer``).
STREAM, REPROCESS = "stream", "reprocess"
# How long a driver starting beside a reprocess waits for it before giving up.
REPROCESS_PATIENCE_SECONDS = 3600.0


class LeaseHeld(RuntimeError):
    """Another live driver runs this layer; the message names it."""


def lease_file(settings: Settings, layer: str) -> Path:
    return settings.checkpoints_dir / f"{layer}.lease"


def holder(settings: Settings, layer: str) -> dict[str, object] | None:
    """Who holds the layer's lease, if anyone does right now."""
    path = lease_file(settings, layer)
    if storage.is_object_store(path):
        record = store_leases.read(path)
        return record if store_leases.live(record) else None
    if not path.exists():
        return None
    with path.open("r", encoding="utf-8") as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = probe.read().strip()
            return json.loads(text) if text else {}
        fcntl.flock(probe, fcntl.LOCK_UN)
        return None


def driver(settings: Settings, layer: str) -> dict[str, object] | None:
    """The stream driver holding the layer's lease, if one does (a reprocess is not one)."""
    who = holder(settings, layer)
    return who if who is not None and who.get("purpose") != REPROCESS else None


class _Busy(Exception):
    """A reprocess holds the lease, or it is changing hands: try again shortly."""


@contextmanager
def _lease(settings: Settings, layer: str, purpose: str) -> Iterator[None]:
    path = lease_file(settings, layer)
    if storage.is_object_store(path):  # no OS lock reaches there: conditional writes
        spark = store_leases.driver_session()
        if spark is None:
            raise ConfigError(f"the {layer} lease on the object store is taken through a "
                              f"Spark session, and this process has none")
        with store_leases.held(spark, path, purpose, _Busy,
                               lambda text: _already_running(layer, text), layer):
            yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            text = handle.read().strip()
            held_by = store_leases.parse_record(text)
            # Empty: the holder is writing it or letting go (or a reader probes it).
            if not held_by or held_by.get("purpose") == REPROCESS:
                raise _Busy(text) from None
            raise _already_running(layer, text) from None
        handle.truncate(0)
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": datetime.now(UTC).isoformat(),
                                 "purpose": purpose}))
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)


def refuse_if_running(settings: Settings, layers: Sequence[str]) -> None:
    """Raise ``LeaseHeld`` if a stream driver holds one of ``layers``' leases now: a look,
    not a claim (``leases`` claims them), so that a command bound to be refused says so
    before it starts a JVM."""
    for layer in layers:
        if (who := driver(settings, layer)) is not None:
            raise _already_running(layer, json.dumps(who))


def _already_running(layer: str, holder_record: str) -> LeaseHeld:
    return LeaseHeld(f"the {layer} stream is already running under another driver "
                     f"({holder_record}); stop it first (lakehouse stop) or wait for it to "
                     f"exit")


@contextmanager
def leases(settings: Settings, layers: Sequence[str], purpose: str = STREAM
           ) -> Iterator[None]:
    """Hold every layer's lease, or none: one a stream driver holds raises at once; while
    a reprocess holds one, wait (holding none of them) and try again."""
    deadline = time.monotonic() + REPROCESS_PATIENCE_SECONDS
    waiting = False
    while True:
        stack = ExitStack()
        try:
            for layer in layers:
                stack.enter_context(_lease(settings, layer, purpose))
            break
        except _Busy as busy:
            stack.close()
            if time.monotonic() > deadline:
                raise LeaseHeld(f"a reprocess has held the leases of {', '.join(layers)} "
                                f"for over {REPROCESS_PATIENCE_SECONDS / 60:.0f} minutes "
                                f"({busy})") from None
            if not waiting and str(busy):
                log.info("waiting for the reprocess holding a lease (%s)", busy)
                waiting = True
            time.sleep(0.5)
        except BaseException:
            stack.close()
            raise
    with stack:
        yield
