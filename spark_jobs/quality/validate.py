"""``lakehouse validate``: validate table snapshots with Great Expectations.

Great Expectations cannot validate a streaming DataFrame, so each table is validated as a
snapshot: the Delta table at its latest version, or the rows of a date range. The
project's Great Expectations context lives under ``<root>/quality/gx`` (suites, validation
definitions, checkpoints and results, as Great Expectations keeps them) and builds its Data
Docs site into ``<root>/reports/data_docs``. Every run appends one row per expectation to
``quality.results``; a failed ``critical`` expectation fails the run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs import delta_reader, storage
from spark_jobs.config import Settings
from spark_jobs.datasets import DATA_TABLES, REFERENCE_TABLES
from spark_jobs.delta_writes import query_id, read_position
from spark_jobs.gold import campaign_stats, watermark
from spark_jobs.ops import late_data, stream_progress
from spark_jobs.progress import SILENT, Steps
from spark_jobs.quality import results, suites
from spark_jobs.quality.results import Result
from spark_jobs.quality.suites import CRITICAL, WARNING, Suite
from spark_jobs.silver import ad_events as silver
from spark_jobs.storage import lake_path
from spark_jobs.tables import TableSpec, ensure_table, local_rows

if TYPE_CHECKING:
    from great_expectations.data_context import AbstractDataContext
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
DATASOURCE = "lakehouse"
DOCS_SITE = "local_site"
DOCS_FOLDER = "data_docs"  # under the reports, where the report links to them
OBSERVED_LIMIT = 2000  # characters of observed values or sample rows kept per result
CUT_ATTEMPTS = 5  # gold commits every few seconds at most: a quiet moment comes quickly


@dataclass
class TableVerdict:
    table: str
    grain: str
    results: list[Result] = field(default_factory=list)

    def failed(self, severity: str) -> list[Result]:
        return [r for r in self.results if not r.success and r.severity == severity]

    @property
    def passed(self) -> bool:
        return not self.failed(CRITICAL)

    def summary(self) -> str:
        """One line: the verdict, the counts, and what failed."""
        critical, warnings = self.failed(CRITICAL), self.failed(WARNING)
        status = "FAILED" if critical else ("WARN" if warnings else "passed")
        line = (f"{self.table:<20} {status:<6} {len(self.results) - len(critical) - len(warnings)}"
                f"/{len(self.results)} passed")
        if critical:
            line += f"; critical: {'; '.join(_what(r) for r in critical)}"
        if warnings:
            line += f"; warning: {'; '.join(_what(r) for r in warnings)}"
        return line


@dataclass
class ValidationRun:
    run_id: str
    run_at: datetime
    first: date | None
    last: date | None
    verdicts: list[TableVerdict]

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts)

    def as_json(self) -> dict[str, object]:
        """The run for a machine: per table, its counts and the expectations that failed."""
        def failures(verdict: TableVerdict, severity: str) -> list[dict[str, object]]:
            return [{"expectation": r.expectation, "description": r.description,
                     "unexpected_count": r.unexpected_count, "error": r.error}
                    for r in verdict.failed(severity)]

        return {"run_id": self.run_id, "passed": self.passed,
                "from": self.first and self.first.isoformat(),
                "to": self.last and self.last.isoformat(),
                "tables": {v.table: {"passed": v.passed, "expectations": len(v.results),
                                     "critical": failures(v, CRITICAL),
                                     "warning": failures(v, WARNING)}
                           for v in self.verdicts}}


def _what(result: Result) -> str:
    if result.error:
        return f"{result.description} (could not be evaluated: {result.error[:200]})"
    count = "" if result.unexpected_count is None else f" ({result.unexpected_count} unexpected)"
    return result.description + count


def context(settings: Settings) -> AbstractDataContext:
    """The project's Great Expectations context, its Data Docs built into the reports."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    from spark_jobs.quality import unexpected_rows  # noqa: F401 (its import registers the metrics)

    gx_context = gx.get_context(mode="file", project_root_dir=gx_home(settings))
    gx_context.variables.progress_bars = ProgressBarsConfig(globally=False)
    gx_context.update_data_docs_site(DOCS_SITE, {
        "class_name": "SiteBuilder",
        "show_how_to_buttons": False,
        "store_backend": {"class_name": "TupleFilesystemStoreBackend",
                          "base_directory": str(_docs_built_in(settings))},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
    })
    return gx_context


