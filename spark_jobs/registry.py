"""Every table of the lakehouse, declared once: the registry.

A table is its entry here (name, grain, partitioning, layout, statistics columns, the
stream that writes it, whether it has a suite) and its own module,
``spark_jobs/<layer>/<table>.py``, which adds the schema (``TableSpec``), its transform and
its stream. Whatever works over tables or streams takes them from here: the stream runner
(which modules start which streams, layer by layer), maintenance, validation and its suites,
the report, the Stream health page, the demo, ``lakehouse reset`` and the README's table of
tables (``tests/test_registry.py`` keeps them in step).

Plain Python, no PySpark: the Airflow API server and the DAG files read it too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from spark_jobs.config import Settings

# What a table holds: the data the pipeline produces (validated, compacted and vacuumed),
# what that data is checked against, or what the lakehouse records about itself.
Kind = Literal["data", "reference", "ops"]


@dataclass(frozen=True, kw_only=True)
class Table:
    name: str  # "layer.table", as SQL users query it; its module is spark_jobs.<layer>.<table>
    kind: Kind
    # One sentence: what one row is. The README's table of tables and the report's suite
    # table show it.
    grain: str
    partitioned_by: tuple[str, ...] = ()
    # The nightly OPTIMIZE's layout: Z-order by these columns, or plain bin-packing.
    zorder_by: tuple[str, ...] = ()
    # Columns Delta keeps min/max statistics for (file skipping, Z-order). Delta's default is
    # the first 32 columns, which includes the raw text: collecting its statistics cost
    # three times the validation itself on every write (measured by make bench).
    stats_columns: tuple[str, ...] = ()
    properties: dict[str, str] = field(default_factory=dict)
    # The streaming query that writes the table. A stream is started by the module of the
    # table it is named after (``silver_ad_events``: ``spark_jobs.silver.ad_events``), which
    # may write other tables too (the quarantine).
    stream: str | None = None
    # The stream applies an event-time watermark: its progress rows carry it.
    windowed: bool = False
    # The setting holding the stream's processing-time trigger in a continuous run, and
    # when it applies (``trigger_of``): "kafka", where the stream reads Kafka (a trigger
    # shorter than the driver's); "longer", where it is longer than the driver's (a stream
    # whose rows need not be as fresh).
    trigger_setting: str = "trigger_interval"
    trigger_applies: Literal["kafka", "longer"] = "kafka"
    # Whether Spark looks for the stream's input every ``table_poll_interval`` where that is
    # shorter than its trigger (``poll_of``): "always" for a stream reading a table of the
    # lake whose rows are wanted as soon as that table's writer commits them, "files" where
    # that holds with the landing zone only (with Kafka, it reads the topic).
    polls_lake: Literal["never", "always", "files"] = "never"
    # Validated by the suite ``<expectations_dir>/<name>.json``.
    suite: bool = False

    @property
    def layer(self) -> str:
        return self.name.split(".")[0]

    @property
    def module(self) -> str:
        return f"spark_jobs.{self.name}"

    @property
    def relative_path(self) -> str:
        return self.name.replace(".", "/")

    def path(self, settings: Settings) -> str:
        return settings.table_path(self.relative_path)

    @property
    def table_properties(self) -> dict[str, str]:
        if not self.stats_columns:
            return self.properties
        return {"delta.dataSkippingStatsColumns": ",".join(self.stats_columns),
                **self.properties}

    def fields(self) -> dict[str, object]:
        """The entry's values, to declare the same table with its schema (``TableSpec``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(Table)}


def _by_name(*tables: Table) -> dict[str, Table]:
    return {table.name: table for table in tables}


