"""The checkpoint lease on an object store (``s3a://``), where no OS lock reaches.

A lease is an object ``<checkpoints>/<layer>.lease`` holding who holds it (pid, host, since,
purpose) and when it was last renewed. Every change is a conditional write, which S3
checks atomically: taking a free lease creates the object only if it is absent
(``If-None-Match``), renewing and taking over an expired one overwrite it only if it is still
the version read (``If-Match`` on its ETag). So two drivers never both hold it: of two
writers of the same version S3 refuses one (412). The holder renews it every
``RENEW_SECONDS`` from a thread of its own; a lease not renewed for ``EXPIRY_SECONDS`` (a
driver killed, a machine gone) is free to take over, and one whose holder ran on this
machine and is gone is free at once. A holder that finds its lease taken over (it could not
renew it in time) exits at once: another driver runs its streams now. Letting go deletes
the object.

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
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_jobs.storage import LakePath

log = logging.getLogger(__name__)

RENEW_SECONDS = 10.0
EXPIRY_SECONDS = 60.0
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
        text = path.read_text("utf-8")
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def live(record: dict[str, Any] | None, now: datetime | None = None) -> bool:
    """Whether ``record`` names a holder that still holds it: renewed within
    ``EXPIRY_SECONDS``, and, if it ran on this machine, still running."""
    if not record:
        return False
    try:
        renewed = datetime.fromisoformat(str(record["renewed_at"]))
    except (KeyError, ValueError):
        return False
    if (now or datetime.now(UTC)) - renewed > timedelta(seconds=EXPIRY_SECONDS):
        return False
    if record.get("host") == socket.gethostname():
        try:
            os.kill(int(record["pid"]), 0)
        except ProcessLookupError:
            return False
        except (PermissionError, KeyError, ValueError):
            pass
    return True


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

    def delete_if(self, etag: str) -> None:
        """Delete the object if it is still at ``etag`` (not taken over meanwhile)."""
        if self.etag() == etag:
            self._fs.delete(self._path, False)


@contextmanager
def held(spark: SparkSession, path: LakePath, purpose: str,
         busy: type[Exception], taken: type[Exception], layer: str) -> Iterator[None]:
    """Hold the lease at ``path`` for as long as the block runs. A live holder raises
    ``taken`` (a stream driver: the caller fails) or ``busy`` (a reprocess: the caller
    waits and tries again)."""
    holding = _Holding(_Store(spark, path), path, {
        "pid": os.getpid(), "host": socket.gethostname(),
        "since": datetime.now(UTC).isoformat(), "purpose": purpose})
    holding.take(busy, taken, layer)
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

    def _record(self) -> dict[str, Any]:
        return self.mine | {"renewed_at": datetime.now(UTC).isoformat()}

    def take(self, busy: type[Exception], taken: type[Exception], layer: str) -> None:
        while True:
            try:
                self.etag = self.store.write(self._record(), None)  # free: create it
                return
            except Refused:
                pass
            try:
                # Before the record: a newer record than this version refuses the takeover.
                etag = self.store.etag()
            except Exception:  # noqa: BLE001 - let go of meanwhile: take it again
                continue
            held_by = read(self.path)
            if live(held_by):
                text = json.dumps(held_by)
                if held_by.get("purpose") == "reprocess":
                    raise busy(text)
                raise taken(f"the {layer} stream is already running under another driver "
                            f"({text}); stop it first (lakehouse stop) or wait for it to "
                            f"exit")
            try:
                self.etag = self.store.write(self._record(), etag)  # expired: take it over
                return
            except Refused:
                continue  # another driver took it over first, or its holder renewed it

    def renew(self, stop: threading.Event) -> None:
        while not stop.wait(RENEW_SECONDS):
            try:
                self.etag = self.store.write(self._record(), self.etag)
            except Refused:
                log.critical("the lease %s was taken over by another driver (%s): this "
                             "driver stops at once", self.path, json.dumps(read(self.path)))
                os._exit(LOST_LEASE_EXIT)
            except Exception as error:  # noqa: BLE001 - a store that did not answer: again
                log.warning("could not renew the lease %s (it expires %.0f s after the last "
                            "renewal): %s", self.path, EXPIRY_SECONDS, error)

    def let_go(self) -> None:
        try:
            self.store.delete_if(self.etag)
        except Exception as error:  # noqa: BLE001 - at best effort: it expires regardless
            log.warning("could not let go of the lease %s: %s", self.path, error)