def gx_home(settings: Settings) -> Path:
    """Where the Great Expectations context lives: ``<root>/quality``, or, for a root on
    the object store, a folder of this machine's (Great Expectations' own stores on S3 need
    boto3, which cannot live beside Airflow here: python-dateutil), one per root."""
    if not storage.is_object_store(settings.root):
        return settings.root / "quality"
    digest = hashlib.sha256(str(settings.root).encode("utf-8")).hexdigest()[:16]
    return Path.home() / ".cache" / "lakehouse" / "quality" / digest


def _docs_built_in(settings: Settings) -> Path:
    """Where Great Expectations builds the Data Docs: in the reports, or beside its local
    context for a root on the store (``publish_docs`` copies them into the reports)."""
    if storage.is_object_store(settings.root):
        return gx_home(settings) / DOCS_FOLDER
    return settings.reports_dir / DOCS_FOLDER


def publish_docs(settings: Settings) -> None:
    """For a root on the object store, the Data Docs built on this machine, copied into
    ``<root>/reports/data_docs`` (a site built elsewhere lists its own runs)."""
    if storage.is_object_store(settings.root):
        storage.upload_tree(_docs_built_in(settings), settings.reports_dir / DOCS_FOLDER)


@dataclass(frozen=True)
class GoldCut:
    """The gold stream at one moment, so that a validation beside the live stream compares
    figures that belong together.

    A gold micro-batch appends to the late-data ledger, then merges into gold (the commit
    carries its latest event time, ``gold.watermark``), while the validation reads silver,
    gold and the ledger one after the other. So gold is read at ``gold_version``, which
    holds the stream's batches up to ``batch_id`` and their ``latest_event_time``; the
    ledger without the later batches of ``query_id``; and silver at ``silver_version``, as
    those batches had read it. (A batch with nothing on time writes only to the ledger, so
    it is later than the cut until a batch after it merges into gold.) A reprocess marks ledger
    entries repaired after it has replaced their gold rows, so the ledger is read at
    ``ledger_version``, taken while gold stayed at ``gold_version``. Without a gold stream
    every table is read at its latest version.
    """

    gold_version: int | None = None
    query_id: str | None = None
    batch_id: int | None = None
    silver_version: int | None = None
    ledger_version: int | None = None
    latest_event_time: int | None = None  # microseconds since the epoch

    def version_of(self, table: str) -> int | None:
        return self.gold_version if table == campaign_stats.TABLE.name else None

    def values(self, settings: Settings) -> dict[str, str]:
        """The suites' placeholders that depend on the moment."""
        seen = _as_of(silver.TABLE, settings, self.silver_version)
        if self.query_id is None:
            in_cut = "TRUE"
        else:
            later = -1 if self.batch_id is None else self.batch_id
            in_cut = f"NOT (query_id = '{self.query_id}' AND batch_id > {later})"
        ledger = _as_of(late_data.TABLE, settings, self.ledger_version)
        latest = ("CAST(NULL AS TIMESTAMP)" if self.latest_event_time is None
                  else f"TIMESTAMP_MICROS({int(self.latest_event_time)})")
        return {"silver_seen_by_gold": seen, "in_gold_cut": in_cut, "late_data_in_cut": ledger,
                "gold_latest_event_time": latest}


def _as_of(spec: TableSpec, settings: Settings, version: int | None) -> str:
    """The table in SQL: by name at its latest version, or by path at ``version``."""
    if version is None:
        return spec.name
    return f"delta.`{spec.path(settings)}` VERSION AS OF {version}"


