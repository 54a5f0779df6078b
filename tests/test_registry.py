"""The table registry (``spark_jobs.registry``) is the one list of tables: every module's
``TABLE``, the streams started and shown, the suites, maintenance, reset and the README's
table of tables agree with it."""

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys

import spark_jobs
from spark_jobs import datasets, maintenance, registry, reprocess, reset, streaming
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
    assert list(datasets.TABLES) == list(registry.TABLES)
    for name, spec in datasets.TABLES.items():
        # Each module declares its registry entry, with nothing changed, plus its schema.
        assert spec.fields() == registry.TABLES[name].fields()
        assert importlib.import_module(registry.TABLES[name].module).TABLE is spec
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


def test_streams_are_started_shown_and_reset_as_the_registry_says() -> None:
    # Each stream is started by the module of the table named after it, under that name.
    assert registry.query_names() == ("bronze_ad_events", "silver_ad_events",
                                      "silver_ad_campaigns", "gold_campaign_stats",
                                      "gold_ad_attribution", "gold_user_sessions", "ops_alerts")
    started = [importlib.import_module(module) for modules in streaming.LAYERS.values()
               for module in modules]
    assert [module.QUERY_NAME for module in started] == list(registry.query_names())
    assert all(callable(module.start) for module in started)
    assert list(streaming.LAYERS) == ["bronze", "silver", "gold", "ops"]
    # A catch-up starts a layer once the layers it reads have caught up: the alert stream
    # reads bronze, so it runs beside silver and gold rather than after them.
    assert {layer: streaming.upstream(layer) for layer in streaming.LAYERS} == {
        "bronze": set(), "silver": {"bronze"}, "gold": {"silver"}, "ops": {"bronze"}}
    # A table written by a stream is written by one the runner starts (the quarantine by
    # silver's).
    assert {t.stream for t in registry.TABLES.values() if t.stream} == set(
        registry.query_names())
    # A reset of a layer empties what its streams write (and gold's record of rebuilds).
    assert {layer: [t.name for t in tables] for layer, tables in reset.TABLES.items()} == {
        "silver": ["silver.ad_events", "silver.quarantine", "silver.ad_campaigns"],
        "gold": ["gold.campaign_stats", "gold.ad_attribution", "gold.user_sessions",
                 "ops.gold_rebuilds"],
        "ops": ["ops.alerts"]}


def test_the_dags_assets_and_the_gold_rebuild_follow_the_registry() -> None:
    # The streams publish each layer's data tables (not the quarantine, written beside
    # silver, nor the campaign mapping, reference data); a reprocess rebuilds silver's and
    # gold's, the same ones whose update starts a validation.
    assert registry.published() == ("bronze.ad_events", "silver.ad_events",
                                    "gold.campaign_stats", "gold.ad_attribution",
                                    "gold.user_sessions")
    assert registry.published(registry.REPROCESSED_LAYERS) == (
        "silver.ad_events", "gold.campaign_stats", "gold.ad_attribution",
        "gold.user_sessions")
    # Every gold table rebuilds itself, with the one signature the reprocess calls.
    rebuilt = reprocess._gold_tables()
    assert [module.TABLE.name for module in rebuilt] == ["gold.campaign_stats",
                                                        "gold.ad_attribution",
                                                        "gold.user_sessions"]
    assert {tuple(inspect.signature(module.rebuild).parameters) for module in rebuilt} == {
        ("spark", "settings", "events", "days", "dry_run", "before_write")}


def test_the_shipped_suites_are_the_registry_s() -> None:
    shipped = {path.stem for path in (PROJECT_DIR / "expectations").glob("*.json")}
    assert shipped == {name for name, table in registry.TABLES.items() if table.suite}


def test_the_registry_imports_no_pyspark() -> None:
    # The Airflow API server (the Stream health page) and the DAG files read it.
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, spark_jobs.registry; "
                               "print(sorted(m for m in sys.modules if 'pyspark' in m))"],
        capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


def test_each_stream_s_trigger_in_a_continuous_run() -> None:
    from spark_jobs import config

    files, kafka = config.load({}), config.load({"source": "kafka"})
    # The sessions' own minute (sessions_trigger) is longer than the driver's 5 s, so it
    # stands; behind a driver slower than that (--trigger 2 minutes), the driver's.
    assert registry.trigger_of(files, "gold_user_sessions") == "1 minute"
    assert registry.trigger_of(files, "gold_user_sessions", "2 minutes") == "2 minutes"
    assert registry.trigger_of(kafka, "gold_user_sessions", "20 seconds") == "1 minute"
    # Attribution's own 30 s (attribution_trigger) the same way, with either source.
    assert registry.trigger_of(files, "gold_ad_attribution") == "30 seconds"
    assert registry.trigger_of(kafka, "gold_ad_attribution", "1 minute") == "1 minute"
    # The alert path's 2 s applies where it reads Kafka, not where it reads bronze.
    assert registry.trigger_of(kafka, "ops_alerts", "20 seconds") == "2 seconds"
    assert registry.trigger_of(files, "ops_alerts", "20 seconds") == "20 seconds"
    # Every other stream: the driver's.
    assert registry.trigger_of(kafka, "gold_campaign_stats", "20 seconds") == "20 seconds"
    assert registry.trigger_of(files, "silver_ad_events") == "5 seconds"


def test_streams_reading_the_lake_poll_it_sooner_than_their_trigger() -> None:
    from spark_jobs import config

    files, kafka = config.load({}), config.load({"source": "kafka"})
    # Silver and gold's windows read a table: each looks for its commits every second
    # (table_poll_interval) instead of at the driver's 5 s tick.
    for name in ("silver_ad_events", "gold_campaign_stats"):
        assert registry.poll_of(files, name) == "1 second"
        assert registry.poll_of(kafka, name) == "1 second"
    # The alert stream reads bronze from the landing zone, the topic (its own 2 s) with Kafka.
    assert registry.poll_of(files, "ops_alerts") == "1 second"
    assert registry.poll_of(kafka, "ops_alerts") == "2 seconds"
    # Bronze and the campaigns read from outside the lake; the sessions keep their minute.
    assert registry.poll_of(files, "bronze_ad_events") == "5 seconds"
    assert registry.poll_of(files, "silver_ad_campaigns") == "5 seconds"
    assert registry.poll_of(files, "gold_user_sessions") == "1 minute"
    # Attribution keeps its 30 s: a batch per silver commit is what it must not run.
    assert registry.poll_of(files, "gold_ad_attribution") == "30 seconds"
    # A driver ticking faster than the poll: its own tick, never a slower one.
    assert registry.poll_of(files, "silver_ad_events", "500 milliseconds") == "500 milliseconds"
