"""docker/: the compose file is checked by a Compose client without an engine (Debian's
docker-compose validates a file against Compose's schema and resolves it); nothing here
builds or runs an image."""

import subprocess
from pathlib import Path

import yaml

from spark_jobs.config import PROJECT_DIR

COMPOSE = PROJECT_DIR / "docker" / "compose.yaml"
SECRETS = {"POSTGRES_PASSWORD": "p", "AIRFLOW_JWT_SECRET": "j", "AIRFLOW_SECRET_KEY": "k",
           "AIRFLOW_FERNET_KEY": "f"}
AIRFLOW_PARTS = {"airflow-init", "airflow-apiserver", "airflow-scheduler",
                 "airflow-dag-processor"}
ONE_SHOTS = {"kafka-topic", "airflow-init"}
SPARK_DAEMONS = {"spark-master", "spark-worker-1", "spark-worker-2"}


def compose_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker-compose", "-p", "lakehouse", "-f", str(COMPOSE), "config"],
                          env={"PATH": "/usr/bin:/bin", **env}, capture_output=True,
                          text=True, timeout=60, cwd=PROJECT_DIR)


def test_the_stack_is_a_valid_compose_file_with_every_part_and_health_checks() -> None:
    resolved = compose_config(SECRETS)
    assert resolved.returncode == 0, resolved.stderr
    services = yaml.safe_load(resolved.stdout)["services"]
    assert set(services) == {"postgres", "kafka", "kafka-topic", "spark-master",
                             "spark-worker-1", "spark-worker-2", "airflow-init",
                             "airflow-apiserver", "airflow-scheduler",
                             "airflow-dag-processor", "feed"}
    # Every long-running part says when it is healthy; the one-shots run to completion
    # before what needs them starts.
    for name, service in services.items():
        if name not in ONE_SHOTS | {"feed"}:
            assert "healthcheck" in service, name
    assert services["airflow-scheduler"]["depends_on"]["airflow-init"] == {
        "condition": "service_completed_successfully"}
    # The lakehouse reads Kafka and runs its jobs on the cluster, with Airflow on PostgreSQL.
    scheduler = services["airflow-scheduler"]["environment"]
    assert scheduler["LAKEHOUSE_SOURCE"] == "kafka"
    assert scheduler["LAKEHOUSE_SPARK_MASTER"] == "spark://spark-master:7077"
    assert scheduler["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
    # Airflow's secrets go to Airflow's parts only; the Spark daemons get the login's key
    # alone, to check the tokens their pages are opened with; the feed gets none.
    for name, service in services.items():
        environment = service.get("environment", {})
        holds = {key for key in environment if "SECRET" in key or "FERNET" in key
                 or "SQL_ALCHEMY_CONN" in key}
        if name in SPARK_DAEMONS:
            assert holds == {"AIRFLOW__API_AUTH__JWT_SECRET"}, (name, holds)
            assert environment["AIRFLOW__API_AUTH__JWT_SECRET"] == SECRETS["AIRFLOW_JWT_SECRET"]
            # Their settings are the project's, written where the daemon reads them.
            start = " ".join(service["entrypoint"])
            assert ("spark_jobs.services spark-properties /tmp/spark-daemons.conf" in start
                    and "--properties-file /tmp/spark-daemons.conf" in start), start
            # ... and the daemon runs without the key, which its executors would inherit.
            assert "exec env -u AIRFLOW__API_AUTH__JWT_SECRET spark-class" in start, start
            assert service["healthcheck"]["test"][1:4] == [
                "python", "-m", "spark_jobs.services"], name
        else:
            assert bool(holds) == (name in AIRFLOW_PARTS), (name, holds)
    # Kafka keeps its log on its volume.
    assert services["kafka"]["environment"]["KAFKA_LOG_DIRS"] == "/var/lib/kafka/data"
    # Only the UI is published, on the host's loopback unless configured otherwise.
    published = {name: service["ports"] for name, service in services.items()
                 if "ports" in service}
    assert list(published) == ["airflow-apiserver"]
    assert published["airflow-apiserver"] == ["127.0.0.1:8080:8080/tcp"]


def test_no_secret_is_in_the_stack_it_must_be_given() -> None:
    # Without the secrets the file does not resolve, and says which one is missing.
    refused = compose_config({})
    assert refused.returncode != 0
    assert "set POSTGRES_PASSWORD in docker/.env" in refused.stderr
    example = (PROJECT_DIR / "docker" / "example.env").read_text()
    for name in SECRETS:
        assert f"\n{name}=\n" in example, f"{name} has a value in example.env"
    assert "docker/.env" in (PROJECT_DIR / ".gitignore").read_text().splitlines()
    assert Path(PROJECT_DIR / "docker" / "Dockerfile").is_file()
