"""Data quality: the Great Expectations suites pass on clean data, fail on exactly the
broken expectations, and the report renders in a real browser."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from spark_jobs import delta_reader, reasons, streaming
from spark_jobs.bronze import ad_events as bronze
from spark_jobs.config import ConfigError, interval_seconds
from spark_jobs.datasets import TABLES
from spark_jobs.generator import GenerateRequest, Mess, generate
from spark_jobs.gold import ad_attribution, campaign_stats, user_sessions, watermark
from spark_jobs.ops import late_data, stream_progress
from spark_jobs.quality import plots, report, results, suites
from spark_jobs.quality.validate import gold_cut, validate
from spark_jobs.silver import ad_events as silver
from spark_jobs.silver import quarantine
from tests.conftest import make_settings
from tests.processes import run_lakehouse


@pytest.fixture(scope="module")
def clean_root(spark, tmp_path_factory):
    """A generated corpus (messy the way the contract expects) streamed through every layer.
    Its late events (minutes to days old) fall in windows the watermark has closed."""
    settings = make_settings(tmp_path_factory.mktemp("quality") / "lake")
    generate(GenerateRequest(events=1500, seed=11, start=datetime.now(UTC), mess=Mess(),
                             events_per_file=750),
             settings.landing_events, settings.landing_campaigns,
             settings.expected_counts_file)
    streaming.run_available_now(spark, settings, list(streaming.LAYERS))
    return settings


def failed(run, severity: str) -> set[tuple[str, str]]:
    return {(v.table, r.description) for v in run.verdicts for r in v.failed(severity)}


def test_every_table_has_a_suite_with_its_grain_and_severities(settings) -> None:
    # The registry's validated tables, in its (pipeline) order.
    assert suites.available(settings) == ["bronze.ad_events", "silver.ad_events",
                                          "silver.quarantine", "gold.campaign_stats",
                                          "gold.ad_attribution", "gold.user_sessions"]
    for table in suites.available(settings):
        suite = suites.load(settings, table, values=gold_cut(settings).values(settings))
        # The grain is the table's own, from the registry.
        assert suite.grain == TABLES[table].grain and suite.document["meta"]["grain"]
        assert {e["severity"] for e in suite.expectations} <= {"critical", "warning"}
        assert "$" not in json.dumps(suite.document)  # every placeholder filled in


def test_quarantine_suite_knows_every_reason_code(settings) -> None:
    suite = suites.load(settings, "silver.quarantine")
    [codes] = [e["kwargs"]["value_set"] for e in suite.expectations
               if e["type"] == "expect_column_values_to_be_in_set"]
    assert set(codes) == {*reasons.PRECEDENCE, reasons.BAD_CAMPAIGN_MAPPING}


def test_a_date_range_leaves_out_the_whole_table_checks(settings) -> None:
    whole = suites.load(settings, "silver.ad_events")
    ranged = suites.load(settings, "silver.ad_events", date(2026, 11, 1), date(2026, 11, 2))
    # Freshness judges the newest row of the whole table; it means nothing for a range.
    assert len(ranged.expectations) == len(whole.expectations) - 1
    assert "DATE'2026-11-01'" in json.dumps(
        suites.load(settings, "silver.quarantine", date(2026, 11, 1),
                    date(2026, 11, 2)).document)


def test_a_snapshot_caches_only_the_columns_its_suite_reads(settings) -> None:
    columns = bronze.SCHEMA.fieldNames()
    # Bronze's suite names bronze_id (unique), source (in set) and ingested_at (freshness,
    # volume); the raw text, the widest column, is read by none of them.
    assert suites.load(settings, "bronze.ad_events").columns_read(columns) == [
        "bronze_id", "source", "ingested_at"]

    def reading(query: str) -> list[str]:
        suite = suites.Suite("bronze.ad_events", "", "ingest_date", {"expectations": [
            {"type": "unexpected_rows_expectation",
             "kwargs": {"unexpected_rows_query": query}}]})
        return suite.columns_read(columns)

    # count(*) and a product name no column; names match whole words, in any case.
    assert reading("SELECT count(*) FROM {batch} HAVING 0.2 * count(*) > 1") == []
    assert reading("SELECT Source FROM {batch} WHERE raw_length > 1") == ["source"]
    # A query that selects every column needs them all.
    for query in ("SELECT * FROM {batch}", "SELECT b.* FROM {batch} b",
                  "SELECT {batch}.* FROM {batch}", "SELECT 1 AS one, * FROM {batch}"):
        assert reading(query) == columns, query


def test_an_unknown_suite_or_placeholder_is_a_clear_error(settings) -> None:
    with pytest.raises(ConfigError, match="no expectation suite for gold.nope"):
        suites.load(settings, "gold.nope")
    # $gold_latest_event_time (the suite's first placeholder) is a value of the run, not a
    # setting.
    with pytest.raises(ConfigError, match=r"uses \$gold_latest_event_time"):
        suites.load(settings, "gold.campaign_stats")


def test_clean_data_passes_every_suite_and_is_recorded(spark, clean_root) -> None:
    run = validate(spark, clean_root, suites.available(clean_root))
    assert run.passed, [v.summary() for v in run.verdicts]
    # The generator's default mess (about 4% quarantined, 1% unmapped ads) stays under the
    # warning thresholds (10%, 5%): clean data raises no warning either.
    assert failed(run, "warning") == set()
    history = spark.read.format("delta").load(results.TABLE.path(clean_root))
    values = gold_cut(clean_root).values(clean_root)
    expected = sum(len(suites.load(clean_root, t, values=values).expectations)
                   for t in suites.available(clean_root))
    assert history.where(F.col("run_id") == run.run_id).count() == expected
    details = {r.details for v in run.verdicts for r in v.results}
    assert all(d and (clean_root.reports_dir / d).exists() for d in details)
    assert (clean_root.reports_dir / "data_docs" / "index.html").exists()
    # The reconciliation is not vacuous: the watermark has closed windows.
    closed = (watermark.naive_utc(gold_cut(clean_root).latest_event_time)
              - timedelta(seconds=interval_seconds(clean_root.watermark_delay)))
    gold = spark.read.format("delta").load(campaign_stats.TABLE.path(clean_root))
    assert gold.where(F.col("window_end") <= F.lit(closed)).count() > 0


def test_a_date_range_is_validated_without_the_whole_table_checks(spark, clean_root) -> None:
    today = datetime.now(UTC).date()
    run = validate(spark, clean_root, ["silver.ad_events"], today - timedelta(days=1), today)
    [verdict] = run.verdicts
    assert verdict.passed
    whole = suites.load(clean_root, "silver.ad_events",
                        values=gold_cut(clean_root).values(clean_root))
    assert len(verdict.results) == len(whole.expectations) - 1  # freshness left out
    assert {r.first_date for r in verdict.results} == {today - timedelta(days=1)}


def test_a_gold_batch_during_the_validation_does_not_skew_the_reconciliation(
        spark, clean_root, tmp_path) -> None:
    """The live races: the gold stream writes its next micro-batch (a ledger row, gold
    counts), and a reprocess marks the ledger repaired, after a validation has started.
    Read as of the cut taken at its start, every closed window reconciles; read at the
    tables' latest versions, it did not."""
    root = tmp_path / "lake"
    shutil.copytree(clean_root.root, root)
    settings = make_settings(root)
    read_silver = spark.read.format("delta").load(silver.TABLE.path(settings))
    # Two more old events and a new one reach silver; the real gold stream's next batch
    # counts the new one (its MERGE makes it the cut's batch) and finds the old ones' window
    # closed, so the ledger lists them, before the cut.
    _append(spark, settings, silver.TABLE, read_silver.orderBy("event_time").limit(2)
            .unionByName(read_silver.orderBy(F.desc("event_time")).limit(1))
            .withColumn("event_id", F.concat(F.lit("before-cut-"), "event_id")))
    streaming.run_available_now(spark, settings, ["gold"])
    cut = gold_cut(settings)
    assert cut.batch_id is not None and cut.silver_version is not None
    # What the cut's batch read is Spark's report of it, recorded in ops.stream_progress:
    # the whole of silver, which the available-now batch read. A batch its driver never got
    # to record (killed first) is found in the query's offset log, at the same version.
    recorded = stream_progress.read_position(settings, cut.query_id, cut.batch_id)
    assert recorded == cut.silver_version + 1 == delta_reader.latest_version(
        silver.TABLE.path(settings)) + 1
    spark.sql(f"DELETE FROM delta.`{stream_progress.TABLE.path(settings)}` "
              f"WHERE query_id = '{cut.query_id}' AND batch_id = {cut.batch_id}")
    assert stream_progress.read_position(settings, cut.query_id, cut.batch_id) is None
    assert gold_cut(settings) == cut
    ledger = spark.read.format("delta").load(late_data.TABLE.path(settings))
    assert ledger.where(F.col("batch_id") == cut.batch_id).count() > 0
    # The stream's next batch, after the cut: two events of the newest window, which it
    # counts, and two of the oldest, which its watermark has closed, so the ledger lists them.
    events = (read_silver.orderBy(F.desc("event_time")).limit(2)
              .unionByName(read_silver.orderBy("event_time").limit(2))
              .withColumn("event_id", F.concat(F.lit("next-"), "event_id")))
    campaign_stats.process(spark, events, cut.query_id, cut.batch_id + 1, settings=settings)
    assert ledger.where(F.col("batch_id") == cut.batch_id + 1).count() > 0
    with_next_batch = delta_reader.latest_version(late_data.TABLE.path(settings))
    # A rebuild that replaced gold after the cut (not in the pinned gold version) then marks
    # the ledger entries of its dates repaired.
    spark.sql(f"UPDATE delta.`{late_data.TABLE.path(settings)}` "
              "SET repaired_at = current_timestamp()")

    reconcile = ("gold.campaign_stats", "Closed windows reconcile with silver: events in "
                 "silver = events counted in gold + late events not yet repaired")

    def verdict(cut):
        return failed(validate(spark, settings, ["gold.campaign_stats"], cut=cut), "critical")

    assert verdict(cut) == set()
    # The ledger read just after the next batch's append (while gold had not moved yet): its
    # rows are left out by batch, and without that the ledger lists late events silver lacks.
    assert verdict(replace(cut, ledger_version=with_next_batch)) == set()
    assert verdict(replace(cut, query_id=None, batch_id=None,
                           ledger_version=with_next_batch)) == {reconcile}
    # The ledger as it is now, gold as of the cut: the late events the ledger listed at the
    # cut are neither listed (marked repaired) nor counted (the rebuild is not in that gold).
    assert verdict(replace(cut, ledger_version=None)) == {reconcile}


