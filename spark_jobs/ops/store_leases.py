"""The checkpoint lease on an object store (``s3a://``), where no OS lock reaches.

A lease is an object ``<checkpoints>/<layer>.lease`` holding who holds it (pid, host,
process namespace, since, purpose, a token of its own) and when it was last renewed. Every
change is a conditional write, which S3 checks atomically: taking a free lease creates the
object only if it is absent (``If-None-Match``); renewing it, letting go of it (marking it
released) and taking over an expired one overwrite it only if it is still the version read
(``If-Match`` on its ETag). So two drivers never both hold it: of two writers of the same
version S3 refuses one (412).

The holder renews it every ``RENEW_SECONDS`` from a thread of its own. A lease is expired
when its holder's last renewal is over ``EXPIRY_SECONDS`` old and it has stayed unchanged
for ``OBSERVE_SECONDS`` by the taker's own clock (clocks of two machines differ); one whose
holder ran in this machine's process namespace and is gone, or one let go, is free at once.
A holder that cannot renew for ``GIVE_UP_SECONDS`` (a store that does not answer), or finds
its lease taken over, exits at once: another driver may run its streams now. A write whose
answer was lost is recognised by the token and kept.

The writes go through the driver's own JVM (Hadoop's S3A, whose conditional create and
overwrite send those headers): PyArrow's client, which the project's other files use, has
no conditional write. Every lease is taken by a driver with a Spark session (a stream,
a reprocess, a reset); reading who holds one (the stop request, the health check) needs
none.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_jobs.storage import LakePath

log = logging.getLogger(__name__)

RENEW_SECONDS = 10.0
EXPIRY_SECONDS = 60.0
# A holder that has not renewed for this long stops itself, before others may take over.
GIVE_UP_SECONDS = 40.0
# A lease expired by its holder's clock is taken over only once it has stayed unchanged
# this long by this machine's clock (clocks differ; renewals change it every 10 s).
OBSERVE_SECONDS = 30.0
# Hadoop's builder options for S3's conditional writes, and no HEAD or LIST before them.
CREATE_IF_ABSENT = "fs.option.create.conditional.overwrite"
REPLACE_IF_ETAG = "fs.option.create.conditional.overwrite.etag"
NO_PROBES = "fs.s3a.create.performance"
REFUSED = "org.apache.hadoop.fs.s3a.RemoteFileChangedException"  # S3's 412
# A taken-over holder's exit status: a driver that lost its lease must not write on.
LOST_LEASE_EXIT = 75


class Refused(Exception):
    """S3 refused a conditional write: the lease is not the version this driver read."""


def read(path: LakePath) -> dict[str, Any] | None:
    """The lease's record if one is there (a holder's, expired or not)."""
    try:
        return parse_record(path.read_text("utf-8"))
    except FileNotFoundError:
        return None


def parse_record(text: str) -> dict[str, Any]:
    """A lease's record (JSON), empty when the text is none (being written or let go)."""
    try:
        record = json.loads(text)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def driver_session() -> SparkSession | None:
    """This driver's Spark session, whose JVM makes the store's conditional writes (a
    thread of the driver's own may have no active one)."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() or SparkSession._instantiatedSession


def live(record: dict[str, Any] | None, now: datetime | None = None) -> bool:
    """Whether ``record`` names a holder that may still hold it: not let go, renewed within
    ``EXPIRY_SECONDS`` by its clock, and, if it ran in this machine's process namespace,
    still running. (A takeover also watches the lease unchanged for ``OBSERVE_SECONDS`` on
    this machine's own clock: the holder's clock may be behind.)"""
    if not record or record.get("released"):
        return False
    try:
        renewed = datetime.fromisoformat(str(record["renewed_at"]))
    except (KeyError, ValueError):
        return False
    if renewed.tzinfo is None:
        renewed = renewed.replace(tzinfo=UTC)
    if (now or datetime.now(UTC)) - renewed > timedelta(seconds=EXPIRY_SECONDS):
        return False
    return not _gone_here(record)


def _pid_namespace() -> int | None:
    """This process's pid namespace: containers on one host name see their own pids."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def create_exclusively(spark: SparkSession, path: LakePath, record: dict[str, Any]) -> bool:
    """Write ``record`` at ``path`` unless an object is there: whether this write made it.
    S3 decides atomically (``If-None-Match``), so of several writers exactly one does: what
    a rename does on local disk, which the store cannot do atomically."""
    try:
        _Store(spark, path).write(record, None)
    except Refused:
        return False
    return True


class _Store:
    """Conditional writes of one object, through the JVM's Hadoop file system."""

    def __init__(self, spark: SparkSession, path: LakePath) -> None:
        jvm = spark._jvm
        self._path = jvm.org.apache.hadoop.fs.Path(str(path))
        self._fs = self._path.getFileSystem(spark._jsc.hadoopConfiguration())

    def etag(self) -> str:
        return self._fs.getFileStatus(self._path).getEtag()

    def write(self, record: dict[str, Any], etag: str | None) -> str:
        """``record`` written if the object is absent (``etag`` None) or still at ``etag``;
        its new ETag. ``Refused`` otherwise."""
        from py4j.protocol import Py4JJavaError

        builder = self._fs.createFile(self._path).opt(NO_PROBES, True)
        if etag is None:
            builder = builder.overwrite(False).must(CREATE_IF_ABSENT, True)
        else:
            builder = builder.overwrite(True).must(REPLACE_IF_ETAG, etag)
        try:
            stream = builder.build()
            try:
                stream.write(bytearray(json.dumps(record).encode("utf-8")))
            finally:
                stream.close()  # S3 checks the condition when the object is completed
        except Py4JJavaError as error:
            if error.java_exception.getClass().getName() == REFUSED:
                raise Refused(str(self._path)) from None
            raise
        return self.etag()