# In pipeline order: streams start, suites run and the README lists tables in this order.
TABLES: dict[str, Table] = _by_name(
    # Not Z-ordered: raw records are read whole, by ingestion date. So Parquet's own
    # statistics (each column's min and max per row group and page, and its size
    # statistics) skip nothing here but cost every write: comparing and measuring each
    # record's raw text, identity and file path took 0.6-0.8 s of a million records' 4.0-4.6
    # s batch append, and 0.3-0.4 s of the stream's 6.6 s of executor CPU for them
    # (bench/HISTORY.md, 7 December). Delta's own statistics (``stats_columns``), which
    # skip files by ingestion time, are kept. Row groups of 32 MB, not Parquet's 128: a
    # task can read no less than a row group, so a batch's few large files would otherwise
    # give validation a few uneven tasks (``bronze.even_reads``).
    Table(name="bronze.ad_events", kind="data",
          grain="one row per record received (non-blank line, or Kafka message), raw text "
                "untouched, partitioned by ingest_date",
          partitioned_by=("ingest_date",), stats_columns=("ingested_at",),
          properties={"parquet.column.statistics.enabled": "false",
                      "parquet.size.statistics.enabled": "false",
                      "parquet.block.size": str(32 << 20)},
          stream="bronze_ad_events", suite=True),
    # Statistics on what queries and Z-order filter by; the event_id is random, so min/max
    # statistics on it would skip nothing, where a Bloom filter per file skips the row
    # groups without the ids an insert looks for (sized to each file's ids, the smallest
    # of 16 sizes that holds them at 1% false positives: 1 KB for 200 rows, 32 KB for
    # 20,000, 260 KB for 200,000, at most 1 MB). Z-ordered for "one ad over a week".
    Table(name="silver.ad_events", kind="data",
          grain="one row per distinct valid event_id, typed, partitioned by event_date (UTC)",
          partitioned_by=("event_date",), zorder_by=("ad_id",),
          stats_columns=("event_time", "event_type", "ad_id", "ingested_at"),
          properties={"parquet.bloom.filter.enabled#event_id": "true",
                      "parquet.bloom.filter.adaptive.enabled": "true",
                      "parquet.bloom.filter.candidates.number#event_id": "16"},
          stream="silver_ad_events", polls_lake="always", suite=True),
    Table(name="silver.quarantine", kind="data",
          grain="one row per rejected record: raw text as in bronze, reason, detail, bronze "
                "metadata",
          partitioned_by=("ingest_date",), stats_columns=("reason", "ingested_at"),
          stream="silver_ad_events", suite=True),
    Table(name="silver.ad_campaigns", kind="reference",
          grain="one row per mapping version: ad_id, campaign_id, valid_from, valid_to "
                "(NULL while current)",
          stream="silver_ad_campaigns"),
    # Z-ordered for "one campaign over one day".
    Table(name="gold.campaign_stats", kind="data",
          grain="one row per campaign and event-time window (window_duration, 1 minute by "
                "default): views, clicks, purchases, revenue",
          zorder_by=("campaign_id", "window_start"),
          stream="gold_campaign_stats", windowed=True, polls_lake="always", suite=True),
    Table(name="gold.ad_attribution", kind="data",
          grain="one row per click matched to the latest view of the same user and ad at "
                "most attribution_max_gap (1 hour by default) before it",
          zorder_by=("ad_id", "click_time"),
          stream="gold_ad_attribution", windowed=True, trigger_setting="attribution_trigger",
          trigger_applies="longer", suite=True),
    Table(name="gold.user_sessions", kind="data",
          grain="one row per user session: a user's events at most session_gap (30 "
                "minutes by default) apart in event time, open until the watermark reaches "
                "its last event plus the gap",
          zorder_by=("user_id", "session_start"),
          stream="gold_user_sessions", windowed=True, trigger_setting="sessions_trigger",
          trigger_applies="longer", suite=True),
    Table(name="ops.alerts", kind="ops",
          grain="one row per click-fraud alert: an ip_address with more than "
                "alert_clicks_per_minute distinct valid clicks in one minute of event time, "
                "raised once",
          stream="ops_alerts", windowed=True, trigger_setting="alert_trigger",
          polls_lake="files"),
    Table(name="ops.late_data", kind="reference",
          grain="the late-data ledger: events that reached a layer after its watermark "
                "closed their window, per layer, date, window and batch"),
    Table(name="ops.gold_rebuilds", kind="ops",
          grain="one row per event date and silver version a reprocess rebuilt gold "
                "from"),
    Table(name="ops.maintenance_history", kind="ops",
          grain="one row per table and maintenance operation: files and bytes before and "
                "after, duration"),
    Table(name="ops.stream_progress", kind="ops",
          grain="one row per micro-batch of every stream: input records (bronze counts "
                "lines, not the files it reads whole; a join counts silver once, not once "
                "per side), rates in records per second, duration, watermark, state rows, "
                "timers fired, events counted late, the Delta source version read up to"),
    Table(name="quality.results", kind="ops",
          grain="one row per expectation evaluated in a validation run: suite, severity, "
                "outcome, unexpected count, observed sample, dates, Data Docs page"),
)


