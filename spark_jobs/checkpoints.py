"""What a stream's checkpoint cannot carry across a restart, and the way out.

A checkpoint resumes a query where it stopped. Most changes between two runs are safe to
resume under: an added filter, a new rate limit or trigger, a fixed validation rule (the
records judged before it are reprocessed, see *Reprocessing*). Some are not, because the
state or the rows already written were built under the old value: a stateful query's key
(a window's length for ``gold.campaign_stats``), a join's bound (``gold.ad_attribution``'s
``attribution_max_gap``). Resumed, the table would mix rows of both meanings and nothing
would say which.

So a stream module names such settings in ``STATE_SETTINGS``; its checkpoint records their
values when it is first used, and a start under other values fails at once with a clear
error that names the runbook: ``lakehouse reset LAYER`` (``spark_jobs.reset``), which
rebuilds the layer under the new values. A change in the code itself (a different
aggregation key) is found by Spark's own state schema check when the first batch loads the
state; the stream runner adds the same runbook to that error. A checkpoint from before this
record adopts the values of its first start after it.

A kill can also leave a checkpoint Spark will not start on at all: Spark writes each entry of
its offset and commit logs under a temporary name (``.0.<uuid>.tmp``, beside Hadoop's
``..0.<uuid>.tmp.crc`` on local disk) and renames it when whole. Killed between the two at a
query's first batch, the folder holds nothing but the temporary file, and Spark 4 refuses the
restart of any query, stateful or not (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``: the
offsets of a query at batch 0 should be empty). Such a file is never read (Spark reads only
entries named by their batch number), so every start removes them first
(``remove_interrupted_writes``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType

from spark_jobs import storage
from spark_jobs.config import ConfigError, Settings, interval_seconds
from spark_jobs.storage import lake_path

RECORD = "lakehouse-state-settings.json"

# Spark's logs of a stream's batches, and the name it writes an entry under until it is whole
# (CheckpointFileManager's rename-based stream; Hadoop's checksum adds the ``.crc`` twin).
BATCH_LOGS = ("offsets", "commits")
INTERRUPTED_WRITE = re.compile(
    r"^\.\.?\d+\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.tmp(\.crc)?$")

# Spark's errors for state that the query as now written cannot read (Spark 4 error
# classes, and the older wording for an operator that moved).
INCOMPATIBLE_STATE = ("STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
                      "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
                      "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION",
                      "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
                      "STATE_STORE_KEY_ROW_FORMAT_VALIDATION_FAILURE",
                      "STATE_STORE_VALUE_ROW_FORMAT_VALIDATION_FAILURE",
                      "not compatible with the state")


class CheckpointIncompatible(ConfigError):
    """A stream's checkpoint was built under settings the configuration no longer has."""


def runbook(layer: str) -> str:
    return (f"run 'lakehouse reset {layer}' (with the streams of that layer stopped) to "
            f"rebuild {layer} under the new logic, or restore the old setting "
            f"(README: Changing a stream across restarts)")


def state_settings(settings: Settings, stream: ModuleType) -> dict[str, str]:
    """The values of the settings the stream's state depends on (``STATE_SETTINGS``)."""
    return {name: str(getattr(settings, name)) for name in getattr(stream, "STATE_SETTINGS", ())}


def check_compatible(settings: Settings, layer: str, stream: ModuleType, *,
                     record: bool = True) -> None:
    """Refuse to start ``stream`` on a checkpoint built under other ``STATE_SETTINGS``;
    record them on its first start (unless ``record`` is off: a look before the lease)."""
    current = state_settings(settings, stream)
    if not current:
        return
    checkpoint = lake_path(settings.checkpoint(stream.QUERY_NAME))
    recorded = read_record(checkpoint, RECORD)
    if recorded:
        changed = [f"{name} = {recorded[name]!r} (now {value!r})"
                   for name, value in current.items()
                   if name in recorded and not _same(recorded[name], value)]
        if changed:
            raise CheckpointIncompatible(
                f"{stream.QUERY_NAME}: its checkpoint ({checkpoint}) holds state built with "
                f"{'; '.join(changed)}; resuming would mix rows of both in "
                f"{layer}. To change it, {runbook(layer)}")
        if current.keys() <= recorded.keys():
            return
    if record:
        write_record(checkpoint, RECORD, {**recorded, **current})


def remove_interrupted_writes(settings: Settings, stream: ModuleType) -> list[str]:
    """Remove the log entries a kill left half-written in ``stream``'s checkpoint (the
    caller holds its lease, so no query writes there); return their names."""
    checkpoint = lake_path(settings.checkpoint(stream.QUERY_NAME))
    removed = []
    for log_name in BATCH_LOGS:
        folder = checkpoint / log_name
        if not folder.exists():
            continue
        for entry in folder.iterdir():
            if INTERRUPTED_WRITE.match(entry.name):
                entry.unlink()
                removed.append(f"{log_name}/{entry.name}")
    return removed


def read_record(checkpoint: Path, name: str) -> dict[str, str]:
    """A record the project keeps beside Spark's files in a stream's checkpoint; empty when
    there is none."""
    record = checkpoint / name
    return json.loads(record.read_text("utf-8")) if record.exists() else {}


def write_record(checkpoint: Path, name: str, values: dict[str, str]) -> None:
    """Write such a record whole or not at all (a kill midway leaves the one before)."""
    checkpoint.mkdir(parents=True, exist_ok=True)
    staged = (checkpoint / name).with_suffix(".tmp")
    staged.write_text(json.dumps(values, indent=2) + "\n", "utf-8")
    storage.replace(staged, checkpoint / name)


INCOMPATIBLE_HINT = "The stream's logic changed in a way its state cannot follow: "


def _same(recorded: str, current: str) -> bool:
    """Equal values, however spelled: '1 hour' is '60 minutes'."""
    try:
        return interval_seconds(recorded) == interval_seconds(current)
    except ConfigError:
        return recorded == current


def incompatible_state(error: str) -> bool:
    """Whether Spark refused a query's state as not what the query now keeps."""
    return any(marker in error for marker in INCOMPATIBLE_STATE)


def reset_marker(settings: Settings, layer: str) -> Path:
    """Present while ``lakehouse reset`` rebuilds ``layer``, and after it if it was
    interrupted; it names the reset to run again (a reset of silver marks gold too)."""
    return settings.root / "control" / f"reset-{layer}"


def mark_reset(settings: Settings, layer: str, reset: str, started: str) -> None:
    marker = reset_marker(settings, layer)
    if not marker.exists():  # a reset run again keeps the first one's record
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"reset": reset, "started": started}) + "\n", "utf-8")


def refuse_if_reset_unfinished(settings: Settings, layers: list[str] | tuple[str, ...]
                               ) -> None:
    """A layer under reset, or whose reset did not finish, has emptied tables or lost
    checkpoints: neither its streams nor a reprocess may work on it."""
    for layer in layers:
        marker = reset_marker(settings, layer)
        if marker.exists():
            record = json.loads(marker.read_text("utf-8"))
            raise CheckpointIncompatible(
                f"{layer} is being reset ('lakehouse reset {record['reset']}', started "
                f"{record['started']}), or that reset was interrupted: wait for it, or run "
                f"'lakehouse reset {record['reset']}' again")