def gold_cut(settings: Settings) -> GoldCut:
    """Gold's latest version, the stream's last batch in it, and what that batch had read."""
    checkpoint = settings.checkpoint(campaign_stats.QUERY_NAME)
    gold = campaign_stats.TABLE.path(settings)
    if not delta_reader.is_delta_table(gold):
        return GoldCut()
    if not (lake_path(checkpoint) / "metadata").exists():  # no stream: gold as its queries left it
        return GoldCut(latest_event_time=watermark.latest_committed(gold))
    query = str(uuid.UUID(query_id(checkpoint)))  # Spark's id, checked before it enters SQL
    ledger_path = late_data.TABLE.path(settings)
    for _ in range(CUT_ATTEMPTS):  # a ledger version read while gold did not move
        version, batch = delta_reader.applied_batch(gold, query)
        ledger = (delta_reader.latest_version(ledger_path)
                  if delta_reader.is_delta_table(ledger_path) else None)
        if delta_reader.latest_version(gold) == version:
            break
    latest = watermark.latest_committed(gold, query, version=version)
    if batch is None:
        return GoldCut(version, query, ledger_version=ledger, latest_event_time=latest)
    position = _read_position(settings, checkpoint, query, batch)
    return GoldCut(version, query, batch, None if position is None else max(position - 1, 0),
                   ledger, latest)


def _read_position(settings: Settings, checkpoint: str, query: str, batch: int) -> int | None:
    """The silver version gold's batch ``batch`` read up to, exclusive, as Spark reported
    it (``ops.stream_progress``).

    The runner records a batch's progress a few seconds after it, and a driver killed in
    between never does: such a batch is looked up in the query's log of offsets, which
    Spark writes before it runs the batch."""
    recorded = stream_progress.read_position(settings, query, batch)
    return recorded if recorded is not None else read_position(checkpoint, batch)


def snapshot(spark: SparkSession, settings: Settings, suite: Suite, first: date | None,
             last: date | None, version: int | None = None) -> DataFrame:
    """The table at ``version`` (default: its latest), or the rows of the date range."""
    spec = DATA_TABLES[suite.table]
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    frame = reader.load(spec.path(settings))
    if first is not None:
        frame = frame.where(f"{suite.date_column} BETWEEN DATE'{first}' AND DATE'{last}'")
    return frame


def validate(spark: SparkSession, settings: Settings, tables: list[str],
             first: date | None = None, last: date | None = None,
             cut: GoldCut | None = None, steps: Steps = SILENT) -> ValidationRun:
    """Validate ``tables`` (whole, or the dates ``first`` to ``last``) as of ``cut`` (default:
    now), append the results to ``quality.results`` and update Data Docs."""
    for spec in (*DATA_TABLES.values(), *REFERENCE_TABLES.values()):
        ensure_table(spark, settings, spec)  # suites join these by name
    gx_context = context(settings)
    run = ValidationRun(uuid.uuid4().hex, datetime.now(UTC).replace(tzinfo=None), first, last,
                        [])
    cut = cut or gold_cut(settings)
    values = cut.values(settings)
    # Each snapshot is cached here, once; Great Expectations would cache it again.
    source = gx_context.data_sources.add_or_update_spark(DATASOURCE, persist=False)
    steps.start("validating", len(tables))
    for table in tables:
        steps.advance(0, table)
        suite = suites.load(settings, table, first, last, values)
        frame = snapshot(spark, settings, suite, first, last, cut.version_of(table))
        frame = frame.select(*suite.columns_read(frame.columns)).persist()
        try:
            run.verdicts.append(_validate_table(gx_context, source, settings, suite, frame,
                                                run))
        finally:
            frame.unpersist()
        steps.advance()
    ensure_table(spark, settings, results.TABLE)
    rows = [r.row() for verdict in run.verdicts for r in verdict.results]
    (local_rows(spark, rows, results.SCHEMA)
        .write.format("delta").mode("append").save(results.TABLE.path(settings)))
    publish_docs(settings)
    return run


