"""Reading a Delta table without Spark (delta-rs), for the API server, the CLI and tests.

Reads go through delta-rs's own query engine (``QueryBuilder``, DataFusion in Rust), not
``DeltaTable.to_pyarrow_table``: the latter scans through PyArrow's C++ thread pool, and a
short-lived process that used it dies with SIGABRT ("terminate called without an active
exception") at interpreter exit in about a third of runs on 2 cores. The query engine's
reads exit cleanly (``tests/test_delta_reader.py`` runs both in subprocesses).

A table may be on local disk or on the object store (``s3a://``): its log is read through
``storage.lake_path``, the table through delta-rs given the store (``tests/test_object_store.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs.storage import delta_rs_options, lake_path

if TYPE_CHECKING:  # PyArrow is imported on first read: plugin loading stays light
    import pyarrow as pa


def is_delta_table(path: str | Path) -> bool:
    return (lake_path(path) / "_delta_log").is_dir()


def read_arrow(path: str | Path, columns: Sequence[str] | None = None) -> pa.Table:
    """The table's current snapshot as a PyArrow table (all columns unless named)."""
    selected = ", ".join(_quoted(name) for name in columns) if columns else "*"
    return read_arrow_sql(path, f"SELECT {selected} FROM snapshot")


def column_names(path: str | Path) -> list[str]:
    """The table's columns, in its current schema."""
    return [column.name for column in _table(path).schema().fields]


def count_rows(path: str | Path) -> int:
    """How many rows the table's current snapshot holds."""
    return int(read_arrow_sql(path, "SELECT count(*) AS n FROM snapshot").column("n")[0].as_py())


def read_arrow_sql(path: str | Path, query: str) -> pa.Table:
    """``query`` over the table's current snapshot, registered as ``snapshot``."""
    import pyarrow as pa
    from deltalake import QueryBuilder

    reader = QueryBuilder().register("snapshot", _table(path)).execute(query)
    return pa.table(reader.read_all())


def read_rows(path: str | Path, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """The table's rows as plain Python values (ints stay ints, NULL is None); none if absent."""
    if not is_delta_table(path):
        return []
    return read_arrow(path, columns).to_pylist()


def applied_batch(path: str | Path, app_id: str) -> tuple[int, int | None]:
    """The table's latest version, and the last batch of ``app_id`` (a streaming query's
    id) applied up to it: the transaction version its idempotent writes recorded."""
    table = _table(path)
    return table.version(), table.transaction_version(app_id)


def transaction_versions(path: str | Path, app_ids: Sequence[str]) -> list[int | None]:
    """The last transaction version each of ``app_ids`` recorded in the table's log."""
    table = _table(path)
    return [table.transaction_version(app_id) for app_id in app_ids]


def user_metadata(path: str | Path, version: int | None = None,
                  limit: int | None = None) -> list[str | None]:
    """The user metadata of the table's commits, newest first: those up to ``version``
    (default: the latest), the newest ``limit`` of them (default: every one in the log)."""
    table = _table(path, version)
    return [commit.get("userMetadata") for commit in table.history(limit)]


def commit_entry(path: str | Path, version: int) -> Path:
    """The log entry (a file, local or on the object store) of the table's commit
    ``version``."""
    return lake_path(path) / "_delta_log" / f"{version:020d}.json"


def commit_actions(path: str | Path, version: int) -> list[dict[str, Any]]:
    """The actions of the table's commit ``version``, read from its log entry alone, without
    loading the table."""
    with commit_entry(path, version).open(encoding="utf-8") as entry:
        return [json.loads(line) for line in entry]


def commit_info(path: str | Path, version: int) -> dict[str, Any]:
    """The ``commitInfo`` of the table's commit ``version`` (operation, metrics, user
    metadata)."""
    return info_among(commit_actions(path, version))


def info_among(actions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``commitInfo`` among a commit's ``actions`` (empty if it has none)."""
    return next((action["commitInfo"] for action in actions if "commitInfo" in action), {})


def file_statistics(path: str | Path, timestamp_columns: Sequence[str]
                    ) -> list[dict[str, int | None]]:
    """Per data file of the table's current snapshot, from the statistics in its log: its
    row count (``num_records``) and each timestamp column's ``min.<column>`` and
    ``max.<column>`` in microseconds since the epoch (None where a file has none)."""
    import pyarrow as pa

    actions = pa.table(_table(path).get_add_actions(flatten=True))
    columns = {"num_records": actions.column("num_records").to_pylist()}
    for name in (f"{bound}.{column}" for column in timestamp_columns for bound in ("min", "max")):
        columns[name] = actions.column(name).cast(pa.int64()).to_pylist()
    return [dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)]


def latest_version(path: str | Path) -> int:
    """The table's latest version, found in its log without loading the table: from its
    last checkpoint, the commits after it; -1 before its first commit."""
    log = lake_path(path) / "_delta_log"
    try:
        version = int(json.loads((log / "_last_checkpoint").read_text("utf-8"))["version"])
    except FileNotFoundError:
        version = -1  # no checkpoint yet: every commit since the first is still there
    except (ValueError, KeyError):  # being rewritten: the names in the log say
        version = max((int(entry.name[:-5]) for entry in log.glob("*.json")
                       if COMMIT_NAME.fullmatch(entry.name)), default=-1)
    while commit_entry(path, version + 1).exists():
        version += 1
    return version


COMMIT_NAME = re.compile(r"\d{20}\.json")  # not a compacted range, not a staged commit


def _table(path: str | Path, version: int | None = None) -> Any:
    """delta-rs's view of the table (at ``version``, default the latest), on its store."""
    from deltalake import DeltaTable

    return DeltaTable(str(path), version=version, storage_options=delta_rs_options() or None)


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