@contextmanager
def held(spark: SparkSession, path: LakePath, purpose: str,
         busy: type[Exception], taken: Callable[[str], Exception], layer: str
         ) -> Iterator[None]:
    """Hold the lease at ``path`` for as long as the block runs. A live holder raises
    ``taken(its record)`` (a stream driver: the caller fails) or ``busy`` (a reprocess: the
    caller waits and tries again)."""
    holding = _Holding(_Store(spark, path), path, {
        "pid": os.getpid(), "host": socket.gethostname(), "pidns": _pid_namespace(),
        "since": datetime.now(UTC).isoformat(), "purpose": purpose,
        # Whose write it is, when S3's answer to it was lost.
        "token": uuid.uuid4().hex})
    holding.take(busy, taken)
    stop = threading.Event()
    renewer = threading.Thread(name=f"lease-{layer}", daemon=True, target=holding.renew,
                               args=(stop,))
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join()
        holding.let_go()


class _Holding:
    """This driver's side of one lease: the record it writes and the ETag it last wrote."""

    def __init__(self, store: _Store, path: LakePath, mine: dict[str, Any]) -> None:
        self.store, self.path, self.mine = store, path, mine
        self.etag = ""

    def _record(self, **extra: Any) -> dict[str, Any]:
        return self.mine | {"renewed_at": datetime.now(UTC).isoformat()} | extra

    def _mine(self, record: dict[str, Any] | None) -> bool:
        """Whether ``record`` is this holder's own write (one whose answer was lost)."""
        return bool(record) and record.get("token") == self.mine["token"]

    def take(self, busy: type[Exception], taken: Callable[[str], Exception]) -> None:
        while True:
            try:
                self.etag = self.store.write(self._record(), None)  # free: create it
                return
            except Refused:
                pass
            try:
                # The ETag before the record: a newer record than this version refuses the
                # takeover below.
                etag = self.store.etag()
                held_by = read(self.path)
            except Exception:  # noqa: BLE001 - let go of meanwhile, or no answer: again
                time.sleep(1)
                continue
            if self._mine(held_by):  # this driver's create landed, its answer did not
                self.etag = etag
                return
            if live(held_by):
                text = json.dumps(held_by)
                if held_by.get("purpose") == "reprocess":
                    raise busy(text)
                raise taken(text)
            if not (held_by is None or held_by.get("released") or _gone_here(held_by)) and (
                    not self._unchanged_for(etag, OBSERVE_SECONDS)):
                continue  # renewed after all: look again
            try:
                self.etag = self.store.write(self._record(), etag)  # expired: take it over
                return
            except Refused:
                continue  # another driver took it over first, or its holder renewed it

    def _unchanged_for(self, etag: str, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(min(1.0, seconds))
            try:
                if self.store.etag() != etag:
                    return False
            except Exception:  # noqa: BLE001 - gone or no answer: look again from the top
                return False
        return True

    def renew(self, stop: threading.Event) -> None:
        renewed = time.monotonic()
        while not stop.wait(RENEW_SECONDS):
            try:
                self.etag = self.store.write(self._record(), self.etag)
                renewed = time.monotonic()
            except Refused:
                current = self._current()
                if not self._mine(current):
                    self._stop_driver(f"taken over by another driver ({json.dumps(current)})")
                self.etag, renewed = self.store.etag(), time.monotonic()  # ours: answer lost
            except Exception as error:  # noqa: BLE001 - a store that did not answer: again
                log.warning("could not renew the lease %s: %s", self.path, error)
            if time.monotonic() - renewed > GIVE_UP_SECONDS:
                self._stop_driver(f"not renewed for {GIVE_UP_SECONDS:.0f} s, and another "
                                  f"driver may take it over {EXPIRY_SECONDS:.0f} s after")

    def _current(self) -> dict[str, Any] | None:
        try:
            return read(self.path)
        except Exception:  # noqa: BLE001 - unknown: not known to be ours
            return None

    def _stop_driver(self, why: str) -> None:
        log.critical("the lease %s was lost (%s): this driver stops at once, so that two "
                     "never write one checkpoint", self.path, why)
        os._exit(LOST_LEASE_EXIT)

    def let_go(self) -> None:
        """Mark the lease released, if it is still this holder's version: a delete would
        first have to check, and could remove a lease taken over meanwhile."""
        try:
            self.store.write(self._record(released=True), self.etag)
        except Refused:
            pass  # taken over meanwhile (this driver was too slow to renew): not ours
        except Exception as error:  # noqa: BLE001 - at best effort: it expires regardless
            log.warning("could not let go of the lease %s: %s", self.path, error)


def _gone_here(record: dict[str, Any]) -> bool:
    """Its holder ran in this machine's process namespace and is no longer running."""
    if record.get("host") != socket.gethostname() or record.get("pidns") != _pid_namespace():
        return False
    try:
        os.kill(int(record["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, KeyError, ValueError):
        pass
    return False