def _append(spark, settings, spec, rows) -> None:
    rows.write.format("delta").mode("append").save(spec.path(settings))


def break_the_data(spark, settings) -> None:
    """The problems a user must see: every one hits a known expectation."""
    def read(spec):
        return spark.read.format("delta").load(spec.path(settings))

    newest = read(bronze.TABLE).agg(F.max("ingested_at")).first()[0]
    # A burst of malformed records: 400 in the newest hour, received and quarantined.
    burst = (spark.range(400).select(
        F.concat(F.lit("burst-"), F.col("id").cast("string")).alias("bronze_id"),
        F.lit("{not json").alias("raw"), F.lit("file").alias("source"),
        F.lit("burst.jsonl").alias("source_file"), F.col("id").alias("source_line"),
        F.lit(None).cast("string").alias("kafka_topic"),
        F.lit(None).cast("int").alias("kafka_partition"),
        F.lit(None).cast("long").alias("kafka_offset"),
        F.lit(newest).alias("ingested_at"), F.to_date(F.lit(newest)).alias("ingest_date")))
    _append(spark, settings, bronze.TABLE, burst)
    _append(spark, settings, quarantine.TABLE, burst.select(
        "*", F.lit(reasons.MALFORMED_JSON).alias("reason"), F.lit("injected").alias("detail"),
        F.current_timestamp().alias("quarantined_at")))
    # A stale layer: bronze received records two hours later that silver never placed.
    _append(spark, settings, bronze.TABLE, burst.limit(3).select(
        F.concat(F.lit("stale-"), "bronze_id").alias("bronze_id"),
        *[c for c in bronze.SCHEMA.fieldNames() if c not in ("bronze_id", "ingested_at",
                                                              "ingest_date")],
        F.lit(newest + timedelta(hours=2)).alias("ingested_at"),
        F.to_date(F.lit(newest + timedelta(hours=2))).alias("ingest_date")))
    # A duplicated id forced into silver.
    _append(spark, settings, silver.TABLE, read(silver.TABLE).limit(1))
    # Gold: a negative count on a second row for an existing key; a view after its click.
    # The earliest window (of a late event, days old) is surely closed.
    _append(spark, settings, campaign_stats.TABLE,
            read(campaign_stats.TABLE).orderBy("window_start").limit(1)
            .withColumn("views", F.lit(-1).cast("long"))
            .withColumn("clicks", F.lit(0).cast("long"))
            .withColumn("purchases", F.lit(0).cast("long")))
    _append(spark, settings, ad_attribution.TABLE, read(ad_attribution.TABLE).limit(1)
            .withColumn("click_event_id", F.lit("injected-click"))
            .withColumn("view_time", F.col("click_time") + F.expr("INTERVAL 5 MINUTES")))
    # Sessions: one written twice, and one split in two a second after its start.
    session = read(user_sessions.TABLE).orderBy("user_id", "session_start").limit(1)
    _append(spark, settings, user_sessions.TABLE, session.unionByName(session.withColumn(
        "session_start", F.col("session_start") + F.expr("INTERVAL 1 SECOND"))))


