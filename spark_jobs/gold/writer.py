"""One writer of gold at a time: the driver running the gold streams, or else a reprocess;
and in that driver, a rebuild never beside a gold micro-batch.

A gold rebuild replaces a range of every gold table (``reprocess.rebuild_gold``) with what
silver held at one version V. Beside a live gold stream in another process, two races
are invisible to Delta's conflict checks, because each transaction starts from a snapshot
that already holds the other's commit:

- a stream batch that commits between the rebuild's read of silver and its replace is
  overwritten, and its events after V are counted nowhere (no ledger entry either);
- a batch that read ``ops.gold_rebuilds`` before the rebuild recorded V, and MERGEs after
  the replace, adds again what the rebuild counted.

So they never run side by side. In the driver holding the gold lease, gold micro-batches
hold ``LOCK`` shared (each gold stream writes its own table, so their batches overlap) and
a rebuild holds it alone. A reprocess in another process hands its
rebuild to that driver: a request file under ``<root>/control/gold-rebuilds/``, claimed by
the driver's rebuild thread with an atomic rename (on the object store, with a marker only
one side can create: S3's conditional write), run between gold batches, answered with
a result file the reprocess waits for. With no driver holding the lease, the reprocess
takes it for the rebuild itself, and a driver starting meanwhile waits
(``ops.leases``). A dry run only reads, and runs where it is asked.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from spark_jobs import storage
from spark_jobs.config import Settings
from spark_jobs.ops import store_leases
from spark_jobs.ops.leases import REPROCESS, LeaseHeld, driver, leases

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from pyspark.sql import SparkSession

    from spark_jobs.dates import DateRange
    from spark_jobs.range_rebuild import Change
    from spark_jobs.storage import LakePath

log = logging.getLogger(__name__)

LAYER = "gold"


class BatchesOrRebuild:
    """Held by every write to gold in this process: by any number of gold micro-batches at
    once (``batch``), or by one rebuild alone (``rebuild``), which waits for the batches
    under way and holds back those that start meanwhile, so a steady stream of batches
    cannot starve it. A thread may take the side it holds again; a rebuild may run a batch
    inside it, but a batch may not start a rebuild (it would wait for itself)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._batches = 0
        self._rebuilds_waiting = 0
        self._rebuilder: int | None = None  # the thread holding it for a rebuild
        self._rebuild_depth = 0
        self._held_by_thread = threading.local()  # this thread's batch depth

    @contextmanager
    def batch(self) -> Iterator[None]:
        depth = getattr(self._held_by_thread, "batches", 0)
        if depth or self._rebuilder == threading.get_ident():
            self._held_by_thread.batches = depth + 1
            try:
                yield  # inside this thread's own batch or rebuild
            finally:
                self._held_by_thread.batches = depth
            return
        with self._changed:
            self._changed.wait_for(lambda: self._rebuilder is None
                                   and not self._rebuilds_waiting)
            self._batches += 1
        self._held_by_thread.batches = 1
        try:
            yield
        finally:
            self._held_by_thread.batches = 0
            with self._changed:
                self._batches -= 1
                self._changed.notify_all()

    @contextmanager
    def rebuild(self) -> Iterator[None]:
        if getattr(self._held_by_thread, "batches", 0):
            raise RuntimeError("a gold rebuild cannot start inside a gold micro-batch")
        me = threading.get_ident()
        with self._changed:
            if self._rebuilder != me:
                self._rebuilds_waiting += 1
                try:
                    self._changed.wait_for(lambda: self._rebuilder is None
                                           and not self._batches)
                finally:
                    self._rebuilds_waiting -= 1
                    self._changed.notify_all()  # batches held back for it, if it gave up
                self._rebuilder = me
            self._rebuild_depth += 1
        try:
            yield
        finally:
            with self._changed:
                self._rebuild_depth -= 1
                if not self._rebuild_depth:
                    self._rebuilder = None
                    self._changed.notify_all()


LOCK = BatchesOrRebuild()
POLL_SECONDS = 1.0
_last_rebuild: dict[str, str | None] = {}  # days, since, ended (None while it runs)
# A rebuild beside busy streams on 2 cores takes minutes; this only bounds a lost answer.
ANSWER_PATIENCE_SECONDS = 3 * 3600.0


def requests_dir(settings: Settings) -> LakePath:
    return settings.root / "control" / "gold-rebuilds"


def rebuild(spark: Callable[[], SparkSession], settings: Settings, days: DateRange,
            dry_run: bool) -> list[Change]:
    """Rebuild gold for ``days`` as the one writer of gold: here under the gold lease, or
    inside the driver that holds it. ``spark`` gives this process's session, started only
    when the rebuild runs here."""
    from spark_jobs.reprocess import rebuild_gold

    if dry_run:
        return rebuild_gold(spark(), settings, days, dry_run=True)
    if storage.is_object_store(settings.root):
        spark()  # a lease on the store is taken through the session's JVM
    while True:
        try:
            with leases(settings, [LAYER], purpose=REPROCESS), LOCK.rebuild():
                return rebuild_gold(spark(), settings, days, dry_run=False)
        except LeaseHeld:
            changes = _hand_over(settings, days)
            if changes is not None:
                return changes
            # The driver exited before answering: the lease is free, go round again.


def _hand_over(settings: Settings, days: DateRange) -> list[Change] | None:
    """Ask the driver holding the gold lease to rebuild ``days``; its changes, or None when
    it exited without answering (a rebuild is idempotent, so running it again is safe)."""
    folder = requests_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    name = uuid.uuid4().hex
    request = folder / f"{name}.request"
    _write_atomically(request, {"from": days.first.isoformat(), "to": days.last.isoformat()})
    log.info("gold rebuild of %s handed to the gold stream driver (%s); a continuous driver "
             "runs it between two gold batches, an --available-now one when it exits", days,
             driver(settings, LAYER))
    try:
        return _await_answer(settings, days, folder, name)
    finally:  # answered, given up or interrupted: nothing of this request stays behind
        for leftover in (request, folder / f"{name}.withdrawn", folder / f"{name}.decided"):
            leftover.unlink(missing_ok=True)


