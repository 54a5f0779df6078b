"""The pipeline on a real Spark standalone cluster, started by the project's own command
(``lakehouse services start spark``: a master and a worker), against local mode over the
same input: every table of bronze, silver and gold the same."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from spark_jobs import registry, streaming
from spark_jobs.services import (
    SPARK_MASTER_PORT,
    SPARK_MASTER_UI_PORT,
    SPARK_WORKER_UI_PORT,
    login_secret_file,
)
from tests.conftest import cli_env, make_settings
from tests.processes import generate, run_lakehouse

pytestmark = pytest.mark.integration

MASTER = f"spark://127.0.0.1:{SPARK_MASTER_PORT}"
# Set by the run, not by the input: when a record was ingested or quarantined.
PROCESSING_TIME_COLUMNS = {"ingested_at", "ingest_date", "quarantined_at"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("spark-services")
    started = run_lakehouse("services", "start", "spark", "--root", str(root))
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("spark: started, master spark://127.0.0.1:7077"), started
    yield root
    stopped = run_lakehouse("services", "stop", "spark", "--root", str(root))
    assert stopped.returncode == 0, stopped.stderr


def airflow_token(secret: str, valid_for: float = 60) -> str:
    """A token as Airflow's login makes one (its own generator: HS512 over the
    ``[api_auth] jwt_secret`` text, an audience, an expiry)."""
    from airflow.api_fastapi.auth.tokens import JWTGenerator

    return JWTGenerator(secret_key=secret, valid_for=valid_for, algorithm="HS512",
                        audience="apache-airflow").generate({"sub": "admin"})


def the_login_of(root: Path) -> str:
    return login_secret_file(make_settings(root)).read_text().strip()


def page(port: int, path: str, token: str | None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as refused:
        return refused.code, b""


def applications_run_by_master(cluster: Path) -> list[str]:
    status, body = page(SPARK_MASTER_UI_PORT, "/json/", airflow_token(the_login_of(cluster)))
    assert status == 200, status
    state = json.loads(body)
    return [app["name"] for app in state["activeapps"] + state["completedapps"]]


def comparable(spark, lake: Path, table: registry.Table):
    """The table's rows without the columns a run sets, and with its lake's path (part of a
    file's delivery id) taken out."""
    rows = spark.read.format("delta").load(str(lake / "tables" / table.relative_path))
    return rows.select(*[
        F.regexp_replace(column, str(lake), "<lake>").alias(column)
        if dtype == "string" else F.col(column)
        for column, dtype in rows.dtypes if column not in PROCESSING_TIME_COLUMNS])


@pytest.fixture(scope="module")
def lakes(spark, cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same messy landing zone streamed through every layer in local mode and on the
    cluster."""
    base = tmp_path_factory.mktemp("lakes")
    generate(base / "source", "--events", "1500", "--events-per-file", "500", "--span",
             "2 hours", "--seed", "41")
    lakes = {"local": base / "local", "cluster": base / "cluster"}
    for lake in lakes.values():
        shutil.copytree(base / "source" / "landing", lake / "landing")
    # Local mode in this process's session (a driver's start spared), the cluster as a user
    # runs it.
    streaming.run_available_now(spark, make_settings(lakes["local"]),
                                streaming.parse_layers(None))
    on_cluster = run_lakehouse("stream", "--root", str(lakes["cluster"]), "--available-now",
                               env={"LAKEHOUSE_SPARK_MASTER": MASTER})
    assert on_cluster.returncode == 0, on_cluster.stderr[-3000:]
    assert "lakehouse-stream-bronze-silver-gold-ops" in applications_run_by_master(cluster)
    return lakes


def test_the_pipeline_on_the_cluster_equals_local_mode_table_by_table(spark, lakes) -> None:
    for table in registry.TABLES.values():
        if table.layer not in ("bronze", "silver", "gold"):
            continue  # ops and quality record the runs themselves: times, durations
        local = comparable(spark, lakes["local"], table)
        clustered = comparable(spark, lakes["cluster"], table)
        assert local.count() > 0, table.name
        assert local.exceptAll(clustered).count() == 0, table.name
        assert clustered.exceptAll(local).count() == 0, table.name


EXECUTOR_IMPORT = """
import json
import sys
from spark_jobs import config
from spark_jobs.session import spark_session

def where(_):
    import spark_jobs
    return spark_jobs.__file__, sys.executable

with spark_session(config.load(), "lakehouse-shipped-code") as spark:
    print(json.dumps(spark.sparkContext.parallelize([0], 1).map(where).first()))
"""


def test_executors_import_the_code_the_driver_ships_with_its_interpreter(cluster,
                                                                         tmp_path) -> None:
    ran = subprocess.run([sys.executable, "-c", EXECUTOR_IMPORT], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300,
                         env=cli_env(LAKEHOUSE_SPARK_MASTER=MASTER,
                                     LAKEHOUSE_ROOT=str(tmp_path / "lake")))
    assert ran.returncode == 0, ran.stderr[-3000:]
    module_file, python = json.loads(ran.stdout.strip().splitlines()[-1])
    # The executor imported spark_jobs from the zip spark-submit shipped (not from the
    # checkout, which a cluster node does not have), with the driver's interpreter.
    assert "/spark_jobs-" in module_file and ".zip" in module_file, module_file
    assert python == sys.executable


def test_an_airflow_job_submits_to_the_cluster_with_the_code_and_jars(
        cluster, lakes, monkeypatch) -> None:
    from lakehouse_airflow.jobs import lakehouse_job
    from spark_jobs import config
    from spark_jobs.airflow_env import environment

    lake = lakes["cluster"]
    # The worker's environment as `lakehouse airflow` makes it: the lakehouse_spark
    # connection points at the configured master.
    monkeypatch.setenv("LAKEHOUSE_SPARK_MASTER", MASTER)
    monkeypatch.setenv("LAKEHOUSE_ROOT", str(lake))
    for key, value in environment(config.load()).items():
        monkeypatch.setenv(key, value)
    # The quality DAG's job: its driver imports the project from the zip spark-submit puts
    # first on its path, and must still find the suites, the jars and the report's
    # templates there.
    job = lakehouse_job("cluster_validate", "validate", "--root", str(lake))
    job.resolve()
    assert job.py_files and job.py_files.endswith(".zip")
    assert all(jar.endswith(".jar") for jar in job.jars.split(","))
    job.execute(context={})
    assert "lakehouse-cluster_validate" in applications_run_by_master(cluster)
    assert list((lake / "reports").glob("quality-*.html"))


def test_the_daemons_pages_open_only_to_a_token_of_the_airflow_login(cluster) -> None:
    # The services root's login key, which `lakehouse airflow` on that root signs its
    # logins' tokens with (AIRFLOW__API_AUTH__JWT_SECRET).
    login = the_login_of(cluster)
    from spark_jobs import config
    from spark_jobs.airflow_env import environment

    assert environment(config.load({"root": cluster}, environ={}), base={})[
        "AIRFLOW__API_AUTH__JWT_SECRET"] == login
    for port in (SPARK_MASTER_UI_PORT, SPARK_WORKER_UI_PORT):
        for refused in (None, airflow_token(secrets.token_urlsafe(64)),  # no login, forged
                        airflow_token(login, valid_for=-5), "not-a-token"):  # expired, junk
            assert page(port, "/", refused)[0] == 403, (port, refused)
        status, body = page(port, "/", airflow_token(login))
        assert status == 200 and b"Spark" in body, port