# What break_the_data must trip, and nothing else.
EXPECTED_CRITICAL = {
    ("silver.ad_events", "event_id: values to be unique"),
    ("silver.ad_events", "Silver is at most 30 minutes behind bronze"),
    ("gold.campaign_stats", "campaign_id, window_start: together to be unique"),
    ("gold.campaign_stats", "views: values to be between (min_value 0)"),
    # The extra row (views -1) makes its closed window count one event less than silver.
    ("gold.campaign_stats", "Closed windows reconcile with silver: events in silver = events "
                            "counted in gold + late events not yet repaired"),
    ("gold.ad_attribution", "The view comes before the click, within 1 hour"),
    ("gold.user_sessions", "user_id, session_start: together to be unique"),
    ("gold.user_sessions", "One user's sessions are more than 30 minutes apart"),
}
EXPECTED_WARNING = {
    ("silver.quarantine", "Under 10% of the records received in any hour are quarantined"),
}

VOLUME_WARNINGS = {
    (table, f"Hourly volume of {what} within 0.2x to 5x of its trailing 24-hour baseline")
    for table, what in (("bronze.ad_events", "bronze records"), ("silver.ad_events",
                                                                "silver events"))}


@pytest.fixture(scope="module")
def broken_root(spark, clean_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("quality-broken") / "lake"
    shutil.copytree(clean_root.root, root)
    settings = make_settings(root)
    break_the_data(spark, settings)
    return settings


@pytest.fixture(scope="module")
def broken_validation(broken_root) -> subprocess.CompletedProcess[str]:
    """``lakehouse validate`` over the broken root, as a user runs it."""
    return run_lakehouse("validate", "--root", str(broken_root.root))


def test_validate_fails_on_exactly_the_broken_critical_expectations(
        broken_root, broken_validation) -> None:
    done = broken_validation
    assert done.returncode == 1, done.stderr[-3000:]
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert " FAILED " in lines["silver.ad_events"]
    assert " passed " in lines["bronze.ad_events"]
    assert " WARN " in lines["silver.quarantine"]
    assert "validation FAILED" in done.stderr

    history = delta_reader.read_arrow(results.TABLE.path(broken_root)).to_pandas()
    latest = history[history["run_at"] == history["run_at"].max()]
    failures = latest[~latest["success"]]
    by_severity = {severity: set(zip(rows["suite"], rows["description"], strict=True))
                   for severity, rows in failures.groupby("severity")}
    assert by_severity.get("critical") == EXPECTED_CRITICAL
    # A corpus ingested across an hour boundary gives its newest full hour a baseline, and
    # the injected rows make that hour an outlier: a volume warning is then right too.
    assert by_severity.get("warning") - VOLUME_WARNINGS == EXPECTED_WARNING
    assert failures["error"].isna().all()  # failed on the data, not on an exception
    unique = failures[failures["description"] == "event_id: values to be unique"]
    assert unique["unexpected_count"].tolist() == [2]  # the original row and its copy


def test_the_report_renders_in_a_real_browser(broken_root, broken_validation,
                                              tmp_path) -> None:
    [page] = sorted(broken_root.reports_dir.glob("quality-*.html"))
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is installed by `make setup`"
    browser = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
               f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*browser, "--dump-dom", page.as_uri()], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    for section in ("suites", "failures", "quarantine", "freshness", "volume", "late"):
        assert f'<section id="{section}">' in dom, section
    for plot in ("plot-suites", "plot-quarantine", "plot-freshness", "plot-volume"):
        figure = dom.split(f'id="{plot}"', 1)[1].split("</figure>", 1)[0]
        assert "<svg" in figure and "<path" in figure, plot
    # The late-data plot draws the ledger, or says it is empty: whichever the ledger holds.
    late_plot = dom.split('id="plot-late"', 1)[1].split("</figure>", 1)[0]
    ledger = delta_reader.read_rows(late_data.TABLE.path(broken_root))
    if ledger:
        assert "<svg" in late_plot and "<path" in late_plot
    else:
        assert "no data in this period" in late_plot and "<svg" not in late_plot
    assert dom.count('class="failure"') >= len(EXPECTED_CRITICAL) + len(EXPECTED_WARNING)
    assert 'class="verdict failed"' in dom
    # Every failing expectation links to its Data Docs page, which exists.
    for link in {part.split('"', 1)[0] for part in dom.split('href="data_docs/')[1:]}:
        assert (broken_root.reports_dir / "data_docs" / link).exists(), link

    screenshot = tmp_path / "quality-report.png"
    subprocess.run([*browser, "--window-size=1366,900", f"--screenshot={screenshot}",
                    page.as_uri()], capture_output=True, timeout=120, check=True)
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert screenshot.stat().st_size > 20_000  # a page with content, not a blank frame


