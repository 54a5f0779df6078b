"""Every table of the lakehouse, declared once: the registry.

Each table's module declares its :class:`TableSpec` (name, schema, grain, partitioning,
layout, statistics columns); this module lists them all, so whatever works over tables
(maintenance, validation, the report, the README's table of tables, checked by
``tests/test_registry.py``) takes them from here rather than from a list of its own.
"""

from __future__ import annotations

from spark_jobs.bronze import ad_events as bronze
from spark_jobs.gold import ad_attribution, campaign_stats
from spark_jobs.ops import gold_rebuilds, late_data, maintenance_history, stream_progress
from spark_jobs.quality import results
from spark_jobs.silver import ad_campaigns, quarantine
from spark_jobs.silver import ad_events as silver
from spark_jobs.tables import TableSpec


def _by_name(*specs: TableSpec) -> dict[str, TableSpec]:
    return {spec.name: spec for spec in specs}


# The data the pipeline produces, in pipeline order: validated, compacted and vacuumed.
DATA_TABLES = _by_name(bronze.TABLE, silver.TABLE, quarantine.TABLE, campaign_stats.TABLE,
                       ad_attribution.TABLE)

# What the data tables are checked against (mapping, the late-data ledger).
REFERENCE_TABLES = _by_name(ad_campaigns.TABLE, late_data.TABLE)

# What the lakehouse records about itself.
OPS_TABLES = _by_name(gold_rebuilds.TABLE, maintenance_history.TABLE, stream_progress.TABLE,
                      results.TABLE)

TABLES: dict[str, TableSpec] = {**DATA_TABLES, **REFERENCE_TABLES, **OPS_TABLES}
