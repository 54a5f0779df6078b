"""The registry's tables with their schemas: each table's ``TableSpec``, from its own module.

``spark_jobs.registry`` lists the tables (plain Python, for the API server and DAG files);
this is the same list for Spark jobs, which need the schemas too.
"""

from __future__ import annotations

import importlib

from spark_jobs import registry
from spark_jobs.tables import TableSpec


def _specs(tables: dict[str, registry.Table]) -> dict[str, TableSpec]:
    return {name: importlib.import_module(table.module).TABLE for name, table in tables.items()}


TABLES: dict[str, TableSpec] = _specs(registry.TABLES)
# The data the pipeline produces, in pipeline order: validated, compacted and vacuumed.
DATA_TABLES = _specs(registry.of_kind("data"))
# What the data tables are checked against (mapping, the late-data ledger).
REFERENCE_TABLES = _specs(registry.of_kind("reference"))
