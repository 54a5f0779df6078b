"""The lakehouse in the Airflow UI: a stream health page and the latest quality report.

Both are served by a small FastAPI app mounted in Airflow's API server under
``/lakehouse`` and linked from the navigation bar (Browse). Airflow mounts a plugin's app
without its own authentication, so the app declares it: every route needs the login the
Airflow UI needs (the UI's JWT cookie or an API bearer token, checked by Airflow's own
security dependency), else 401.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import requires_access_view
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from lakehouse_airflow.timetables import NightlyDays
from lakehouse_airflow.views import latest_report, report_file, stream_health_page

app = FastAPI(title="Lakehouse",
              dependencies=[Depends(requires_access_view(AccessView.WEBSITE))])


@app.get("/health", response_class=HTMLResponse)
def health() -> str:
    return stream_health_page()


@app.get("/quality", response_model=None)
def quality() -> RedirectResponse | HTMLResponse:
    report = latest_report()
    if report is None:
        return HTMLResponse("<p>No data quality report yet: run the lakehouse_quality DAG "
                            "or <code>lakehouse validate</code>.</p>")
    # Served from reports/, so the report's relative links to its Data Docs resolve.
    return RedirectResponse(f"reports/{report.name}")


@app.get("/reports/{relative:path}", response_model=None)
def reports(relative: str) -> FileResponse | Response:
    path = report_file(relative)
    if path is None:
        raise HTTPException(status_code=404, detail=f"no report file {relative}")
    if isinstance(path, Path):
        return FileResponse(path)
    # A root on the object store: the file's bytes, as the store gives them.
    kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return Response(path.read_bytes(), media_type=kind)


class LakehousePlugin(AirflowPlugin):
    name = "lakehouse"
    timetables = [NightlyDays]
    fastapi_apps = [{"app": app, "url_prefix": "/lakehouse", "name": "Lakehouse"}]
    external_views = [
        {"name": "Stream health", "href": "lakehouse/health", "destination": "nav",
         "category": "browse", "url_route": "lakehouse-stream-health"},
        {"name": "Data quality report", "href": "lakehouse/quality", "destination": "nav",
         "category": "browse", "url_route": "lakehouse-quality"},
    ]
