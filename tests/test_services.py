"""`lakehouse services` without starting anything: its answers to what it cannot do. (The
services themselves run in the Kafka, cluster and Airflow tests.)"""

import os

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
    assert "unknown service zookeeper: choose from kafka, spark, postgres" in unknown.stderr
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
