"""The table registry (``spark_jobs.datasets``) is the one list of tables: the README's table
of tables, the suites and maintenance agree with it."""

import importlib
import pkgutil
import re

import spark_jobs
from spark_jobs import datasets, maintenance
from spark_jobs.config import PROJECT_DIR
from spark_jobs.tables import TableSpec


def declared_tables() -> dict[str, TableSpec]:
    """Every ``TABLE`` a module of the package declares, found by walking the package, so a
    table left out of the registry cannot go unnoticed."""
    found = {}
    for module in pkgutil.walk_packages(spark_jobs.__path__, "spark_jobs."):
        spec = getattr(importlib.import_module(module.name), "TABLE", None)
        if isinstance(spec, TableSpec):
            found[spec.name] = spec
    return found


def test_the_registry_holds_every_table_a_module_declares() -> None:
    assert declared_tables() == datasets.TABLES
    for spec in datasets.TABLES.values():
        # Every table says what one row is, and lays out by columns it has.
        assert spec.grain.startswith(("one row per", "the late-data ledger")), spec.name
        columns = set(spec.schema.fieldNames())
        assert set(spec.zorder_by) <= columns and set(spec.partitioned_by) <= columns


def test_the_readme_lists_the_registry_s_tables_with_their_grain() -> None:
    readme = (PROJECT_DIR / "README.md").read_text("utf-8")
    rows = re.findall(r"^\| `([a-z_]+\.[a-z_]+)` \| `([a-z_/]+)` \| (.+) \|$", readme,
                      re.MULTILINE)
    assert {name: (path, grain) for name, path, grain in rows} == {
        name: (spec.relative_path, spec.grain) for name, spec in datasets.TABLES.items()}


def test_suites_and_maintenance_take_their_tables_from_the_registry(settings) -> None:
    from spark_jobs.quality import suites
    from spark_jobs.quality.validate import gold_cut

    run_values = gold_cut(settings).values(settings)  # what the gold suites refer to
    for table in suites.available(settings):
        assert (suites.load(settings, table, values=run_values).grain
                == datasets.TABLES[table].grain)
    assert maintenance.TABLES == datasets.DATA_TABLES
    # The layouts the maintenance benchmark measured: one ad over a week in silver, one
    # campaign over a day in gold.
    assert datasets.TABLES["silver.ad_events"].zorder_by == ("ad_id",)
    assert datasets.TABLES["gold.campaign_stats"].zorder_by == ("campaign_id", "window_start")