def test_render_without_history_says_there_is_no_data() -> None:
    import pandas as pd

    empty = pd.DataFrame()
    measures = report.Measures(
        datetime(2026, 11, 22, 12, 0), 7, empty, empty, empty,
        pd.DataFrame({"layer": ["bronze"], "lag_minutes": [None], "meaning": ["x"]}),
        empty, empty)
    page = report.render(measures)
    assert page.count("no data in this period") == 5  # every plot, none crashes
    assert "No validation ran with this report." in page


def test_values_from_the_data_are_escaped_in_the_report() -> None:
    import pandas as pd

    empty = pd.DataFrame()
    # An expectation's observed values come from the rows: a hostile event_type among them.
    failures = pd.DataFrame({
        "suite": ["silver.ad_events"], "severity": ["critical"],
        "description": ["event_type is one of view, click, purchase"],
        "unexpected_count": [3.0], "observed": ["['<script>alert(1)</script>']"],
        "error": [None], "details": ["data_docs/validations/x.html"]})
    measures = report.Measures(
        datetime(2026, 11, 22, 12, 0), 7, empty, failures, empty,
        pd.DataFrame({"layer": ["bronze"], "lag_minutes": [None], "meaning": ["x"]}),
        empty, empty)
    page = report.render(measures)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script" not in page
    # The count read as a float (NaN elsewhere in its column) shows as the integer it is.
    assert '<td class="num">3</td>' in page


