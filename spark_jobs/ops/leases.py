"""One driver per stream: an exclusive lease on each layer's checkpoints.

Two drivers on one checkpoint would race for the same micro-batch ids. A driver therefore
holds an OS lock (``flock``) on ``<root>/checkpoints/<layer>.lease`` for as long as it
lives; the lock dies with the process, so a crashed driver never leaves a stale lease, and
a retry that starts beside a lingering driver fails at once with the holder's identity.
The lease files also say who runs what, which the stop request and health checks read.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path

from spark_jobs.config import Settings


class LeaseHeld(RuntimeError):
    """Another live driver runs this layer; the message names it."""


def lease_file(settings: Settings, layer: str) -> Path:
    return settings.checkpoints_dir / f"{layer}.lease"


def holder(settings: Settings, layer: str) -> dict[str, object] | None:
    """Who holds the layer's lease, if anyone does right now."""
    path = lease_file(settings, layer)
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


@contextmanager
def _lease(settings: Settings, layer: str) -> Iterator[None]:
    path = lease_file(settings, layer)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise LeaseHeld(f"the {layer} stream is already running under another driver "
                            f"({handle.read().strip() or 'unknown holder'}); stop it first "
                            f"(lakehouse stop) or wait for it to exit") from None
        handle.truncate(0)
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": datetime.now(UTC).isoformat()}))
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def leases(settings: Settings, layers: Sequence[str]) -> Iterator[None]:
    """Hold every layer's lease, or none (the first one held elsewhere raises)."""
    with ExitStack() as stack:
        for layer in layers:
            stack.enter_context(_lease(settings, layer))
        yield
