"""The expectation suites of ``expectations/``: one Great Expectations suite per table.

Each file is a suite as Great Expectations serialises it, plus two entries in its
``meta``: the ``table`` it validates and the ``date_column`` (a SQL expression) that
selects a date range of it. The table's grain comes from the registry
(``spark_jobs.registry``), where the table is declared, and is added to the loaded suite's
``meta`` for Data Docs. Every expectation
carries a ``severity``: ``critical`` fails the run, ``warning`` is reported only. An
expectation whose ``meta.scope`` is ``table`` judges the whole table (freshness) and is
left out when a date range is validated.

Suites refer to the run's settings as ``$name`` (``$future_tolerance``,
``$window_duration``...) and to the range as ``$first_date`` and ``$last_date``, so a
threshold lives once, in the configuration.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import date
from string import Template
from typing import Any

from spark_jobs import registry
from spark_jobs.config import ConfigError, Settings

CRITICAL = "critical"
WARNING = "warning"
# The whole table, when no range is given.
ALL_DATES = (date(1970, 1, 1), date(9999, 12, 31))
# A query that selects every column of a relation: `SELECT *`, `t.*`, `{batch}.*`.
_EVERY_COLUMN = re.compile(r"(?:\bSELECT\s+(?:DISTINCT\s+)?|,\s*|[\w}`]\.)\*", re.IGNORECASE)


@dataclass(frozen=True)
class Suite:
    table: str
    grain: str
    date_column: str
    document: dict[str, Any]  # the suite, placeholders filled in

    @property
    def expectations(self) -> list[dict[str, Any]]:
        return self.document["expectations"]

    def columns_read(self, columns: list[str]) -> list[str]:
        """The ``columns`` of the table that the expectations may read: those they name,
        or all of them when a query selects ``*``. A suite's snapshot caches only these, so
        a wide column no expectation reads (bronze's raw text) is neither read nor cached."""
        kwargs = json.dumps([e.get("kwargs", {}) for e in self.expectations])
        if _EVERY_COLUMN.search(kwargs):
            return columns
        return [c for c in columns
                if re.search(rf"(?<![\w$]){re.escape(c)}(?![\w$])", kwargs, re.IGNORECASE)]


def available(settings: Settings) -> list[str]:
    """The tables the registry validates, in pipeline order (bronze, silver, gold). Each
    suite is read from ``expectations_dir`` when its table is validated (``load``: a
    missing one is refused by name then)."""
    return [name for name, table in registry.TABLES.items() if table.suite]


def load(settings: Settings, table: str, first: date | None = None, last: date | None = None,
         values: dict[str, str] | None = None) -> Suite:
    """The suite of ``table`` for the dates ``first`` to ``last`` (the whole table if None).

    ``values`` fills placeholders that depend on the run (``$silver_seen_by_gold``,
    ``$in_gold_cut``, ``$gold_latest_event_time``)."""
    path = settings.expectations_dir / f"{table}.json"
    if not path.exists():
        raise ConfigError(f"no expectation suite for {table}: {path} does not exist")
    ranged = first is not None
    first, last = (first, last) if ranged else ALL_DATES
    fill = {key: str(value) for key, value in vars(settings).items()}
    fill |= {"first_date": str(first), "last_date": str(last)} | (values or {})
    try:
        document = json.loads(Template(path.read_text("utf-8")).substitute(fill))
    except KeyError as unknown:
        raise ConfigError(f"{path} uses ${unknown.args[0]}, which is neither a setting nor "
                          f"a value of the run") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is not valid JSON: {error}") from None
    if ranged:
        document["expectations"] = [e for e in document["expectations"]
                                    if e.get("meta", {}).get("scope") != "table"]
    if table not in registry.TABLES:
        raise ConfigError(f"{path} is a suite for {table}, which is not a table of the "
                          f"lakehouse ({', '.join(registry.TABLES)})")
    meta = document.setdefault("meta", {})
    meta["grain"] = registry.TABLES[table].grain
    return Suite(table=table, grain=meta["grain"], date_column=meta["date_column"],
                 document=document)
