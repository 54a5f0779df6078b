"""Every table of the lakehouse, by name: one registry for the jobs that work over all of
them (maintenance, validation)."""

from __future__ import annotations

from spark_jobs.bronze import ad_events as bronze
from spark_jobs.gold import ad_attribution, campaign_stats
from spark_jobs.ops import late_data
from spark_jobs.silver import ad_campaigns, quarantine
from spark_jobs.silver import ad_events as silver
from spark_jobs.tables import TableSpec

# The data the pipeline produces, in pipeline order.
DATA_TABLES: dict[str, TableSpec] = {spec.name: spec for spec in (
    bronze.TABLE, silver.TABLE, quarantine.TABLE, campaign_stats.TABLE, ad_attribution.TABLE)}

# What the data tables are checked against (mapping, the late-data ledger).
REFERENCE_TABLES: dict[str, TableSpec] = {spec.name: spec for spec in (
    ad_campaigns.TABLE, late_data.TABLE)}