def _validate_table(gx_context: AbstractDataContext, source: Any, settings: Settings,
                    suite: Suite, frame: DataFrame, run: ValidationRun) -> TableVerdict:
    import great_expectations as gx

    asset = next((a for a in source.assets if a.name == suite.table), None) or (
        source.add_dataframe_asset(suite.table))
    batch = next((b for b in asset.batch_definitions if b.name == "snapshot"), None) or (
        asset.add_batch_definition_whole_dataframe("snapshot"))
    expectation_suite = gx_context.suites.add_or_update(
        gx.ExpectationSuite(**suite.document))
    definition = gx_context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=suite.table, data=batch, suite=expectation_suite))
    checkpoint = gx_context.checkpoints.add_or_update(gx.Checkpoint(
        name=suite.table, validation_definitions=[definition],
        actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs", site_names=[DOCS_SITE])],
        result_format={"result_format": "SUMMARY", "partial_unexpected_count": 10}))
    outcome = checkpoint.run(batch_parameters={"dataframe": frame},
                             run_id=gx.RunIdentifier(run_name=run.run_id, run_time=run.run_at))
    verdict = TableVerdict(suite.table, suite.grain)
    for identifier, validation in outcome.run_results.items():
        details = _docs_page(gx_context, settings, identifier)
        for evaluated in validation.results:
            verdict.results.append(_result(evaluated, suite, run, details))
    return verdict


def _docs_page(gx_context: AbstractDataContext, settings: Settings, identifier: Any
               ) -> str | None:
    for site in gx_context.get_docs_sites_urls(resource_identifier=identifier,
                                               only_if_exists=False):
        url = site.get("site_url") or ""
        if url.startswith("file://"):
            page = Path(url.removeprefix("file://"))
            built_in = _docs_built_in(settings)
            if page.is_relative_to(built_in):  # as the reports folder holds it
                return f"{DOCS_FOLDER}/{page.relative_to(built_in)}"
    return None


def _result(evaluated: Any, suite: Suite, run: ValidationRun, details: str | None) -> Result:
    config = evaluated.expectation_config
    outcome = dict(evaluated.result or {})
    exception = evaluated.exception_info or {}
    error = exception.get("exception_message") if exception.get("raised_exception") else None
    observed: Any = outcome.get("observed_value")
    sample = (outcome.get("details") or {}).get("unexpected_rows") or outcome.get(
        "partial_unexpected_list")
    if sample:
        observed = {"observed": observed, "sample": sample}
    unexpected = outcome.get("unexpected_count")
    if unexpected is None and config.type == "unexpected_rows_expectation":
        unexpected = outcome.get("observed_value")
    severity = getattr(config.severity, "value", str(config.severity))
    return Result(
        run_id=run.run_id, run_at=run.run_at, suite=suite.table,
        expectation_id=str(config.id), expectation=config.type,
        description=config.description or _describe(config.type, config.kwargs),
        severity=severity, success=bool(evaluated.success),
        unexpected_count=int(unexpected) if isinstance(unexpected, int | float) else None,
        observed=(json.dumps(observed, default=str)[:OBSERVED_LIMIT]
                  if observed is not None else None),
        error=error, first_date=run.first, last_date=run.last, details=details)


def _describe(kind: str, kwargs: dict[str, Any]) -> str:
    """``expect_column_values_to_be_unique`` on event_id -> 'event_id: values to be unique'."""
    subject = kwargs.get("column") or ", ".join(kwargs.get("column_list") or []) or "table"
    words = kind.removeprefix("expect_").replace("column_values_", "values ").replace(
        "compound_columns_", "together ").replace("_", " ")
    bounds = ", ".join(f"{k} {v:g}" for k, v in kwargs.items()
                       if k in ("min_value", "max_value") and v is not None)
    value_set = kwargs.get("value_set")
    extra = (f" ({bounds})" if bounds else "") + (
        f" {{{', '.join(map(str, value_set))}}}" if value_set else "")
    return f"{subject}: {words}{extra}"