def _await_answer(settings: Settings, days: DateRange, folder: LakePath, name: str
                  ) -> list[Change] | None:
    from spark_jobs.range_rebuild import Change
    from spark_jobs.reprocess import ReprocessError

    claimed, answer = folder / f"{name}.claimed", folder / f"{name}.result"
    deadline = time.monotonic() + ANSWER_PATIENCE_SECONDS
    while time.monotonic() < deadline:
        if answer.exists():
            result = json.loads(answer.read_text("utf-8"))
            answer.unlink()
            if "error" in result:
                raise ReprocessError(f"gold rebuild of {days} failed in the stream driver: "
                                     f"{result['error']}")
            return [Change(**change) for change in result["changes"]]
        if driver(settings, LAYER) is None:
            try:  # withdraw the request, unless the driver claims it at this very moment
                _decide(folder, name, "withdrawn")
            except FileNotFoundError:
                if not answer.exists():  # claimed, then the driver died: run it again
                    claimed.unlink(missing_ok=True)
                    return None
                continue
            return None
        time.sleep(POLL_SECONDS)
    raise ReprocessError(f"the gold stream driver did not answer the rebuild of {days} "
                         f"within {ANSWER_PATIENCE_SECONDS / 3600:.0f} h")


def serve_requests(spark: SparkSession, settings: Settings,
                   stop: threading.Event | None = None) -> int:
    """Run the pending rebuild requests (in the driver holding the gold lease) until
    ``stop`` is set; how many were answered."""
    served = 0
    for request in sorted(requests_dir(settings).glob("*.request")):
        if stop is not None and stop.is_set():
            break
        claimed = request.with_suffix(".claimed")
        try:
            _decide(request.parent, request.stem, "claimed")
        except FileNotFoundError:  # withdrawn meanwhile
            continue
        try:
            result = _run_request(spark, settings, claimed)
        except Exception as error:  # the reprocess reports it; the streams carry on
            log.exception("gold rebuild request %s failed", request.name)
            first_line = next(iter(str(error).strip().splitlines()), "")
            result = {"error": f"{type(error).__name__}: {first_line}"}
        _write_atomically(request.with_suffix(".result"), result)
        claimed.unlink(missing_ok=True)
        served += 1
    return served


def _run_request(spark: SparkSession, settings: Settings, claimed: LakePath
                 ) -> dict[str, object]:
    from spark_jobs.dates import DateRange
    from spark_jobs.reprocess import rebuild_gold

    asked = json.loads(claimed.read_text("utf-8"))
    days = DateRange.parse(asked["from"], asked["to"])
    log.info("rebuilding gold for %s (asked by a reprocess)", days)
    # Noted before the lock is taken: from then on the gold batches wait for it.
    _last_rebuild.update(days=str(days), since=_now(), ended=None)
    try:
        with LOCK.rebuild():
            changes = rebuild_gold(spark, settings, days, dry_run=False)
    finally:
        _last_rebuild["ended"] = _now()
    return {"changes": [change.as_json() for change in changes]}


def _now() -> str:
    return datetime.now(UTC).isoformat()


def last_rebuild() -> dict[str, str | None] | None:
    """The latest rebuild this process ran for a reprocess (``days``, ``since``, and
    ``ended``, None while it runs): the gold batches waited for it."""
    return dict(_last_rebuild) or None


def serve_in_background(spark: SparkSession, settings: Settings, stop: threading.Event
                        ) -> threading.Thread:
    """A thread serving rebuild requests until ``stop`` is set, so the driver's main loop
    (progress, heartbeat) keeps its pace during a rebuild. A request a killed driver had
    claimed is served again first: its reprocess may still be waiting."""
    for orphan in requests_dir(settings).glob("*.claimed"):
        storage.replace(orphan, orphan.with_suffix(".request"))
        # On the store, the claim's marker goes too, so that the request can be claimed.
        (orphan.parent / f"{orphan.stem}.decided").unlink(missing_ok=True)

    def loop() -> None:
        while not stop.wait(POLL_SECONDS):
            try:
                serve_requests(spark, settings, stop)
            except Exception:  # a broken request file must not end the service
                log.exception("serving gold rebuild requests failed; trying again")

    thread = threading.Thread(target=loop, name="gold-rebuilds", daemon=True)
    thread.start()
    return thread


def _decide(folder: LakePath, name: str, outcome: str) -> None:
    """The request ``name`` becomes ``<name>.<outcome>`` (claimed by the driver, or
    withdrawn by its reprocess), or ``FileNotFoundError`` if the other side decided first.
    On local disk a rename, which one of two renames of a file wins; on the object store,
    which cannot rename atomically, a marker only one writer can create (S3's conditional
    write), then the request's copy under its new name."""
    request, decided = folder / f"{name}.request", folder / f"{name}.{outcome}"
    if not storage.is_object_store(folder):
        request.rename(decided)
        return
    spark = store_leases.driver_session()
    if spark is None or not store_leases.create_exclusively(
            spark, folder / f"{name}.decided", {"outcome": outcome}):
        raise FileNotFoundError(f"{request}: decided by the other side")
    decided.write_bytes(request.read_bytes())
    request.unlink(missing_ok=True)


def _write_atomically(path: LakePath, content: dict[str, object]) -> None:
    storage.write_atomically(path.parent, path.name, json.dumps(content).encode())
