"""The lakehouse pages in the Airflow UI, served from the project's own data.

``stream_health_page`` renders, per stream, its last batch time, input and processed rates,
watermark, state rows and late rows from ``ops.stream_progress``, ``ops.late_data`` and the
drivers' heartbeats; ``latest_report`` finds the newest data quality report. The tables are
read with ``deltalake`` (delta-rs): no Spark in the API server.
"""

from __future__ import annotations

import html
from pathlib import Path

from spark_jobs import config
from spark_jobs.config import Settings
from spark_jobs.ops import heartbeat

PROGRESS_TABLE = "ops/stream_progress"
LATE_TABLE = "ops/late_data"
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #1b1f24; }
table { border-collapse: collapse; width: 100%; font-size: 0.9rem; }
th, td { padding: 0.35rem 0.6rem; border-bottom: 1px solid #d0d7de; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.bad { color: #b42318; font-weight: 600; } .ok { color: #067647; }
"""


def _table_rows(settings: Settings, relative: str) -> list[dict]:
    from deltalake import DeltaTable

    path = settings.table_path(relative)
    if not (Path(path) / "_delta_log").exists():
        return []
    return DeltaTable(path).to_pandas().to_dict("records")


def stream_health(settings: Settings) -> list[dict[str, object]]:
    """One entry per stream: its latest micro-batch, and the late rows it could not take."""
    latest: dict[str, dict] = {}
    for row in _table_rows(settings, PROGRESS_TABLE):
        seen = latest.get(row["query_name"])
        if seen is None or row["batch_at"] > seen["batch_at"]:
            latest[row["query_name"]] = row
    late: dict[str, int] = {}
    for row in _table_rows(settings, LATE_TABLE):
        query = "gold_" + row["layer"].split(".", 1)[1]
        late[query] = late.get(query, 0) + int(row["late_rows"])
    return [{"stream": name, "last_batch_at": row["batch_at"], "batch_id": row["batch_id"],
             "input_rows_per_second": row["input_rows_per_second"],
             "processed_rows_per_second": row["processed_rows_per_second"],
             "watermark": row["watermark"], "state_rows": row["state_rows"],
             "rows_dropped_by_watermark": row["rows_dropped_by_watermark"],
             "late_rows": late.get(name, 0)}
            for name, row in sorted(latest.items())]


def _cell(value: object) -> str:
    if value is None or value != value:  # None or NaN/NaT
        return "–"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return html.escape(str(value))


def stream_health_page(settings: Settings | None = None) -> str:
    settings = settings or config.load()
    verdict = heartbeat.health(settings)
    status = ("<p class='bad'>" + "<br>".join(html.escape(p) for p in verdict.problems)
              + "</p>") if verdict.problems else (
        "<p class='ok'>streams running and making progress</p>" if verdict.running
        else "<p>no continuous stream is running</p>")
    columns = ["stream", "last_batch_at", "batch_id", "input_rows_per_second",
               "processed_rows_per_second", "watermark", "state_rows",
               "rows_dropped_by_watermark", "late_rows"]
    rows = "".join("<tr>" + "".join(f"<td>{_cell(entry[c])}</td>" for c in columns) + "</tr>"
                   for entry in stream_health(settings))
    header = "".join(f"<th>{c.replace('_', ' ')}</th>" for c in columns)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Stream health</title>"
            f"<style>{STYLE}</style></head><body><h1>Stream health</h1>"
            f"<p>root: {html.escape(str(settings.root))}</p>{status}"
            f"<table><thead><tr>{header}</tr></thead><tbody>{rows}</tbody></table>"
            f"</body></html>")


def latest_report(settings: Settings | None = None) -> Path | None:
    settings = settings or config.load()
    reports = sorted(settings.reports_dir.glob("quality-*.html"))
    return reports[-1] if reports else None


def report_file(relative: str, settings: Settings | None = None) -> Path | None:
    """A file of the reports folder (the report, its Data Docs), never one outside it."""
    settings = settings or config.load()
    folder = settings.reports_dir.resolve()
    path = (folder / relative).resolve()
    return path if path.is_relative_to(folder) and path.is_file() else None
