"""`lakehouse services` without starting anything: its answers to what it cannot do. (The
services themselves run in the Kafka, cluster and Airflow tests.)"""

import base64
import os
import stat
import subprocess
import sys

import pytest

from spark_jobs import services
from tests.conftest import make_settings
from tests.processes import run_lakehouse


def test_status_of_services_never_started_is_one_line_each(tmp_path) -> None:
    status = run_lakehouse("services", "status", "kafka", "spark", "postgres", "--root",
                           str(tmp_path))
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines() == ["kafka: stopped", "spark: stopped",
                                          "postgres: stopped"]


def test_unknown_services_and_a_remote_broker_are_refused_by_name(tmp_path) -> None:
    unknown = run_lakehouse("services", "start", "zookeeper", "--root", str(tmp_path))
    assert unknown.returncode == 2
    assert "unknown service zookeeper: choose from kafka, spark, postgres, s3" in unknown.stderr
    # The services command runs a broker here, on loopback; it does not pretend to start
    # one on another machine.
    remote = run_lakehouse("services", "start", "kafka", "--root", str(tmp_path),
                           env={"LAKEHOUSE_KAFKA_BOOTSTRAP_SERVERS": "broker.example:9092"})
    assert remote.returncode == 2 and "names another machine" in remote.stderr
    assert not (tmp_path / "services").exists()


def test_a_pid_file_naming_another_program_names_no_service(tmp_path) -> None:
    daemon = services.SERVICES["kafka"].daemons(make_settings(tmp_path))[0]
    daemon.folder.mkdir(parents=True)
    # A stale pid file whose number now belongs to another program (this test's process,
    # which started at another time): the service is stopped, and stop does not signal it.
    daemon.pid_file.write_text(f"{os.getpid()} 1\n")
    assert daemon.pid() is None
    assert not daemon.stop()
    assert not daemon.pid_file.exists()


def test_the_spark_daemons_settings_check_the_airflow_login_and_keep_its_key_private(
        tmp_path) -> None:
    # What the Docker stack's Spark containers run before their daemon (and what `lakehouse
    # services start spark` writes): the login's key, as Spark's filter wants it.
    key = "k" * 64
    written = tmp_path / "spark-daemons.conf"
    made = subprocess.run([sys.executable, "-m", "spark_jobs.services", "spark-properties",
                           str(written)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AIRFLOW__API_AUTH__JWT_SECRET": key,
                               "LAKEHOUSE_ROOT": str(tmp_path / "lake")})
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    properties = dict(line.split(" ", 1) for line in written.read_text().splitlines())
    assert properties["spark.ui.filters"] == "org.apache.spark.ui.JWSFilter"
    assert base64.urlsafe_b64decode(properties[
        "spark.org.apache.spark.ui.JWSFilter.param.secretKey"]).decode() == key
    assert properties["spark.master.rest.enabled"] == "false"
    # A key too short for the tokens' HMAC is refused by name, before any daemon starts.
    short = subprocess.run([sys.executable, "-m", "spark_jobs.services", "spark-properties",
                            str(tmp_path / "other.conf")], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "AIRFLOW__API_AUTH__JWT_SECRET": "short",
                                            "LAKEHOUSE_ROOT": str(tmp_path / "lake")})
    assert short.returncode == 1
    assert "AIRFLOW__API_AUTH__JWT_SECRET is 5 bytes" in short.stderr
    assert not (tmp_path / "other.conf").exists()
    # (64 bytes, not 32: Spark's check refuses to verify HS512, Airflow's signature, with a
    # shorter key, and would answer 403 to every token.)
    assert services.LOGIN_SECRET_MIN_BYTES == 64


def test_without_a_key_given_the_login_key_is_made_once_under_the_root(tmp_path,
                                                                       monkeypatch) -> None:
    settings = make_settings(tmp_path)
    first = services.login_secret(settings, env={})
    assert len(first) >= services.LOGIN_SECRET_MIN_BYTES
    assert services.login_secret(settings, env={}) == first
    made = services.login_secret_file(settings)
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    assert [path.name for path in made.parent.iterdir()] == [made.name]  # no draft left
    # A daemon started here (a Spark worker, whose executors inherit its environment) does
    # not get the key, even from a process that holds it.
    monkeypatch.setenv(services.LOGIN_SECRET_VARIABLE, first)
    assert services.LOGIN_SECRET_VARIABLE not in services._daemon_environment({"A": "1"})
    # A torn or emptied key file is refused by name, not used as an empty key.
    made.write_text("\n")
    with pytest.raises(services.ServiceError, match="holds no usable login key"):
        services.login_secret(settings, env={})