def test_validate_refuses_bad_parameters(tmp_path) -> None:
    root = str(tmp_path / "lake")
    for args, message in ((["--from", "2026-11-02", "--to", "2026-11-01"], "is after --to"),
                          (["--from", "2026-13-01", "--to", "2026-11-01"], "is not a date"),
                          (["--from", "2026-11-01"], "go together"),
                          (["--tables", "gold.nope"], "unknown table(s) gold.nope")):
        done = run_lakehouse("validate", "--root", root, *args)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)


PLUGIN_CHECK = """
import json
from airflow.api_fastapi.app import init_auth_manager
from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
from fastapi.testclient import TestClient
from lakehouse_plugin import app
# Airflow's own auth manager signs the token, as its API server does at login.
token = init_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
anonymous = TestClient(app)
forged = TestClient(app, headers={"Authorization": "Bearer not-a-token"})
client = TestClient(app, headers={"Authorization": f"Bearer {token}"})
link = client.get("/quality", follow_redirects=False)
page = client.get("/" + link.headers["location"])
docs = client.get("/reports/data_docs/index.html")
escape = client.get("/reports/..%2Fcatalog.sql")
print(json.dumps({
    "anonymous": [anonymous.get(path, follow_redirects=False).status_code
                  for path in ("/health", "/quality", "/" + link.headers["location"])],
    "forged": forged.get("/health").status_code,
    "cookie": TestClient(app, cookies={"_token": token}).get("/health").status_code,
    "link": [link.status_code, link.headers["location"]],
    "page": [page.status_code, "Lakehouse data quality" in page.text],
    "docs": docs.status_code, "escape": escape.status_code}))
"""