def of_kind(kind: Kind) -> dict[str, Table]:
    return {name: table for name, table in TABLES.items() if table.kind == kind}


def streams() -> list[Table]:
    """The table each stream is named after, in the order the streams start."""
    return [table for table in TABLES.values()
            if table.stream == table.name.replace(".", "_", 1)]


def trigger_of(settings: Settings, query_name: str, driver_trigger: str | None = None) -> str:
    """The trigger ``query_name`` keeps pace with continuously, in a driver whose streams
    trigger every ``driver_trigger`` (default ``trigger_interval``): what the heartbeat
    reports and Stream health judges the stream by. A stream on a setting of its own that
    applies where it reads Kafka takes it there, and the driver's otherwise, since a stream
    reading a table of the lake runs no more batches than the stream writing it commits (it
    polls the table sooner, ``poll_of``, which is what Spark runs it on). One whose own
    applies where it is longer takes the longer of the two."""
    from spark_jobs.config import interval_seconds

    table = next(table for table in streams() if table.stream == query_name)
    driver = driver_trigger or settings.trigger_interval
    if table.trigger_setting == "trigger_interval":
        return driver
    own = str(getattr(settings, table.trigger_setting))
    if table.trigger_applies == "longer":
        return max(driver, own, key=interval_seconds)
    return own if settings.source == "kafka" else driver


def poll_of(settings: Settings, query_name: str, driver_trigger: str | None = None) -> str:
    """The processing-time trigger Spark runs ``query_name`` on: its ``trigger_of``, or
    ``table_poll_interval`` where that is shorter and the stream polls a table of the lake
    (``polls_lake``). Such a stream still runs a batch only when the table it reads has a
    new commit, so its batches keep that writer's pace (``trigger_of`` stays what Stream
    health judges it by); looking more often starts each batch within a poll of the commit.
    On the driver's 5 s tick, a tick that came just before the commit found nothing and the
    batch waited for the next one, at every stage on the way to gold (make bench's latency
    trial at 3,750 events a second: ``campaign_stats`` started a batch every 10 s though
    each ran 4.9 s)."""
    from spark_jobs.config import interval_seconds

    table = next(table for table in streams() if table.stream == query_name)
    trigger = trigger_of(settings, query_name, driver_trigger)
    if table.polls_lake == "never" or (table.polls_lake == "files"
                                       and settings.source == "kafka"):
        return trigger
    return min(trigger, str(settings.table_poll_interval), key=interval_seconds)


def query_names(layer: str | None = None) -> tuple[str, ...]:
    """The streams' query names in start order, of one layer or of all."""
    return tuple(str(table.stream) for table in streams() if layer in (None, table.layer))


LAYERS: tuple[str, ...] = tuple(dict.fromkeys(table.layer for table in streams()))
# What a reprocess rebuilds from bronze, in this order.
REPROCESSED_LAYERS: tuple[str, ...] = ("silver", "gold")


def published(layers: tuple[str, ...] = LAYERS) -> tuple[str, ...]:
    """The data tables streams write under their own name, of ``layers``: the assets the
    DAGs declare they update (the streams: every layer; a reprocess: the layers it
    rebuilds). An update of silver's or gold's starts a validation."""
    return tuple(table.name for table in streams()
                 if table.kind == "data" and table.layer in layers)
