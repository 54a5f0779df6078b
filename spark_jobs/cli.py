"""The ``lakehouse`` command: every verb takes ``--root``; bad arguments get one clear line.

Heavy imports (PySpark, Delta) happen inside the verbs, so ``lakehouse --help`` and
argument errors answer at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs import config, progress, storage
from spark_jobs.config import ConfigError, Settings, interval_seconds, parse_choices
from spark_jobs.demo import DEMO_TRIGGER
from spark_jobs.services import ServiceError

if TYPE_CHECKING:
    from spark_jobs.reprocess import Request

log = logging.getLogger("lakehouse")


class UsageError(Exception):
    """A bad argument or environment; printed as one line, exit status 2."""


# -- argument types --------------------------------------------------------------------


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value}")
    return value


def positive_number(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1: {text}")
    return value


def utc_datetime(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO-8601 time: {text!r}") from None
    return moment.replace(tzinfo=moment.tzinfo or UTC)


# -- verbs -----------------------------------------------------------------------------


def _writable_root(settings: Settings) -> Settings:
    root = settings.root
    try:
        storage.probe_writable(root)
    except OSError as error:
        raise UsageError(f"root {root} is not writable: {error.strerror or error}") from None
    return settings


def cmd_generate(settings: Settings, args: argparse.Namespace) -> int:
    from spark_jobs.generator import (
        EventSink,
        GenerateRequest,
        KafkaSink,
        Mess,
        generate,
        rules_of,
    )
    from spark_jobs.streaming import stop_on_signals

    mess_fields = Mess.__dataclass_fields__
    try:
        mess = dataclasses.replace(Mess.clean() if args.clean else Mess(),
                                   **{name: getattr(args, name) for name in mess_fields
                                      if getattr(args, name) is not None})
    except ValueError as error:
        raise UsageError(str(error)) from None
    request = GenerateRequest(
        events=args.events, seed=args.seed, start=args.start or datetime.now(UTC), mess=mess,
        events_per_file=args.events_per_file, rate=args.rate,
        span=timedelta(seconds=interval_seconds(args.span)) if args.span else timedelta(0),
        **rules_of(settings))
    sink: EventSink | None = None
    if args.to == "kafka":
        from spark_jobs import kafka_topic

        kafka_topic.ensure_topic(settings)
        sink = KafkaSink(kafka_topic.producer(settings), settings.kafka_topic)
    stop = stop_on_signals() if args.rate else None
    with progress.steps(progress.wanted()) as steps:
        counts = generate(request, settings.landing_events, settings.landing_campaigns,
                          settings.expected_counts_file,
                          should_stop=stop.is_set if stop else (lambda: False), steps=steps,
                          sink=sink)
    print(json.dumps({"generated": counts.as_json(),
                      "expected_counts_file": str(settings.expected_counts_file)}, indent=2))
    return 0


def cmd_stream(settings: Settings, args: argparse.Namespace) -> int:
    from spark_jobs import streaming
    from spark_jobs.ops.leases import LeaseHeld
    from spark_jobs.session import spark_session

    layers = streaming.parse_layers(args.layers)
    trigger = args.trigger or settings.trigger_interval
    config.interval_seconds(trigger)  # a bad --trigger fails before Spark starts
    stop = streaming.stop_on_signals()
    try:
        streaming.refuse_early(settings, layers)  # before the JVM: a refusal need not wait
        with spark_session(settings, f"lakehouse-stream-{'-'.join(layers)}") as spark:
            if args.available_now:
                streaming.run_available_now(spark, settings, layers)
            else:
                streaming.run_continuously(spark, settings, layers, trigger, stop)
    except (streaming.StreamFailed, LeaseHeld) as error:
        print(f"lakehouse stream: {error}", file=sys.stderr)
        return 1
    return 0


def cmd_stop(settings: Settings, args: argparse.Namespace) -> int:
    """Graceful stop for upgrades: every running stream stops at a batch boundary."""
    import time

    from spark_jobs.ops.leases import driver
    from spark_jobs.streaming import LAYERS, request_stop

    print(f"stop requested: {request_stop(settings)}")
    deadline = time.monotonic() + args.wait
    while True:
        running = {layer: who for layer in LAYERS if (who := driver(settings, layer))}
        if not running:
            print("no stream is running")
            return 0
        if time.monotonic() >= deadline:
            print(f"still running after {args.wait:g}s: {running}", file=sys.stderr)
            return 1
        time.sleep(1)


def cmd_services(settings: Settings, args: argparse.Namespace) -> int:
    from spark_jobs import services

    chosen = services.named(args.names)
    failed = False
    for service in chosen:
        try:
            print(getattr(service, args.action)(settings), flush=True)
        except services.ServiceError as error:
            print(f"lakehouse services: {error}", file=sys.stderr, flush=True)
            failed = True
    return 1 if failed else 0


def cmd_airflow(settings: Settings, args: argparse.Namespace) -> int:
    import os

    from spark_jobs.airflow_env import environment

    command = args.airflow_args[1:] if args.airflow_args[:1] == ["--"] else args.airflow_args
    env = environment(settings)
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    airflow = config.console_script("airflow")
    os.execve(airflow, [airflow, *command], env)
    return 0  # not reached


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from spark_jobs import demo

    # A trigger configured in the environment stays the streams' unless --trigger is given.
    trigger = args.trigger or os.environ.get("LAKEHOUSE_TRIGGER_INTERVAL") or DEMO_TRIGGER
    config.interval_seconds(trigger)  # a bad trigger fails before Airflow starts
    return demo.run(settings, demo.DemoOptions(port=args.port, rate=args.rate,
                                               trigger=trigger))


def cmd_audit(settings: Settings, args: argparse.Namespace) -> int:
    from spark_jobs.audit import account, render
    from spark_jobs.session import spark_session

    expected_file = None
    if args.expected is not None:
        expected_file = (storage.lake_path(args.expected) if args.expected
                         else settings.expected_counts_file)
        if not expected_file.resolve().is_relative_to(settings.root.resolve()):
            raise UsageError(f"--expected {args.expected} is outside the root {settings.root}: "
                             "name a file inside it")
        if not expected_file.exists():
            raise UsageError(f"no expected counts at {expected_file}: run lakehouse generate")
    with spark_session(settings, "lakehouse-audit") as spark:
        accounting = account(spark, settings, expected_file)
    print(json.dumps(accounting.as_json(), indent=2, default=str) if args.json
          else render(accounting))
    return 0 if accounting.identity_holds and accounting.matches_expected else 1


def cmd_chaos(settings: Settings, args: argparse.Namespace) -> int:
    from spark_jobs import chaos

    try:
        report = chaos.run(settings, chaos.ChaosOptions(faults=args.faults, seed=args.seed,
                                                        rate=args.rate,
                                                        under_fire=args.under_fire))
    except ValueError as error:
        raise UsageError(str(error)) from None
    except chaos.DriverFailed as error:
        print(f"lakehouse chaos: a stream failed for good: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.as_json(), indent=2, default=str))
    print(report.summary(), file=sys.stderr if args.json else sys.stdout)
    return 0 if report.ok else 1


def cmd_reprocess(settings: Settings, args: argparse.Namespace) -> int:
    """Rebuild what the arguments ask (``reprocess.run``) and print what changed."""
    from spark_jobs import reprocess
    from spark_jobs.session import spark_session_on_demand

    request = _reprocess_request(args)
    # Started on first use: a gold rebuild handed to the running stream driver, or a ledger
    # with nothing to repair, needs no Spark here at all.
    with (progress.steps(progress.wanted(args.json)) as steps,
          spark_session_on_demand(settings, "lakehouse-reprocess") as spark):
        result = reprocess.run(spark, settings, request, steps)
    for note in result.notes:
        print(note, file=sys.stderr)
    if args.json:
        print(json.dumps(result.as_json(), indent=2))
    elif result.changes:
        print(result.render())
    return 0


def _reprocess_request(args: argparse.Namespace) -> Request:
    """The ``reprocess`` arguments as a request; a combination it cannot carry out is a
    UsageError."""
    from spark_jobs import reasons, reprocess
    from spark_jobs.dates import DateRange, DateRangeError

    ranged = args.first is not None or args.last is not None
    # --late may follow a range: a nightly run rebuilds its day, then the ledger's dates.
    if sum([ranged, args.quarantine, args.late and not ranged]) != 1:
        raise UsageError("give one of: --from and --to (optionally with --late), "
                         "--quarantine, --late")
    if ranged and (args.first is None or args.last is None):
        raise UsageError("--from and --to go together")
    if args.reason and not args.quarantine:
        raise UsageError("--reason only applies to --quarantine")
    if args.reason and args.reason not in reasons.PRECEDENCE:
        raise UsageError(f"unknown reason {args.reason!r}: one of "
                         f"{', '.join(reasons.PRECEDENCE)}")
    try:
        layers = reprocess.parse_layers(args.layers)
        days = DateRange.parse(args.first, args.last) if ranged else None
    except (reprocess.ReprocessError, DateRangeError) as error:
        raise UsageError(str(error)) from None
    return reprocess.Request(tuple(layers), days, quarantine=args.quarantine,
                             reason=args.reason, late=args.late, dry_run=args.dry_run)


def cmd_maintain(settings: Settings, args: argparse.Namespace) -> int:
    from datetime import timedelta

    from spark_jobs import maintenance
    from spark_jobs.session import spark_session

    tables = maintenance.parse_tables(args.tables)
    retention = (timedelta(seconds=config.interval_seconds(args.retention))
                 if args.retention else None)
    both = not args.optimize and not args.vacuum
    with (progress.steps(progress.wanted(args.json)) as steps,
          spark_session(settings, "lakehouse-maintain") as spark):
        try:
            outcomes = maintenance.maintain(
                spark, settings, tables, run_optimize=args.optimize or both,
                run_vacuum=args.vacuum or both, retention=retention, dry_run=args.dry_run,
                steps=steps)
        except maintenance.MaintenanceError as error:
            raise UsageError(str(error)) from None
    print(json.dumps([o.as_json() for o in outcomes], indent=2, default=str) if args.json
          else maintenance.render(outcomes))
    return 0


def cmd_reset(settings: Settings, args: argparse.Namespace) -> int:
    """The runbook for a change a stream's checkpoint cannot carry (``spark_jobs.reset``)."""
    from dataclasses import asdict

    from spark_jobs import reset, streaming
    from spark_jobs.ops.leases import LeaseHeld
    from spark_jobs.session import spark_session

    reset.layers_reset_by(args.layer)  # a layer it cannot reset fails before Spark starts
    with spark_session(settings, f"lakehouse-reset-{args.layer}") as spark:
        try:
            outcome = reset.reset(spark, settings, args.layer)
        except (LeaseHeld, streaming.StreamFailed) as error:
            print(f"lakehouse reset: {error}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(asdict(outcome), indent=2))
    else:
        dates = (f", gold rebuilt for {outcome.event_dates[0]} to {outcome.event_dates[1]}"
                 if outcome.event_dates else "")
        print(f"reset {', '.join(outcome.layers)} in {outcome.seconds:g} s{dates}")
        for table, rows in outcome.rows.items():
            print(f"  {table}: {rows:,} rows")
    return 0


def cmd_validate(settings: Settings, args: argparse.Namespace) -> int:
    from spark_jobs.dates import DateRange, DateRangeError
    from spark_jobs.quality import report, suites, validate
    from spark_jobs.session import spark_session

    tables = parse_choices(args.tables, suites.available(settings), "table(s)")
    if (args.first is None) != (args.last is None):
        raise UsageError("--from and --to go together")
    try:
        days = (DateRange.parse(args.first, args.last)
                if args.first is not None else None)
    except DateRangeError as error:
        raise UsageError(str(error)) from None
    with (progress.steps(progress.wanted(args.json)) as steps,
          spark_session(settings, "lakehouse-validate") as spark):
        run = validate.validate(spark, settings, tables, days and days.first,
                                days and days.last, steps=steps)
        page = None
        if not args.no_report:
            steps.start("writing the data quality report")
            measures = report.measure(spark, settings, run)
            page = report.write(settings, report.render(measures, run), measures.generated_at)
    docs = settings.reports_dir / "data_docs" / "index.html"
    if args.json:
        print(json.dumps({**run.as_json(), "report": page and str(page),
                          "data_docs": str(docs)}, indent=2))
    else:
        for verdict in run.verdicts:
            print(verdict.summary())
        if page is not None:
            print(f"report: {page}")
        print(f"Data Docs: {docs}")
    if not run.passed:
        print("validation FAILED: a critical expectation failed (see above)", file=sys.stderr)
    return 0 if run.passed else 1


def cmd_sql(settings: Settings, args: argparse.Namespace) -> int:
    """Print every row the query returns, up to ``--limit``, as a text table or JSON.

    The rows are fetched once and printed from that one result: ``show`` after ``collect``
    ran the query twice and sized the printout by the first run's row count, which the
    live streams can make differ from the second run's.
    """
    from decimal import Decimal

    from pyspark.sql import Row

    from spark_jobs.session import spark_session
    from spark_jobs.tables import register_existing

    with spark_session(settings, "lakehouse-sql") as spark:
        try:
            register_existing(spark, settings)
            result = spark.sql(args.query)
            columns = result.columns
            # One row beyond the limit says whether the limit cut any, without counting.
            rows = result.collect() if args.limit == 0 else result.take(args.limit + 1)
        except Exception as error:  # an analysis error is the user's query, not a crash
            if type(error).__name__ in ("AnalysisException", "ParseException"):
                raise UsageError(str(error).splitlines()[0]) from None
            raise
    cut = 0 < args.limit < len(rows)
    rows = rows[:args.limit] if cut else rows

    if args.json:
        print(json.dumps([row.asDict(recursive=True) for row in rows], default=str))
    else:
        def text(value: object) -> str:
            if value is None:
                return "NULL"
            if isinstance(value, bool):
                return str(value).lower()
            if isinstance(value, Row):
                return json.dumps(value.asDict(recursive=True), default=str)
            if isinstance(value, list | dict):
                return json.dumps(value, default=str)
            return str(value).replace("\n", "\\n")

        def numeric(value: object) -> bool:
            return isinstance(value, int | float | Decimal) and not isinstance(value, bool)

        cells = [[text(value) for value in row] for row in rows]
        widths = [max([len(name), *(len(line[i]) for line in cells)])
                  for i, name in enumerate(columns)]
        print(" | ".join(name.ljust(width) for name, width in zip(columns, widths,
                                                                   strict=True)).rstrip())
        print("-+-".join("-" * width for width in widths))
        for row, line in zip(rows, cells, strict=True):
            print(" | ".join(cell.rjust(width) if numeric(value) else cell.ljust(width)
                             for value, cell, width in zip(row, line, widths, strict=True)
                             ).rstrip())
        print(f"({len(rows)} row{'' if len(rows) == 1 else 's'})")
    if cut:
        # Beside JSON on stdout, the note goes to stderr, so the output stays parseable.
        print(f"(only the first {args.limit} rows: the query returns more; "
              f"--limit N to see more, --limit 0 for all)",
              file=sys.stderr if args.json else sys.stdout)
    return 0


# -- parser ----------------------------------------------------------------------------


class OneLineParser(argparse.ArgumentParser):
    """Argument errors as one line (the usage is one ``--help`` away), exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="lakehouse", description="Streaming lakehouse of ad events (bronze, silver, gold).")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB",
                                  parser_class=OneLineParser)

    def verb(name: str, handler: Callable[[Settings, argparse.Namespace], int],
             help_text: str) -> argparse.ArgumentParser:
        sub = verbs.add_parser(name, help=help_text, description=help_text)
        # Text, not a Path: a Path would fold "s3a://b" into "s3a:/b", which then passes for
        # a local folder; the configuration decides what a root may be.
        sub.add_argument("--root",
                         help="lakehouse root folder (default: configuration 'root')")
        sub.set_defaults(handler=handler)
        return sub

    generate = verb("generate", cmd_generate,
                    "write messy ad events and the campaign mapping to the landing zone")
    generate.add_argument("--events", type=non_negative_int, default=10_000,
                          help="number of records (default 10000)")
    generate.add_argument("--seed", type=int, default=1, help="random seed (deterministic)")
    generate.add_argument("--start", type=utc_datetime,
                          help="'now' of the generated events (default: the clock)")
    generate.add_argument("--events-per-file", type=non_negative_int, default=5000)
    generate.add_argument("--span", help="spread event times over this interval ending at "
                          "--start, e.g. '1 day' (default: all at --start)")
    generate.add_argument("--rate", type=positive_number,
                          help="events per second, generated until interrupted")
    generate.add_argument("--clean", action="store_true",
                          help="no mess: every share below is 0 unless given")
    from spark_jobs.generator import Mess
    for name, mess_field in Mess.__dataclass_fields__.items():
        generate.add_argument(f"--{name.replace('_', '-')}", type=share, dest=name,
                              help=f"share (default {mess_field.default})")

    generate.add_argument("--to", choices=("landing", "kafka"), default="landing",
                          help="where the events go: the landing zone's files (default) or "
                          "the Kafka topic (kafka_topic at kafka_bootstrap_servers)")

    services = verb("services", cmd_services,
                    "start, stop or show the real services beside the lakehouse (a Kafka "
                    "broker, a Spark standalone master and worker, PostgreSQL, an S3-compatible "
                    "server), on loopback, data and logs under <root>/services")
    services.add_argument("action", choices=("start", "stop", "status"))
    services.add_argument("names", nargs="+", metavar="NAME", help="kafka, spark, postgres, s3")

    stream = verb("stream", cmd_stream, "run the streaming layers")
    stream.add_argument("--layers", help="comma-separated layers, or all (default)")
    stream.add_argument("--available-now", action="store_true",
                        help="process everything present, then exit")
    stream.add_argument("--trigger",
                        help="micro-batch interval, e.g. 5s (continuous mode); the streams "
                             "reading a table of the lake look for its commits every "
                             "table_poll_interval where that is shorter")

    stop = verb("stop", cmd_stop,
                "stop every running stream of the root at a batch boundary (for upgrades)")
    stop.add_argument("--wait", type=float, default=300.0,
                      help="seconds to wait for the streams to exit (default 300)")

    airflow = verb("airflow", cmd_airflow,
                   "run an airflow command in the lakehouse's Airflow environment, e.g. "
                   "'lakehouse airflow standalone'")
    airflow.add_argument("airflow_args", nargs=argparse.REMAINDER,
                         help="the airflow command and its arguments")

    demo = verb("demo", cmd_demo,
                "airflow standalone with the DAGs unpaused, a live feed of messy events and the "
                "streams running; Ctrl-C stops everything cleanly")
    demo.add_argument("--port", type=int, default=8080, help="Airflow UI port (default 8080)")
    demo.add_argument("--rate", type=positive_number, default=20.0,
                      help="events per second of the demo feed (default 20)")
    demo.add_argument("--trigger",
                      help=f"micro-batch interval of the streams (default: "
                           f"LAKEHOUSE_TRIGGER_INTERVAL if set, else {DEMO_TRIGGER}: a "
                           "micro-batch costs seconds whatever its size, and back-to-back "
                           "batches would leave Airflow's own jobs no core on a laptop)")

    audit = verb("audit", cmd_audit,
                 "account for every bronze record: silver, quarantine or duplicate")
    audit.add_argument("--json", action="store_true", help="the accounting as JSON")
    audit.add_argument("--expected", nargs="?", const="", metavar="FILE",
                       help="also compare with the generator's expected counts "
                            "(default file: <root>/landing/expected_counts.json)")

    chaos = verb("chaos", cmd_chaos,
                 "SIGKILL the streams again and again while events land, then prove nothing "
                 "was lost or duplicated (needs an empty --root)")
    chaos.add_argument("--faults", type=positive_int, default=20,
                       help="how many times to kill the streaming driver (default 20)")
    chaos.add_argument("--seed", type=int, default=1, help="random seed of the feed and kills")
    chaos.add_argument("--rate", type=positive_number, default=100.0,
                       help="events per second of the feed (default 100)")
    chaos.add_argument("--under-fire", action=argparse.BooleanOptionalAction, default=True,
                       help="maintenance (OPTIMIZE, VACUUM at the shortest retention allowed) "
                            "and reprocessing of today and yesterday in a loop beside the "
                            "kills (default: on)")
    chaos.add_argument("--json", action="store_true", help="the report as JSON")

    rebuild = verb("reprocess", cmd_reprocess,
                   "rebuild event dates of silver and gold from bronze, idempotently")
    rebuild.add_argument("--from", dest="first", metavar="YYYY-MM-DD",
                         help="first event date to rebuild (UTC)")
    rebuild.add_argument("--to", dest="last", metavar="YYYY-MM-DD",
                         help="last event date to rebuild, included")
    rebuild.add_argument("--layers", help="silver,gold (default: both)")
    rebuild.add_argument("--quarantine", action="store_true",
                         help="re-validate quarantined records; move those that now pass")
    rebuild.add_argument("--reason", help="with --quarantine: only records of this reason")
    rebuild.add_argument("--late", action=argparse.BooleanOptionalAction, default=False,
                         help="rebuild the dates the late-data ledger lists as unrepaired (after "
                              "--from..--to when given)")
    rebuild.add_argument("--dry-run", action="store_true",
                         help="print what would change, write nothing")
    rebuild.add_argument("--json", action="store_true", help="the changes as JSON")

    maintain = verb("maintain", cmd_maintain,
                    "compact, cluster and vacuum tables, safely beside the live streams")
    maintain.add_argument("--tables", help="comma-separated table names (default: all)")
    maintain.add_argument("--optimize", action="store_true",
                          help="bin-packing and Z-ordering (default: with --vacuum, both)")
    maintain.add_argument("--vacuum", action="store_true",
                          help="delete unreferenced files older than the retention")
    maintain.add_argument("--retention", help="VACUUM retention, e.g. '10 days' (default and "
                          "minimum: time-travel window or longest stream lag plus margin)")
    maintain.add_argument("--dry-run", action="store_true", help="measure, change nothing")
    maintain.add_argument("--json", action="store_true", help="the figures as JSON")

    reset_verb = verb("reset", cmd_reset,
                      "rebuild a layer from its sources under the logic now configured, "
                      "after a change its streams' checkpoints cannot carry")
    reset_verb.add_argument("layer", metavar="LAYER",
                            help="silver (rebuilds gold too), gold, or ops (the alert stream)")
    reset_verb.add_argument("--json", action="store_true", help="the outcome as JSON")

    check = verb("validate", cmd_validate,
                 "validate table snapshots with the Great Expectations suites; exit 1 on a "
                 "critical failure")
    check.add_argument("--tables", help="comma-separated tables (default: every suite)")
    check.add_argument("--from", dest="first", metavar="YYYY-MM-DD",
                       help="first date to validate (default: whole tables)")
    check.add_argument("--to", dest="last", metavar="YYYY-MM-DD", help="last date, included")
    check.add_argument("--no-report", action="store_true",
                       help="skip the HTML data quality report")
    check.add_argument("--json", action="store_true",
                       help="each table's verdict and failed expectations as JSON")

    sql = verb("sql", cmd_sql, "run SQL over the tables by name, e.g. bronze.ad_events, and "
               "print the rows it returns as a text table")
    sql.add_argument("query")
    sql.add_argument("--limit", type=non_negative_int, default=1000, metavar="N",
                     help="print at most N rows (default 1000; 0: all); a last line says "
                          "when the limit cut rows")
    sql.add_argument("--json", action="store_true", help="rows as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    overrides: dict[str, Any] = {"root": args.root}
    try:
        settings = _writable_root(config.load(overrides))
        return args.handler(settings, args)
    except (UsageError, ConfigError) as error:
        print(f"lakehouse {args.verb}: {error}", file=sys.stderr)
        return 2
    except ServiceError as error:  # a service the verb needs does not answer
        print(f"lakehouse {args.verb}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