def test_the_ui_plugin_serves_the_latest_report_and_its_data_docs_to_logged_in_users(
        broken_root, broken_validation, tmp_path) -> None:
    import os
    import sys

    from spark_jobs.config import PROJECT_DIR

    env = {**os.environ, "PYTHONPATH": str(PROJECT_DIR / "plugins"),
           "LAKEHOUSE_ROOT": str(broken_root.root), "AIRFLOW_HOME": str(tmp_path / "airflow")}
    # Airflow's database holds the revoked tokens every authenticated request is checked
    # against, as in the API server.
    subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=env,
                   capture_output=True, timeout=300, check=True)
    done = subprocess.run([sys.executable, "-c", PLUGIN_CHECK], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    served = json.loads(done.stdout.strip().splitlines()[-1])
    [page] = sorted(broken_root.reports_dir.glob("quality-*.html"))
    # Without the Airflow login nothing is served, a forged token neither; the UI's JWT
    # cookie is accepted like the API's bearer token (that is how the UI's menu opens them).
    assert served["anonymous"] == [401, 401, 401] and served["forged"] == 403
    assert served["cookie"] == 200
    # A redirect into reports/, so the report's relative Data Docs links resolve there.
    assert served["link"] == [307, f"reports/{page.name}"]
    assert served["page"] == [200, True] and served["docs"] == 200
    assert served["escape"] == 404  # nothing outside the reports folder


def test_every_span_of_runs_gets_a_few_readable_ticks_without_a_warning() -> None:
    import warnings

    import pandas as pd

    # From one minute of runs to two years: matplotlib's own choice warned for four days
    # (five daily ticks were too few for its minimum, hourly ones too many) and drew nine.
    for span in ("1min", "2h", "1D", "3D", "4D", "5D", "10D", "45D", "730D"):
        runs = pd.DataFrame({"run_at": [pd.Timestamp("2026-11-20"),
                                        pd.Timestamp("2026-11-20") + pd.Timedelta(span)],
                             "suite": ["silver.ad_events"] * 2, "status": ["passed"] * 2})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            svg = plots.suite_history_chart(runs)
        ticks = re.findall(r'<g id="xtick_\d+">', svg)
        assert 2 <= len(ticks) <= 8, (span, len(ticks))


def test_a_lone_run_is_plotted_on_hours_not_years() -> None:
    import pandas as pd

    one_run = pd.DataFrame({"run_at": [pd.Timestamp("2026-11-24 01:00")],
                            "suite": ["silver.ad_events"], "status": ["passed"]})
    svg = plots.suite_history_chart(one_run)
    # matplotlib names each tick label in a comment: hours of that day, no year ticks
    # (autoscale alone spread the one point over 2025 to 2029).
    labels = re.findall(r"<!-- (.*?) -->", svg)
    assert "01:00" in labels, labels
    assert not {"2025", "2026", "2027", "2028", "2029"} & set(labels), labels


def test_an_unexpected_rows_query_runs_once_and_still_counts_every_row(spark, monkeypatch
                                                                       ) -> None:
    import great_expectations as gx
    from great_expectations.constants import MAX_RESULT_RECORDS
    from pyspark.sql import SparkSession

    from spark_jobs.quality import unexpected_rows  # noqa: F401 (registers the metrics)

    queries: list[str] = []
    plain_sql = SparkSession.sql

    def counted_sql(self, query, *args, **kwargs):
        if "tmp_view" in query:  # the expectations' queries, not Great Expectations' own
            queries.append(query)
        return plain_sql(self, query, *args, **kwargs)

    monkeypatch.setattr(SparkSession, "sql", counted_sql)
    gx_context = gx.get_context(mode="ephemeral")
    asset = gx_context.data_sources.add_spark("numbers").add_dataframe_asset("numbers")
    batch = asset.add_batch_definition_whole_dataframe("all").get_batch(
        batch_parameters={"dataframe": spark.range(1000)})

    def check(query: str) -> tuple[bool, int, int]:
        result = batch.validate(gx.expectations.UnexpectedRowsExpectation(
            unexpected_rows_query=query), result_format="COMPLETE")
        return (result.success, result.result["observed_value"],
                len(result.result["details"]["unexpected_rows"]))

    # id < 0 matches none of 0..999, id < 3 three rows, id < 250 more rows than the sample
    # keeps (200): its count must still be 250, from a second query that counts them all.
    assert check("SELECT id FROM {batch} WHERE id < 0") == (True, 0, 0)
    assert check("SELECT id FROM {batch} WHERE id < 3") == (False, 3, 3)
    assert len(queries) == 2, queries  # one query each, where Great Expectations runs two
    assert MAX_RESULT_RECORDS == 200
    assert check("SELECT id FROM {batch} WHERE id < 250") == (False, 250, 200)
    assert len(queries) == 4, queries
